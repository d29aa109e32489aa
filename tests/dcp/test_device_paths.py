"""pyckpt.dcp's device paths without a GPU (issue 39 items 1-2): CUDA tensors are
DeviceArrays to the rest of pyckpt; here the torch hooks the door uses are made to
return DeviceArrays of a LateCopyEngine (copies land late and shuffled), so the
tests see that the writer stages them through pinned staging (not a host copy of
its own) and that the reader fills them through ``CheckpointSource.fill``'s bounce
buffers, boxes of a larger stored tensor included. Also: the writer takes its
save turn (pyckpt/ordering.py)."""

import os
import threading

import numpy as np
import pytest

torch = pytest.importorskip("torch")
dcp = pytest.importorskip("torch.distributed.checkpoint")

import pyckpt  # noqa: E402
import pyckpt.dcp  # noqa: E402
import pyckpt.dcp.reader as dcp_reader  # noqa: E402
import pyckpt.dcp.writer as dcp_writer  # noqa: E402
from pyckpt import ordering  # noqa: E402
from pyckpt.adapters.torch_support import to_numpy  # noqa: E402
from pyckpt.storage import resolve  # noqa: E402
from torch.distributed.checkpoint.api import CheckpointException  # noqa: E402
from torch.distributed.checkpoint.metadata import MetadataIndex  # noqa: E402
from torch.distributed.checkpoint.planner import LoadItemType, LoadPlan, ReadItem  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore:torch.distributed is disabled")


def state(seed=3):
    g = torch.Generator().manual_seed(seed)
    return {"w": torch.randn(64, 33, generator=g), "b": torch.randn(7, generator=g),
            "ids": torch.arange(300, dtype=torch.int64), "empty": torch.zeros(0, 3),
            "bf": torch.randn(5, 4, generator=g).bfloat16()}


@pytest.fixture
def engine(late_engine):
    return late_engine


def as_device(engine, tensors):
    """A hook that returns a DeviceArray of ``engine`` over the memory of each tensor of
    ``tensors`` (what ``to_numpy`` / ``writable`` return for a CUDA tensor)."""
    ptrs = {t.data_ptr(): k for k, t in tensors.items() if t.numel()}

    def hook(t):
        key = ptrs.get(t.data_ptr()) if t.numel() else None
        if key is None:
            return None
        return engine.array(to_numpy(t), key)  # the CPU tensor's memory, its numpy dtype
    return hook


def test_writer_stages_device_values_through_pinned_staging(tmp_path, engine, monkeypatch):
    src = state()
    want = {k: v.clone() for k, v in src.items()}
    hook = as_device(engine, src)
    real = dcp_writer.to_numpy
    monkeypatch.setattr(dcp_writer, "to_numpy", lambda t: hook(t) or real(t))
    path = str(tmp_path / "ck")
    dcp.save(src, storage_writer=pyckpt.dcp.StorageWriter(path))
    issued = {k for what, d, k in engine.log if what == "issue" and d == "d2h"}
    assert issued == {"w", "b", "ids", "bf"}  # every non-empty value, by the engine
    assert engine.host_allocs >= 1  # into the engine's (pinned) staging memory
    got = pyckpt.load(path)
    for k, v in want.items():
        assert torch.equal(got[k], v), k


def test_writer_device_copy_failure_commits_nothing(tmp_path, engine, monkeypatch):
    src = state()
    hook = as_device(engine, src)
    real = dcp_writer.to_numpy
    monkeypatch.setattr(dcp_writer, "to_numpy", lambda t: hook(t) or real(t))
    engine.fail_on("w")
    path = str(tmp_path / "ck")
    with pytest.raises(CheckpointException) as failed:
        dcp.save(src, storage_writer=pyckpt.dcp.StorageWriter(path))
    assert "injected copy failure of 'w'" in str(getattr(failed.value, "failures", failed.value))
    assert not os.path.exists(os.path.join(path, "pyckpt.index"))


