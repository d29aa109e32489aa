"""copy_state's batched path: two trees of one structure whose leaves are torch
tensors are copied in batches, without the per-value path (~20-40 us of Python per
tensor): pairs of one CUDA device with one ``_foreach_copy_`` per device, CPU pairs
under 1 MiB with one ``_foreach_copy_``, larger CPU pairs by the C++ core. Anything
that differs falls back to the per-value path, whose checks report it. (CUDA pairs:
tests/gpu/test_device_objects.py.)"""

import pytest

from pyckpt.testing.requirements import require

torch = require("torch")

import pyckpt  # noqa: E402
from pyckpt.adapters import torch_support  # noqa: E402
from pyckpt.graph import snapshot as snapshot_mod  # noqa: E402
from pyckpt.testing.spies import count_calls  # noqa: E402
from pyckpt.tree import paired_leaves  # noqa: E402


class _Paths:
    """How often copy_state took each way during a test."""

    def __init__(self, monkeypatch):
        self.foreach = count_calls(monkeypatch, torch, "_foreach_copy_")
        self.core = count_calls(monkeypatch, torch_support, "copy_values")
        self.per_value = count_calls(monkeypatch, snapshot_mod, "_sources")

    def taken(self):
        return {"foreach": len(self.foreach), "core": len(self.core),
                "per_value": len(self.per_value)}


@pytest.fixture
def paths(monkeypatch):
    return _Paths(monkeypatch)


def _tree(seed, t=None):
    g = torch.Generator().manual_seed(seed)
    return {"layers": [{"w": torch.randn(4, 3, generator=g), "b": torch.randn(3, generator=g)}
                       for _ in range(3)],
            "step": torch.tensor(seed),
            "half": torch.randn(5, generator=g).to(torch.bfloat16),
            "pair": (torch.randn(2, generator=g), torch.zeros((), dtype=torch.int64) + seed),
            "model.0.weight": torch.randn(2, 2, generator=g)}


def _flat(tree):
    return paired_leaves(tree, tree)[0]


def test_two_trees_of_tensors_are_copied_in_one_batch_in_place(paths):
    src, dst = _tree(1), _tree(2)
    ptrs = [t.data_ptr() for t in _flat(dst)]
    assert pyckpt.copy_state(src, dst) is dst
    assert [t.data_ptr() for t in _flat(dst)] == ptrs
    assert all(torch.equal(a, b) for a, b in zip(_flat(src), _flat(dst)))
    assert paths.taken() == {"foreach": 1, "core": 0, "per_value": 0}


def test_parameters_and_non_contiguous_destinations_are_filled(paths):
    lin_a, lin_b = torch.nn.Linear(3, 4), torch.nn.Linear(3, 4)
    t_dst = torch.zeros(3, 4).t()  # a transposed view: filled where it lies
    src = {"m": dict(lin_a.named_parameters()), "t": torch.arange(12.).reshape(4, 3)}
    dst = {"m": dict(lin_b.named_parameters()), "t": t_dst}
    pyckpt.copy_state(src, dst)  # parameters require grad: copied outside autograd
    assert torch.equal(lin_b.weight, lin_a.weight) and torch.equal(lin_b.bias, lin_a.bias)
    assert torch.equal(t_dst, src["t"])
    assert paths.taken()["per_value"] == 0


@pytest.mark.parametrize("change", ["shape", "dtype", "missing", "extra", "length", "scalar",
                                    "int_key", "slash_key", "list_vs_tuple"])
