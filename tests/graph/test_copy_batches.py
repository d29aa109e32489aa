"""The batched hot paths of the in-memory copies (issue 40 item 4): ``copy_values`` hands
a batch of DeviceArrays of one engine to ``engine.copy`` without sorting value by
value; ``copy_tensors`` (copy_state of two trees of tensors) checks every pair at once
and still sends whatever differs to the per-value path, whose checks report it;
``foreach_copy`` copies in one ``_foreach_copy_`` only when every tensor is
contiguous. (CUDA: tests/gpu/test_device_objects.py.)"""

import numpy as np
import pytest

import pyckpt
from pyckpt.device import copies
from pyckpt.device.array import DeviceArray
from pyckpt.device.engine import HostCopyEngine
from pyckpt.testing.late_copies import LateCopyEngine
from pyckpt.testing.spies import count_calls


class _Engine(HostCopyEngine):
    """A host engine that records what each ``copy`` call got."""

    def __init__(self):
        super().__init__()
        self.calls = []

    def copy(self, srcs, dsts):
        self.calls.append((srcs, dsts))
        super().copy(srcs, dsts)


def _values(engine, seed, n=5, dtype=np.float32):
    rng = np.random.default_rng(seed)
    arrays = [rng.standard_normal((i + 1, 3)).astype(dtype) for i in range(n)]
    return [DeviceArray(a, a.shape, a.dtype, "host", engine) for a in arrays]


def test_one_engine_batch_is_one_copy_call_without_routing(monkeypatch):
    eng = _Engine()
    srcs, dsts = _values(eng, 0), _values(eng, 1)
    routed = count_calls(monkeypatch, copies._Routes, "add")
    copies.copy_values(srcs, dsts)
    assert routed == [] and len(eng.calls) == 1
    assert eng.calls[0] == (srcs, dsts)  # the caller's lists, as they are
    for s, d in zip(srcs, dsts):
        np.testing.assert_array_equal(d.obj, s.obj)


def test_batches_that_are_not_one_engine_and_dtype_are_routed(monkeypatch):
    eng, other = _Engine(), _Engine()
    routed = count_calls(monkeypatch, copies._Routes, "add")
    srcs, dsts = _values(eng, 0, 2), _values(other, 1, 2)  # two engines: through the host
    copies.copy_values(srcs, dsts)
    assert len(routed) == 2 and eng.calls == [] and other.calls == []
    for s, d in zip(srcs, dsts):
        np.testing.assert_array_equal(d.obj, s.obj)

    routed.clear()
    srcs, dsts = _values(eng, 2, 2), _values(eng, 3, 2, np.dtype(">f4"))  # other byte order
    copies.copy_values(srcs, dsts)
    assert len(routed) == 2 and eng.calls == []
    for s, d in zip(srcs, dsts):
        np.testing.assert_array_equal(d.obj, s.obj)

    routed.clear()
    host = [np.zeros((1, 3), np.float32)]  # a host destination among device values
    copies.copy_values(_values(eng, 4, 1), host)
    assert len(routed) == 1


def test_snapshot_and_restore_of_one_late_engine_land_every_value():
    """The batch route keeps the engine's contract: copies land late, out of order."""
    from pyckpt import registry

    eng = LateCopyEngine(delay=0.005, seed=3)
    rng = np.random.default_rng(0)
    data = {f"w{i}": rng.standard_normal(7 + i).astype(np.float32) for i in range(20)}

    class Dev:
        def __init__(self, a, name):
            self.a, self.name = a, name

    saved = list(registry._ADAPTERS)
    registry.register_adapter("late-dev", leaf=lambda o: eng.array(o.a, o.name)
                              if isinstance(o, Dev) else None,
                              target=lambda o: eng.array(o.a, o.name)
                              if isinstance(o, Dev) else None)
    try:
        src = pyckpt.Checkpoint(state={k: Dev(v.copy(), k) for k, v in data.items()})
        snap = src.snapshot()
        for d in src.state.values():
            d.a += 1  # later changes never reach the snapshot
        dst = pyckpt.Checkpoint(state={k: Dev(np.zeros_like(v), k) for k, v in data.items()})
        eng.synchronize()
        before = {k: d.a for k, d in dst.state.items()}
        dst.restore(snap).assert_consumed()
        eng.synchronize()
        for k, d in dst.state.items():
            assert d.a is before[k]  # filled in place
            np.testing.assert_array_equal(d.a, data[k])
    finally:
        registry._ADAPTERS[:] = saved