def test_reader_fills_device_targets_through_bounce_buffers(tmp_path, engine, monkeypatch):
    path = str(tmp_path / "ck")
    want = state()
    dcp.save(want, storage_writer=pyckpt.dcp.StorageWriter(path))
    into = {k: torch.zeros_like(v) for k, v in want.items()}
    ptrs = {k: v.data_ptr() for k, v in into.items()}
    hook = as_device(engine, into)
    real = dcp_reader.writable
    monkeypatch.setattr(dcp_reader, "writable", lambda t: hook(t) or real(t))
    copies = []
    monkeypatch.setattr(dcp_reader, "_copier", lambda t, buf: copies.append(t) or (lambda: None),
                        raising=False)
    dcp.load(into, storage_reader=pyckpt.dcp.StorageReader(path))
    landed = {k for what, d, k in engine.log if what == "land" and d == "h2d"}
    assert landed == {"w", "b", "ids", "bf"}
    assert copies == []  # no host buffer copied into a target
    for k, v in want.items():
        assert into[k].data_ptr() == ptrs[k] and torch.equal(into[k], v), k


class _Planner:
    """The two LoadPlanner calls read_data makes for tensors."""

    def __init__(self, targets):
        self.targets, self.committed = targets, []

    def resolve_tensor(self, ri):
        return self.targets[ri.storage_index.fqn]

    def commit_tensor(self, ri, t):
        self.committed.append(ri.storage_index.fqn)


def _box_item(fqn, offsets, lengths):
    return ReadItem(type=LoadItemType.TENSOR, dest_index=MetadataIndex(fqn),
                    dest_offsets=torch.Size([0] * len(offsets)),
                    storage_index=MetadataIndex(fqn, torch.Size([0] * len(offsets))),
                    storage_offsets=torch.Size(offsets), lengths=torch.Size(lengths))


@pytest.mark.parametrize("device", [False, True], ids=["host", "device"])
def test_reader_reads_boxes_of_a_stored_tensor(tmp_path, engine, monkeypatch, device):
    """A read item asking for a box of a stored tensor (DCP resharding) lands in its
    target in place, also when the target is in device memory."""
    path = str(tmp_path / "ck")
    full = torch.arange(64 * 33, dtype=torch.float32).reshape(64, 33)
    pyckpt.save({"w": full, "ids": torch.arange(10)}, path)
    targets = {"w": torch.zeros(5, 7), "ids": torch.zeros(4, dtype=torch.int64)}
    if device:
        hook = as_device(engine, targets)
        real = dcp_reader.writable
        monkeypatch.setattr(dcp_reader, "writable", lambda t: hook(t) or real(t))
    reader = pyckpt.dcp.StorageReader(path)
    reader.read_metadata()
    planner = _Planner(targets)
    reader.read_data(LoadPlan([_box_item("w", (10, 20), (5, 7)),
                               _box_item("ids", (3,), (4,))]), planner).wait()
    assert torch.equal(targets["w"], full[10:15, 20:27])
    assert torch.equal(targets["ids"], torch.arange(3, 7))
    assert planner.committed == ["w", "ids"]
    if device:
        assert {k for what, d, k in engine.log if what == "land" and d == "h2d"} == {"w", "ids"}


def test_source_fill_boxes_of_device_targets(tmp_path, engine):
    """The seam under the reader: ``CheckpointSource.fill(..., boxes=)``."""
    path = str(tmp_path / "ck")
    full = np.arange(40 * 6, dtype=np.float32).reshape(40, 6)
    pyckpt.save({"a": full}, path)
    from pyckpt.sources import open_source
    src = open_source(path)
    dev = np.zeros((3, 2), np.float32)
    host = np.zeros((40, 6), np.float32)
    src.fill([0, 0], [engine.array(dev, "dev"), host], boxes=[(7, 4), None])
    np.testing.assert_array_equal(dev, full[7:10, 4:6])
    np.testing.assert_array_equal(host, full)


def test_writer_takes_its_save_turn(tmp_path):
    """A dcp.save waits for an earlier save's turn at the same place, as every
    door does (ordering.py): it neither writes nor commits before that one ended."""
    path = str(tmp_path / "ck")
    store, p = resolve(path)
    earlier = ordering.take(ordering.place(store, p, 0), blocking=False)
    done = []
    t = threading.Thread(target=lambda: done.append(dcp.save(
        state(), storage_writer=pyckpt.dcp.StorageWriter(path))))
    t.start()
    try:
        t.join(1.0)
        assert t.is_alive() and not os.path.exists(os.path.join(path, "pyckpt.index"))
    finally:
        earlier.end()
    t.join(60)
    assert done and os.path.exists(os.path.join(path, "pyckpt.index"))
