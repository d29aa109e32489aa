"""CUDA tensors through pyckpt.save / pyckpt.load: every dtype and layout, filled in
place (``into=``: same storage, same device) or placed on a device (``device=``)."""

from __future__ import annotations

import pytest

import pyckpt

torch = pytest.importorskip("torch")

DEV = "cuda:0"

# case id -> (dtype name, shape, non-contiguous source?)
CASES = {
    "fp32": ("float32", (33, 17), False),
    "bf16": ("bfloat16", (64, 9), False),
    "fp16": ("float16", (5, 7, 3), False),
    "fp8_e4m3fn": ("float8_e4m3fn", (40, 8), False),
    "fp8_e5m2": ("float8_e5m2", (3, 129), False),
    "int64": ("int64", (1000,), False),
    "0d": ("float32", (), False),
    "0d_int64": ("int64", (), False),
    "empty": ("float32", (0, 5), False),
    "empty_bf16": ("bfloat16", (4, 0), False),
    "noncontig_T": ("float32", (12, 20), True),
    "noncontig_bf16": ("bfloat16", (6, 10), True),
}
ML_DTYPES = {"bfloat16", "float8_e4m3fn", "float8_e5m2"}
_BITS = {1: "uint8", 2: "int16", 4: "int32", 8: "int64"}


def dtype_of(name: str):
    if not hasattr(torch, name):
        pytest.skip(f"torch {torch.__version__} has no torch.{name}")
    if name in ML_DTYPES:
        pytest.importorskip("ml_dtypes")
    return getattr(torch, name)


def make(name: str, shape: tuple, seed: int, device: str = DEV, noncontig: bool = False):
    """A deterministic tensor; with ``noncontig`` a transposed / strided view of a larger one."""
    dtype = dtype_of(name)
    g = torch.Generator(device=torch.device(device).type)
    g.manual_seed(seed)
    full = tuple(reversed(shape)) if noncontig and len(shape) == 2 else shape
    if noncontig and len(shape) != 2:
        raise ValueError("non-contiguous cases are 2-D")
    if dtype.is_floating_point:
        base = torch.randn(full, generator=g, device=device, dtype=torch.float32).to(dtype)
    else:
        base = torch.randint(-(2 ** 40), 2 ** 40, full, generator=g, device=device, dtype=dtype)
    if noncontig:
        t = base.t()
        assert not t.is_contiguous()
        return t
    return base


def bits(t):
    """The tensor's bit patterns as integers (float8 has no == on every device; NaN != NaN)."""
    return t.contiguous().view(getattr(torch, _BITS[t.element_size()]))


def assert_same(got, want, device: str | None = None) -> None:
    assert isinstance(got, torch.Tensor), type(got)
    assert got.dtype == want.dtype, (got.dtype, want.dtype)
    assert tuple(got.shape) == tuple(want.shape), (got.shape, want.shape)
    if device is not None:
        assert got.device == torch.device(device), got.device
    assert torch.equal(bits(got).cpu(), bits(want).cpu())


@pytest.mark.parametrize("case", list(CASES))
def test_save_and_load_into_cuda_tensors_in_place(tmp_path, case):
    name, shape, noncontig = CASES[case]
    src = {"x": make(name, shape, 1, noncontig=noncontig),
           "nested": {"y": make(name, shape, 2, noncontig=noncontig)}}
    path = str(tmp_path / "ckpt")
    pyckpt.save(src, path)

    into = {"x": torch.zeros_like(src["x"]), "nested": {"y": torch.zeros_like(src["nested"]["y"])}}
    before = {k: (t.data_ptr(), t.device, t.stride())
              for k, t in (("x", into["x"]), ("y", into["nested"]["y"]))}
    out = pyckpt.load(path, into=into)
    torch.cuda.synchronize()

    assert out is into
    for k, t, want in (("x", into["x"], src["x"]), ("y", into["nested"]["y"], src["nested"]["y"])):
        assert (t.data_ptr(), t.device, t.stride()) == before[k], f"{k} was not filled in place"
        assert_same(t, want, DEV)


@pytest.mark.parametrize("case", list(CASES))
def test_load_with_device_returns_cuda_tensors(tmp_path, case):
    name, shape, noncontig = CASES[case]
    src = {"x": make(name, shape, 3, noncontig=noncontig), "list": [make(name, shape, 4)]}
    path = str(tmp_path / "ckpt")
    pyckpt.save(src, path)

    out = pyckpt.load(path, device=DEV)
    torch.cuda.synchronize()
    assert set(out) == {"x", "list"}
    assert isinstance(out["list"], list) and len(out["list"]) == 1
    assert_same(out["x"], src["x"], DEV)
    assert_same(out["list"][0], src["list"][0], DEV)


