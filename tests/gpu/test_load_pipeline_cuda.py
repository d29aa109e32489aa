"""The load pipeline on CUDA (issue 40 item 3): loads into CUDA tensors go through
several pinned bounce buffers, read by reader threads while the calling thread
issues each batch's copies with one event per batch (``to_device_batch``); values
land bit-exactly in the targets' storage, and later work on the caller's stream,
default or not, sees them."""

from __future__ import annotations

import pytest

import pyckpt
from pyckpt.adapters.torch_device import TorchCudaEngine
from pyckpt.device import loading

torch = pytest.importorskip("torch")

DEV = "cuda:0"


@pytest.fixture
def small_batches(monkeypatch):
    """Batches of 64 KiB, 3 buffers, 2 readers: many batches for a small state."""
    monkeypatch.setenv("PYCKPT_LOAD_BATCH_MB", str(64 / 1024))
    monkeypatch.setenv("PYCKPT_LOAD_BUFFERS", "3")
    monkeypatch.setenv("PYCKPT_LOAD_READERS", "2")
    yield
    pyckpt.device.release_staging_memory()


@pytest.fixture
def uploads(monkeypatch):
    """Counts the engine's upload calls: per batch, and per copy."""
    seen = {"batches": [], "per_copy": 0}
    real_b, real_d = TorchCudaEngine.to_device_batch, TorchCudaEngine.to_device

    def to_device_batch(self, srcs, dsts):
        seen["batches"].append(len(srcs))
        return real_b(self, srcs, dsts)

    def to_device(self, srcs, dsts):
        seen["per_copy"] += len(srcs)
        return real_d(self, srcs, dsts)

    monkeypatch.setattr(TorchCudaEngine, "to_device_batch", to_device_batch)
    monkeypatch.setattr(TorchCudaEngine, "to_device", to_device)
    return seen


def state(seed: int = 0) -> dict:
    g = torch.Generator(device="cuda")
    g.manual_seed(seed)
    s = {f"w{i:02d}": torch.randn(3000 + 97 * i, generator=g, device=DEV) for i in range(40)}
    s["bf16"] = torch.randn(500, 33, generator=g, device=DEV).to(torch.bfloat16)
    s["half"] = torch.randn(7, 9, generator=g, device=DEV).half()
    s["ids"] = torch.randint(-(2 ** 40), 2 ** 40, (999,), generator=g, device=DEV)
    s["big"] = torch.randn(100_000, generator=g, device=DEV)  # 400 KB: a batch of its own
    s["scalar"] = torch.tensor(3.5, device=DEV)
    s["empty"] = torch.zeros(0, 4, device=DEV)
    return s


def test_many_batches_land_bit_exactly_in_place(tmp_path, small_batches, uploads):
    src = state(1)
    pyckpt.save(src, tmp_path / "c")
    into = {k: torch.full_like(v, 0) for k, v in src.items()}
    ptrs = {k: v.data_ptr() for k, v in into.items()}
    pyckpt.load(tmp_path / "c", into=into)
    torch.cuda.synchronize()
    for k, v in src.items():
        assert into[k].data_ptr() == ptrs[k], k
        assert torch.equal(into[k], v), k
    assert len(uploads["batches"]) > 10  # one upload call per batch...
    assert sum(uploads["batches"]) == len(src)
    assert uploads["per_copy"] == 0      # ...and none per copy


def test_noncontiguous_target_inside_a_batch(tmp_path, small_batches):
    src = {"a": torch.randn(40, 30, device=DEV), "t": torch.randn(20, 12, device=DEV),
           "b": torch.randn(50, device=DEV)}
    pyckpt.save(src, tmp_path / "c")
    base = torch.zeros(12, 20, device=DEV)
    into = {"a": torch.zeros(40, 30, device=DEV), "t": base.t(), "b": torch.zeros(50, device=DEV)}
    pyckpt.load(tmp_path / "c", into=into)
    torch.cuda.synchronize()
    for k, v in src.items():
        assert torch.equal(into[k], v), k
    assert torch.equal(base, src["t"].t())


def test_work_queued_on_a_side_stream_sees_the_loaded_values(tmp_path, small_batches):
    src = state(2)
    pyckpt.save(src, tmp_path / "c")
    into = {k: torch.zeros_like(v) for k, v in src.items()}
    torch.cuda.synchronize()  # the zeros are written before the side stream's work
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):
        pyckpt.load(tmp_path / "c", into=into)
        sums = [into[k].float().sum() for k in sorted(into)]  # queued on `side` right away
    side.synchronize()
    for k, s in zip(sorted(into), sums):
        assert torch.equal(s, src[k].float().sum()), k


def test_bounce_buffers_are_pinned_bounded_and_released(tmp_path, small_batches):
    src = state(3)
    pyckpt.save(src, tmp_path / "c")
    pyckpt.device.release_staging_memory()
    into = {k: torch.zeros_like(v) for k, v in src.items()}
    pyckpt.load(tmp_path / "c", into=into)
    kept = loading.bounce_bytes()
    largest = max(v.numel() * v.element_size() for v in src.values())
    assert 0 < kept <= 3 * (64 << 10) + 2 * (largest + 256)  # buffers x batch + 2 x largest
    assert pyckpt.device.pinned_memory_kept() >= kept
    pyckpt.device.release_staging_memory()
    assert loading.bounce_bytes() == 0


def test_a_corrupt_tensor_never_reaches_the_gpu(tmp_path, small_batches):
    src = {f"p{i:02d}": torch.full((4096,), float(i + 1), device=DEV) for i in range(12)}
    pyckpt.save(src, tmp_path / "c")
    from pyckpt.sources import open_source
    s = open_source(tmp_path / "c")
    p = s.block_reads([s.index["p07"]])
    with open(s.file_path(int(p.file[0])), "r+b") as f:
        f.seek(int(p.offset[0]) + 100)
        b = f.read(1)
        f.seek(int(p.offset[0]) + 100)
        f.write(bytes([b[0] ^ 0x40]))
    into = {k: torch.zeros_like(v) for k, v in src.items()}
    with pytest.raises(pyckpt.CorruptCheckpointError, match="'p07'"):
        pyckpt.load(tmp_path / "c", into=into)
    torch.cuda.synchronize()
    assert not into["p07"].any()
    assert torch.equal(into["p00"], src["p00"])