# -- torch's copy hook ---------------------------------------------------------------------

def _torch():
    from pyckpt.testing.requirements import require

    return require("torch")


def test_negative_views_of_real_tensors_take_the_per_value_way(monkeypatch):
    """The conjugate bit is only asked of complex tensors; the negative bit of every
    tensor (a real tensor carries it: ``c.conj().imag``)."""
    torch = _torch()
    from pyckpt.graph import snapshot as snapshot_mod

    c = torch.tensor([1 + 2j, 3 - 4j], dtype=torch.complex64)
    neg = c.conj().imag
    assert neg.is_neg() and not neg.is_complex()
    per_value = count_calls(monkeypatch, snapshot_mod, "_sources")
    src = {"n": neg, "w": torch.ones(3)}
    dst = {"n": torch.zeros(2), "w": torch.zeros(3)}
    pyckpt.copy_state(src, dst)
    assert len(per_value) == 1
    assert torch.equal(dst["n"], torch.tensor([-2.0, 4.0])) and torch.equal(dst["w"], src["w"])

    base = torch.zeros(2, dtype=torch.complex64)
    per_value.clear()
    pyckpt.copy_state({"n": torch.tensor([5.0, 6.0])}, {"n": base.conj().imag})
    assert len(per_value) == 1  # a negative view to write: through a host copy
    assert torch.equal(base.imag, torch.tensor([-5.0, -6.0]))


@pytest.mark.parametrize("contiguous", [True, False])
def test_foreach_copy_batches_only_contiguous_tensors(monkeypatch, contiguous):
    torch = _torch()
    from pyckpt.adapters.torch_device import foreach_copy

    foreach = count_calls(monkeypatch, torch, "_foreach_copy_")
    srcs = [torch.arange(6.0).reshape(2, 3), torch.arange(4.0)]
    dsts = [torch.zeros(2, 3) if contiguous else torch.zeros(3, 2).t(), torch.zeros(4)]
    foreach_copy(torch, dsts, srcs)
    assert len(foreach) == (1 if contiguous else 0)
    assert all(torch.equal(d, s) for d, s in zip(dsts, srcs))

    foreach.clear()  # told by the caller: not asked again
    calls = count_calls(monkeypatch, torch.Tensor, "is_contiguous")
    foreach_copy(torch, dsts, srcs, contiguous)
    assert calls == [] and len(foreach) == (1 if contiguous else 0)


def test_copy_hook_groups_small_and_large_cpu_tensors_and_keeps_order(monkeypatch):
    torch = _torch()
    from pyckpt.adapters import torch_device

    big = torch_device.SMALL_HOST_BYTES // 4 + 1
    srcs = [torch.full((3,), 1.0), torch.full((big,), 2.0), torch.full((2,), 3.0),
            torch.full((big,), 4.0)]
    dsts = [torch.zeros_like(s) for s in srcs]
    got = []
    assert torch_device.copy_tensors(torch, srcs, dsts, lambda s, d: got.append((s, d)))
    assert len(got) == 1
    assert [x is y for x, y in zip(got[0][0], [srcs[1], srcs[3]])] == [True, True]
    assert [x is y for x, y in zip(got[0][1], [dsts[1], dsts[3]])] == [True, True]
    assert torch.equal(dsts[0], srcs[0]) and torch.equal(dsts[2], srcs[2])
    assert not dsts[1].any() and not dsts[3].any()  # left to host_copy
    assert torch_device.copy_tensors(torch, [], [], lambda s, d: None)
    assert not torch_device.copy_tensors(torch, srcs[:1], dsts[:2], lambda s, d: None)


