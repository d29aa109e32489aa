"""CUDA tensors through pyckpt.dcp (issue 39 items 1-2): ``dcp.save`` stages them
through pyckpt's pinned staging (the CUDA engine's copies, no ``.cpu()``), and
``dcp.load`` fills CUDA targets in place through the bounce buffers of
``CheckpointSource.fill``: same storage, exact values, and no host copy of a
target (no ``.cpu()``/``.to("cpu")`` from pyckpt, no host buffer copied in)."""

from __future__ import annotations

import os
import sys
import warnings

import pytest

torch = pytest.importorskip("torch")
dcp = pytest.importorskip("torch.distributed.checkpoint")

import pyckpt  # noqa: E402
import pyckpt.dcp  # noqa: E402
import pyckpt.dcp.reader as dcp_reader  # noqa: E402
from pyckpt.adapters.torch_device import TorchCudaEngine  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore:torch.distributed is disabled")

DEV = "cuda:0"
PKG = os.path.dirname(pyckpt.__file__) + os.sep


def state(device=DEV):
    g = torch.Generator(device="cpu").manual_seed(11)
    host = {"w": torch.randn(300, 257, generator=g),
            "bf": torch.randn(64, 9, generator=g).bfloat16(),
            "ids": torch.randint(-(2 ** 40), 2 ** 40, (1000,), generator=g),
            "col": torch.randn(20, 12, generator=g).t(),  # non-contiguous
            "scalar": torch.tensor(2.5), "empty": torch.zeros(0, 5)}
    return {k: v.to(device) for k, v in host.items()}


@pytest.fixture
def spies(monkeypatch):
    """Counts pyckpt's own calls of Tensor.cpu / Tensor.to(<cpu>) on CUDA tensors, and
    the CUDA engine's copies (by direction)."""
    seen = {"host_copies": [], "to_host": 0, "to_device": 0}

    def from_pyckpt() -> bool:
        return sys._getframe(2).f_code.co_filename.startswith(PKG)

    real_cpu, real_to = torch.Tensor.cpu, torch.Tensor.to

    def cpu(self, *a, **k):
        if self.is_cuda and from_pyckpt():
            seen["host_copies"].append(("cpu", tuple(self.shape)))
        return real_cpu(self, *a, **k)

    def to(self, *a, **k):
        dev = k.get("device", a[0] if a else None)
        if self.is_cuda and isinstance(dev, (str, torch.device)) and \
                torch.device(dev).type == "cpu" and from_pyckpt():
            seen["host_copies"].append(("to", tuple(self.shape)))
        return real_to(self, *a, **k)

    monkeypatch.setattr(torch.Tensor, "cpu", cpu)
    monkeypatch.setattr(torch.Tensor, "to", to)
    real_h, real_d = TorchCudaEngine.to_host, TorchCudaEngine.to_device
    real_b = TorchCudaEngine.to_device_batch

    def to_host(self, srcs, dsts):
        seen["to_host"] += len(srcs)
        return real_h(self, srcs, dsts)

    def to_device(self, srcs, dsts):
        seen["to_device"] += len(srcs)
        return real_d(self, srcs, dsts)

    def to_device_batch(self, srcs, dsts):  # loads upload a batch at a time
        seen["to_device"] += len(srcs)
        return real_b(self, srcs, dsts)

    monkeypatch.setattr(TorchCudaEngine, "to_host", to_host)
    monkeypatch.setattr(TorchCudaEngine, "to_device", to_device)
    monkeypatch.setattr(TorchCudaEngine, "to_device_batch", to_device_batch)
    yield seen
    pyckpt.device.release_staging_memory()


def test_dcp_save_stages_cuda_tensors(tmp_path, spies):
    src = state()
    want = {k: v.detach().clone() for k, v in src.items()}
    path = str(tmp_path / "ck")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        dcp.save(src, storage_writer=pyckpt.dcp.StorageWriter(path))
    assert spies["host_copies"] == []
    assert spies["to_host"] == len(src)  # every tensor by the engine, into pinned staging
    got = pyckpt.load(path, device=DEV)
    for k, v in want.items():
        assert got[k].dtype == v.dtype and torch.equal(got[k], v), k


def test_dcp_load_fills_cuda_targets_in_place(tmp_path, spies, monkeypatch):
    want = state()
    path = str(tmp_path / "ck")
    dcp.save(want, storage_writer=pyckpt.dcp.StorageWriter(path))
    spies["to_host"] = 0
    into = {k: torch.zeros_like(v) for k, v in want.items()}
    into["col"] = torch.zeros(12, 20, device=DEV)  # contiguous this time
    ptrs = {k: v.data_ptr() for k, v in into.items()}

    def no_host_buffer(target, buf):
        raise AssertionError(f"a host buffer for a target of shape {tuple(target.shape)}")

    monkeypatch.setattr(dcp_reader, "_copier", no_host_buffer)
    dcp.load(into, storage_reader=pyckpt.dcp.StorageReader(path))
    torch.cuda.synchronize()
    assert spies["host_copies"] == [] and spies["to_host"] == 0
    assert spies["to_device"] == len(into)
    for k, v in want.items():
        assert into[k].data_ptr() == ptrs[k] and into[k].is_cuda, k
        assert torch.equal(into[k], v), k


def test_dcp_load_casts_into_another_dtype(tmp_path):
    """A target of another dtype than stored is filled through a host buffer, cast
    by torch (as DCP's own reader does)."""
    path = str(tmp_path / "ck")
    src = {"w": torch.randn(33, 17, device=DEV)}
    dcp.save(src, storage_writer=pyckpt.dcp.StorageWriter(path))
    into = {"w": torch.zeros(33, 17, device=DEV, dtype=torch.float64)}
    dcp.load(into, storage_reader=pyckpt.dcp.StorageReader(path))
    assert torch.equal(into["w"], src["w"].double())


def test_dcp_reader_box_into_cuda_target(tmp_path, spies):
    """A read item asking for a box of a stored tensor (DCP resharding) lands in a
    CUDA target through the bounce buffers."""
    from torch.distributed.checkpoint.metadata import MetadataIndex
    from torch.distributed.checkpoint.planner import LoadItemType, LoadPlan, ReadItem

    path = str(tmp_path / "ck")
    full = torch.arange(64 * 33, dtype=torch.float32).reshape(64, 33)
    pyckpt.save({"w": full}, path)
    target = torch.zeros(5, 7, device=DEV)

    class Planner:
        def resolve_tensor(self, ri):
            return target

        def commit_tensor(self, ri, t):
            pass

    ri = ReadItem(type=LoadItemType.TENSOR, dest_index=MetadataIndex("w"),
                  dest_offsets=torch.Size([0, 0]),
                  storage_index=MetadataIndex("w", torch.Size([0, 0])),
                  storage_offsets=torch.Size([10, 20]), lengths=torch.Size([5, 7]))
    reader = pyckpt.dcp.StorageReader(path)
    reader.read_metadata()
    reader.read_data(LoadPlan([ri]), Planner()).wait()
    torch.cuda.synchronize()
    assert spies["to_device"] == 1 and spies["host_copies"] == []
    assert torch.equal(target.cpu(), full[10:15, 20:27])