def test_load_into_noncontiguous_cuda_target(tmp_path):
    src = {"w": make("float32", (8, 24), 5)}
    path = str(tmp_path / "ckpt")
    pyckpt.save(src, path)
    base = torch.zeros(24, 8, device=DEV)
    target = base.t()  # (8, 24), not contiguous: the view must be filled, not replaced
    ptr, stride = target.data_ptr(), target.stride()
    pyckpt.load(path, into={"w": target})
    torch.cuda.synchronize()
    assert (target.data_ptr(), target.stride()) == (ptr, stride)
    assert torch.equal(target, src["w"])
    assert torch.equal(base, src["w"].t())  # the storage under the view holds the values


def test_in_place_fill_of_a_mixed_state_keeps_every_storage(tmp_path):
    """A state of many CUDA tensors of several dtypes (one checkpoint): every target keeps
    its address, device, dtype and strides, and holds the saved values."""
    names = ["float32", "bfloat16", "float16", "int64", "float32"]
    src = {f"t{i}": make(n, (17 * (i + 1), 3 + i), 10 + i) for i, n in enumerate(names)}
    src["scalar"] = torch.tensor(7.25, device=DEV)
    path = str(tmp_path / "ckpt")
    pyckpt.save(src, path)
    into = {k: torch.full_like(t, 0) for k, t in src.items()}
    ids = {k: (t.data_ptr(), t.device, t.dtype, t.stride()) for k, t in into.items()}
    pyckpt.load(path, into=into)
    torch.cuda.synchronize()
    for k, t in into.items():
        assert (t.data_ptr(), t.device, t.dtype, t.stride()) == ids[k], k
        assert_same(t, src[k], DEV)


def test_later_kernels_see_loaded_values(tmp_path):
    """Work queued on the current stream after load(into=) returns reads the loaded values
    (no explicit synchronize by the caller)."""
    src = {"w": make("float32", (1 << 20,), 20)}
    path = str(tmp_path / "ckpt")
    pyckpt.save(src, path)
    target = torch.zeros_like(src["w"])
    pyckpt.load(path, into={"w": target})
    doubled = target * 2  # queued right away on the current stream
    assert torch.equal(doubled, src["w"] * 2)


def test_device_load_of_a_host_saved_checkpoint(tmp_path):
    """A checkpoint saved from host values (numpy, CPU tensors) loads onto the GPU."""
    np = pytest.importorskip("numpy")
    host = {"a": np.arange(12, dtype=np.float32).reshape(3, 4),
            "b": torch.arange(5, dtype=torch.int64), "c": np.full((), 2.5)}
    path = str(tmp_path / "ckpt")
    pyckpt.save(host, path)
    out = pyckpt.load(path, device=DEV)
    torch.cuda.synchronize()
    assert out["a"].device == torch.device(DEV) and out["a"].dtype == torch.float32
    assert torch.equal(out["a"].cpu(), torch.from_numpy(host["a"]))
    assert out["b"].device == torch.device(DEV) and torch.equal(out["b"].cpu(), host["b"])
    assert out["c"].device == torch.device(DEV) and float(out["c"]) == 2.5


def test_device_load_with_select(tmp_path):
    src = {"enc": {"w": make("float32", (4, 4), 30), "b": make("float32", (4,), 31)},
           "dec": {"w": make("float16", (2, 8), 32)}}
    path = str(tmp_path / "ckpt")
    pyckpt.save(src, path)
    out = pyckpt.load(path, device=DEV, select=["enc/*"])
    assert set(out) == {"enc"} and set(out["enc"]) == {"w", "b"}
    assert_same(out["enc"]["w"], src["enc"]["w"], DEV)
    assert_same(out["enc"]["b"], src["enc"]["b"], DEV)


def test_second_device(tmp_path):
    """Targets and device= on cuda:1 stay on cuda:1 (skipped with a single GPU)."""
    if torch.cuda.device_count() < 2:
        pytest.skip("needs 2 CUDA devices")
    src = {"w": make("float32", (64, 64), 40), "h": make("bfloat16", (3, 5), 41)}
    path = str(tmp_path / "ckpt")
    pyckpt.save(src, path)
    into = {k: torch.zeros_like(t, device="cuda:1") for k, t in src.items()}
    ptrs = {k: t.data_ptr() for k, t in into.items()}
    pyckpt.load(path, into=into)
    torch.cuda.synchronize("cuda:1")
    for k, t in into.items():
        assert t.data_ptr() == ptrs[k]
        assert_same(t, src[k], "cuda:1")
    out = pyckpt.load(path, device="cuda:1")
    for k, t in out.items():
        assert_same(t, src[k], "cuda:1")
