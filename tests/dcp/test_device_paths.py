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


class _Gates:
    """Holds the device-to-host copies of ``engine`` (each ticket's wait blocks until
    its key is released): a copy that takes as long as the test wants."""

    def __init__(self, engine, monkeypatch):
        self.engine, self.events = engine, {}
        real = engine.to_host

        def to_host(srcs, dsts):
            tickets = real(srcs, dsts)
            return [self._held(engine.key_of(s), t) for s, t in zip(srcs, tickets)]
        monkeypatch.setattr(engine, "to_host", to_host)

    def event(self, key):
        return self.events.setdefault(key, threading.Event())

    def _held(self, key, ticket):
        gate = self.event(key)

        class Held:
            def done(self):
                return gate.is_set() and ticket.done()

            def wait(self):
                if not gate.wait(60):
                    raise TimeoutError(f"the copy of {key!r} was never released")
                ticket.wait()
        return Held()

    def release(self, *keys):
        for k in keys:
            self.event(k).set()


def _in_files(path, data):
    for name in os.listdir(path):
        if name.startswith("data-"):
            with open(os.path.join(path, name), "rb") as f:
                if data in f.read():
                    return True
    return False


def test_writer_writes_while_device_values_are_copied(tmp_path, engine, monkeypatch):
    """Into local files the writer hands each device value to the writers as soon as
    its copy landed (``StagedWrite``, as ``pyckpt.save``): the first value the
    writers need is in its file while the copy of the last one has not landed (3 MiB
    values: the writers write pieces of up to 8 MiB)."""
    g = torch.Generator().manual_seed(11)
    src = {f"t{i}": torch.randn(3 << 18, generator=g) for i in range(4)}
    want = {k: v.clone() for k, v in src.items()}
    hook = as_device(engine, src)
    real = dcp_writer.to_numpy
    monkeypatch.setattr(dcp_writer, "to_numpy", lambda t: hook(t) or real(t))
    gates = _Gates(engine, monkeypatch)
    started = {}
    real_start = dcp_writer.planned_save.writer.write_executor.start_staged

    def start_staged(store, paths, sizes, keys, *args, **kwargs):
        job = real_start(store, paths, sizes, keys, *args, **kwargs)
        started.update(job=job, keys=[k.split("#")[0] for k in keys])
        return job
    monkeypatch.setattr(dcp_writer.planned_save.writer.write_executor, "start_staged",
                        start_staged)
    path = str(tmp_path / "ck")
    seen = {}

    def controller():
        try:
            for _ in range(600):
                if "job" in started:
                    break
                threading.Event().wait(0.05)
            else:
                return  # never staged: the copies are released below, the test fails
            keys = started["keys"]
            order = [keys[i] for i in started["job"].order()]
            first, last = order[0], order[-1]
            gates.release(*[k for k in order if k != last])
            data = want[first].numpy().tobytes()
            for _ in range(600):
                if _in_files(path, data):
                    seen["first written before the last copy landed"] = first
                    break
                threading.Event().wait(0.05)
        finally:
            gates.release(*src)

    t = threading.Thread(target=controller)
    t.start()
    try:
        dcp.save(src, storage_writer=pyckpt.dcp.StorageWriter(path))
    finally:
        t.join()
    assert "job" in started, "the device values were not written through a StagedWrite"
    assert seen, "nothing was written before the last device copy landed"
    got = pyckpt.load(path)
    for k, v in want.items():
        assert torch.equal(got[k], v), k


def _written_arrays(monkeypatch):
    """The arrays the writers are handed (host writes and staged writes)."""
    got = []
    ex = dcp_writer.planned_save.writer.write_executor
    real_write, real_start = ex.write_shards, ex.start_staged

    def write_shards(store, path, paths, sizes, keys, arrays, *args, **kwargs):
        got.extend(arrays)
        return real_write(store, path, paths, sizes, keys, arrays, *args, **kwargs)

    def start_staged(store, paths, sizes, keys, staging, *args, **kwargs):
        got.extend(staging)
        return real_start(store, paths, sizes, keys, staging, *args, **kwargs)
    monkeypatch.setattr(ex, "write_shards", write_shards)
    monkeypatch.setattr(ex, "start_staged", start_staged)
    return got


@pytest.mark.parametrize("with_device", [False, True], ids=["cpu", "mixed"])
def test_writer_writes_cpu_tensors_from_their_memory(tmp_path, engine, monkeypatch,
                                                     with_device):
    """CPU tensors are written from their own memory, not copied first; also beside
    device values (then through the StagedWrite)."""
    src = state()
    want = {k: v.clone() for k, v in src.items()}
    device = {"w": src["w"]} if with_device else {}
    if device:
        hook = as_device(engine, device)
        real = dcp_writer.to_numpy
        monkeypatch.setattr(dcp_writer, "to_numpy", lambda t: hook(t) or real(t))
    arrays = _written_arrays(monkeypatch)
    path = str(tmp_path / "ck")
    dcp.save(src, storage_writer=pyckpt.dcp.StorageWriter(path))
    for k, v in src.items():
        if not v.numel() or k in device:
            continue
        mem = to_numpy(v)
        assert any(np.shares_memory(a, mem) for a in arrays), k
    if device:
        assert not any(np.shares_memory(a, to_numpy(src["w"])) for a in arrays)
    got = pyckpt.load(path)
    for k, v in want.items():
        assert torch.equal(got[k], v), k


def test_writer_stages_device_values_first_into_object_stores(engine, monkeypatch):
    """Where the C++ writers cannot write the files (an fsspec store), every device
    value is staged, then written; the values are exact."""
    src = state()
    want = {k: v.clone() for k, v in src.items()}
    hook = as_device(engine, src)
    real = dcp_writer.to_numpy
    monkeypatch.setattr(dcp_writer, "to_numpy", lambda t: hook(t) or real(t))
    path = f"memory://dcp-device/{os.getpid()}/ck"
    dcp.save(src, storage_writer=pyckpt.dcp.StorageWriter(path))
    assert {k for what, d, k in engine.log if what == "land" and d == "d2h"} == {
        "w", "b", "ids", "bf"}
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