def test_anything_that_differs_goes_the_per_value_way_and_is_reported(paths, change):
    src, dst = _tree(1), _tree(2)
    if change == "shape":
        dst["layers"][1]["w"] = torch.zeros(3, 4)
    elif change == "dtype":
        dst["step"] = torch.tensor(2.0)
    elif change == "missing":
        del dst["half"]
    elif change == "extra":
        dst["more"] = torch.zeros(1)
    elif change == "length":
        dst["layers"].append({"w": torch.zeros(4, 3), "b": torch.zeros(3)})
    elif change == "scalar":
        src["lr"], dst["lr"] = 0.5, 0.1
    elif change == "int_key":
        src["by_id"], dst["by_id"] = {7: torch.ones(1)}, {7: torch.zeros(1)}
    elif change == "slash_key":
        src["a/b"], dst["a/b"] = torch.ones(1), torch.zeros(1)
    elif change == "list_vs_tuple":
        dst["pair"] = list(dst["pair"])
    if change in ("shape", "dtype", "missing", "extra", "length"):
        with pytest.raises(ValueError, match="copy_state: source and destination differ"):
            pyckpt.copy_state(src, dst)
    else:  # the per-value path copies what the batched one does not take
        pyckpt.copy_state(src, dst)
        assert torch.equal(dst["layers"][0]["w"], src["layers"][0]["w"])
        if change == "scalar":
            assert dst["lr"] == 0.5
        if change == "int_key":
            assert torch.equal(dst["by_id"][7], torch.ones(1))
    assert paths.taken()["per_value"] == 1


def test_without_strict_a_mismatch_is_skipped_by_the_per_value_way(paths):
    src, dst = _tree(1), _tree(2)
    dst["layers"][1]["w"] = torch.zeros(3, 4)
    pyckpt.copy_state(src, dst, strict=False)
    assert torch.equal(dst["layers"][0]["w"], src["layers"][0]["w"])
    assert torch.equal(dst["layers"][1]["w"], torch.zeros(3, 4))
    assert paths.taken()["per_value"] == 1


def test_large_cpu_tensors_go_through_the_core_small_ones_in_one_batch(paths):
    big = 300_000  # 1.2 MB of float32: above SMALL_HOST_BYTES
    src = {"big": torch.randn(big), "bf16": torch.randn(big).to(torch.bfloat16),
           "small": [torch.randn(10) for _ in range(5)]}
    dst = {"big": torch.zeros(big), "bf16": torch.zeros(big, dtype=torch.bfloat16),
           "small": [torch.zeros(10) for _ in range(5)]}
    pyckpt.copy_state(src, dst)
    assert paths.taken() == {"foreach": 1, "core": 1, "per_value": 0}
    assert all(torch.equal(a, b) for a, b in zip(_flat(src), _flat(dst)))


def test_explicit_threads_take_the_per_value_way(paths):
    src, dst = _tree(1), _tree(2)
    pyckpt.copy_state(src, dst, threads=2)
    assert paths.taken()["per_value"] == 1
    assert all(torch.equal(a, b) for a, b in zip(_flat(src), _flat(dst)))


def test_tensors_of_other_layouts_or_devices_take_the_per_value_way(paths):
    src = {"m": torch.zeros(2, 2, device="meta")}
    dst = {"m": torch.zeros(2, 2, device="meta")}
    assert not torch_support._copy(paired_leaves(src, dst)[0], paired_leaves(src, dst)[1])
    c = torch.tensor([1 + 2j, 3 - 1j])
    src, dst = {"c": c.conj()}, {"c": torch.zeros(2, dtype=torch.complex64)}
    pyckpt.copy_state(src, dst)  # a conjugate view: resolved by the per-value way
    assert torch.equal(dst["c"], c.conj().resolve_conj())
    assert paths.taken()["per_value"] == 1
    with torch.inference_mode():
        frozen = torch.zeros(3)  # torch refuses in-place writes outside inference mode
    pyckpt.copy_state({"f": torch.ones(3)}, {"f": frozen})  # the per-value way fills it
    assert torch.equal(frozen, torch.ones(3))
    assert paths.taken()["per_value"] == 2


def test_paired_leaves_walks_both_trees_in_order():
    a = {"x": [1, (2, 3)], "y": {"z": 4}}
    b = {"y": {"z": 40}, "x": [10, (20, 30)]}  # key order does not matter
    assert paired_leaves(a, b) == ([1, 2, 3, 4], [10, 20, 30, 40])
    assert paired_leaves(a, {"x": [1, (2, 3)], "y": {"z": [4]}}) is None  # leaf vs list
    assert paired_leaves(a, {"x": [1, [2, 3]], "y": {"z": 4}}) is None   # tuple vs list
    assert paired_leaves({"": 1}, {"": 1}) is None and paired_leaves({"..": 1}, {"..": 1}) is None
    assert paired_leaves(5, 5) is None