# -- snapshot(into=) of the same structure ---------------------------------------------------

def test_snapshot_into_of_the_same_graph_keeps_its_stored_graph():
    state = {"a": np.arange(3.0), "b": [np.ones(2), np.zeros(1)]}
    ckpt = pyckpt.Checkpoint(state=state)
    first = ckpt.snapshot()
    again = ckpt.snapshot(into=first)
    assert again.graph is first.graph and again.graph_doc is first.graph_doc
    assert again.graph_doc == ckpt.snapshot().graph_doc  # what a fresh walk writes
    ckpt.state["a"] += 1
    restored = pyckpt.Checkpoint(state={"a": np.zeros(3), "b": [np.zeros(2), np.ones(1)]})
    restored.restore(again).assert_consumed()
    np.testing.assert_array_equal(restored.state["a"], np.arange(3.0))

    ckpt.state["c"] = np.ones(4)  # a new value: a new graph
    grown = ckpt.snapshot(into=again)
    assert grown.graph is not again.graph and len(grown) == 4
    assert grown.graph_doc == ckpt.snapshot().graph_doc

    ckpt.state["c"] = pyckpt.Variable(np.ones(4))  # same keys, another type: a new graph
    typed = ckpt.snapshot(into=grown)
    assert typed.graph is not grown.graph and typed.graph_doc == ckpt.snapshot().graph_doc


def test_snapshot_into_of_a_graph_with_states_makes_its_own():
    """States (a Python number's, an optimizer's) hold values of the moment."""
    ckpt = pyckpt.Checkpoint(state={"w": np.ones(2), "lr": 0.5})
    first = ckpt.snapshot()
    ckpt.state["lr"] = 0.25
    again = ckpt.snapshot(into=first)
    assert again.graph is not first.graph
    restored = pyckpt.Checkpoint(state={"w": np.zeros(2), "lr": 1.0})
    restored.restore(again)
    assert restored.state["lr"] == 0.25


# -- restore: a value is filled, never restored as a whole -----------------------------------

class _Both:
    """An object an adapter gives a target (a value) and a node that could restore it as a
    whole: restore asks for the target first, as copy_state and LoadStatus do."""

    def __init__(self, values):
        self.values = np.array(values, dtype=np.float64)
        self.restored_whole = 0


class _BothNode:
    def __init__(self, obj):
        self.obj = obj

    def _pyckpt_children(self):
        return []

    def _pyckpt_get_child(self, name):
        from pyckpt.graph.missing import MISSING

        return MISSING

    def _pyckpt_restore(self, values):
        self.obj.restored_whole += 1


def test_restore_fills_a_value_that_also_has_a_whole_object_node():
    from pyckpt import registry

    saved = list(registry._ADAPTERS)
    registry.register_adapter(
        "both", leaf=lambda o: o.values if isinstance(o, _Both) else None,
        target=lambda o: o.values if isinstance(o, _Both) else None,
        node=lambda o: _BothNode(o) if isinstance(o, _Both) else None)
    try:
        snap = pyckpt.Checkpoint(x=_Both([1.0, 2.0])).snapshot()
        obj = _Both([0.0, 0.0])
        pyckpt.Checkpoint(x=obj).restore(snap).assert_existing_objects_matched()
        np.testing.assert_array_equal(obj.values, [1.0, 2.0])
        assert obj.restored_whole == 0
        again = _Both([0.0, 0.0])  # copy_state sees it the same way
        pyckpt.copy_state(snap, pyckpt.Checkpoint(x=again))
        np.testing.assert_array_equal(again.values, [1.0, 2.0])
    finally:
        registry._ADAPTERS[:] = saved