def test_a_torch_batch_knows_whether_all_are_dense_and_copies_either_way(monkeypatch):
    """``engine.batch`` of torch tensors (kept walks, snapshot buffers): one
    ``_foreach_copy_`` when both sides were found contiguous when prepared; a
    side with a non-contiguous tensor is looked at again and copied pair by pair."""
    from pyckpt.adapters import torch_device as td
    from pyckpt.device.array import DeviceArray

    def arrays(ts):
        return [DeviceArray.trusted(t, tuple(t.shape), td.numpy_dtype(torch, t.dtype), "cpu",
                                    None) for t in ts]

    src = [torch.arange(6.0).reshape(2, 3), torch.arange(4.0)]
    dense = [torch.zeros(2, 3), torch.zeros(4)]
    strided = [torch.zeros(3, 2).t(), torch.zeros(8)[::2]]
    a, b, c = (td.tensor_batch(torch, arrays(x)) for x in (src, dense, strided))
    assert a.dense and b.dense and not c.dense and c.native[0] is strided[0]
    foreach = count_calls(monkeypatch, torch, "_foreach_copy_")
    td.copy_tensor_batches(torch, a, b)
    td.copy_tensor_batches(torch, a, c)
    assert len(foreach) == 1  # the dense pair only
    for x in (dense, strided):
        assert all(torch.equal(s, d) for s, d in zip(src, x))


def test_clones_of_a_dense_torch_batch_are_new_memory_with_equal_bits():
    """``engine.clones`` of torch tensors (a new snapshot's buffers): one
    ``_foreach_clone`` where torch has it and every source is contiguous; new
    memory, bit for bit the sources (NaN payloads and negative zeros kept); None
    for a batch with a non-contiguous tensor (the engine then copies into
    ``empties_like``)."""
    from pyckpt.adapters import torch_device as td
    from pyckpt.device.array import DeviceArray

    def batch(ts):
        return td.tensor_batch(torch, [DeviceArray.trusted(
            t, tuple(t.shape), td.numpy_dtype(torch, t.dtype), "cpu", None) for t in ts])

    bits = torch.tensor([0x7FA00001, -0x80000000, 1], dtype=torch.int32).view(torch.float32)
    srcs = [bits, torch.arange(6, dtype=torch.int64).reshape(2, 3), torch.ones(0)]
    if not hasattr(torch, "_foreach_clone"):
        assert td.clone_tensor_batch(torch, batch(srcs), None) is None
        return
    out = td.clone_tensor_batch(torch, batch(srcs), "eng")
    assert out.dense and [a.engine for a in out.arrays] == ["eng"] * 3
    for s, c, a in zip(srcs, out.native, out.arrays):
        assert a.obj is c and c.is_contiguous() and c.dtype == s.dtype and c.shape == s.shape
        assert c.numel() == 0 or c.data_ptr() != s.data_ptr()
        assert torch.equal(c.view(torch.uint8) if c.numel() else c,
                           s.view(torch.uint8) if s.numel() else s)
    assert td.clone_tensor_batch(torch, batch([torch.zeros(3, 2).t()]), None) is None


def test_a_clone_torch_refuses_leaves_the_copy_to_the_engine(monkeypatch):
    """A ``_foreach_clone`` that raises (a dtype its kernel lacks) makes nothing:
    ``clone_tensor_batch`` gives None and the engine copies into ``empties_like``."""
    from pyckpt.adapters import torch_device as td
    from pyckpt.device.array import DeviceArray

    def refuse(tensors):
        raise NotImplementedError("not implemented for 'Float8_e4m3fn'")

    monkeypatch.setattr(torch, "_foreach_clone", refuse, raising=False)
    t = torch.ones(3)
    b = td.tensor_batch(torch, [DeviceArray.trusted(t, (3,), td.numpy_dtype(torch, t.dtype),
                                                    "cpu", None)])
    assert td.clone_tensor_batch(torch, b, None) is None
