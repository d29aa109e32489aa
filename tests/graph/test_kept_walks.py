"""Kept walks (graph/walk_cache.py): snapshot(), snapshot(into=), restore(snapshot) and
copy_state of a graph re-check the last walk of its root instead of walking it again,
and take the full walk, with its result, at any difference."""

from __future__ import annotations

import gc
import weakref

import numpy as np
import pytest

import pyckpt
from pyckpt import registry
from pyckpt.graph import restore as restore_mod
from pyckpt.graph import walk_cache
from pyckpt.testing.spies import count_calls
from pyckpt.variables import Variable


def _torch():
    from pyckpt.testing.requirements import require

    return require("torch")


@pytest.fixture
def walks(monkeypatch):
    """Counts the full walks of the object graph and the full restore matches."""
    return {"walk": count_calls(monkeypatch, walk_cache, "traverse"),
            "match": count_calls(monkeypatch, restore_mod.RestoreSession, "restore_subtree")}


def _no_kept_walks(monkeypatch):
    monkeypatch.setattr(walk_cache, "_build", lambda root, live: None)


def _state(torch, seed, n=6):
    g = torch.Generator().manual_seed(seed)
    return {f"t{i}": torch.randn(4, i + 1, generator=g) for i in range(n)}


def _values(snap):
    return {k: np.array(snap[k]) for k in snap.keys()}


def test_the_kept_walk_does_no_walk_per_value(walks, monkeypatch):
    torch = _torch()
    targets = count_calls(monkeypatch, registry, "target_view")
    src = pyckpt.Checkpoint(state=_state(torch, 0), v=Variable(np.ones(3)), a=np.zeros(2))
    dst = pyckpt.Checkpoint(state=_state(torch, 1), v=Variable(np.zeros(3)), a=np.ones(2))
    snap = src.snapshot()
    dst.restore(snap)
    dst.restore(snap)
    assert len(walks["walk"]) == 2  # one per root
    del walks["walk"][:], walks["match"][:], targets[:]
    again = src.snapshot()
    src.snapshot(into=again)
    status = dst.restore(snap)
    pyckpt.copy_state(snap, dst)
    assert walks["walk"] == [] and walks["match"] == [] and targets == []
    status.assert_consumed()
    for k in snap.keys():
        np.testing.assert_array_equal(np.array(again[k]), np.array(snap[k]))
    np.testing.assert_array_equal(dst.state["t3"].numpy(), src.state["t3"].numpy())
    np.testing.assert_array_equal(dst.v.numpy(), np.ones(3))


def test_the_kept_walk_gives_the_full_walks_result(monkeypatch):
    torch = _torch()

    def run():
        src = pyckpt.Checkpoint(state=_state(torch, 0), v=Variable(np.ones(3)))
        dst = pyckpt.Checkpoint(state=_state(torch, 1), v=Variable(np.zeros(3)))
        first = src.snapshot()
        first = src.snapshot()
        src.state["t0"].add_(1)
        second = src.snapshot(into=first)
        status = dst.restore(second)
        return (second.graph_doc, _values(second), status.unmatched_checkpoint_keys(),
                status.unmatched_objects(), {k: t.numpy().copy() for k, t in dst.state.items()})

    kept = run()
    _no_kept_walks(monkeypatch)
    full = run()
    assert kept[0] == full[0] and kept[2:4] == full[2:4]
    for a, b in [(kept[1], full[1]), (kept[4], full[4])]:
        assert a.keys() == b.keys()
        for k in a:
            np.testing.assert_array_equal(a[k], b[k])


def test_a_snapshot_is_a_record_of_the_moment(walks):
    torch = _torch()
    src = pyckpt.Checkpoint(state=_state(torch, 0))
    src.snapshot()
    snap = src.snapshot()
    before = src.state["t2"].clone()
    src.state["t2"].add_(5)
    assert walks["walk"] == [1]
    np.testing.assert_array_equal(np.array(snap["state/t2/.ATTRIBUTES/VARIABLE_VALUE"]),
                                  before.numpy())


def test_a_replaced_parameter_is_seen(walks):
    torch = _torch()
    model = torch.nn.Sequential(torch.nn.Linear(3, 2), torch.nn.Linear(2, 2))
    ckpt = pyckpt.Checkpoint(model=model)
    snap = ckpt.snapshot()
    ckpt.snapshot()
    old = model[0].weight
    model[0].weight = torch.nn.Parameter(torch.full((2, 3), 7.0))
    again = ckpt.snapshot()
    assert len(walks["walk"]) == 2  # the kept walk did not hold
    np.testing.assert_array_equal(np.array(again["model/0/weight/.ATTRIBUTES/VARIABLE_VALUE"]),
                                  np.full((2, 3), 7.0, np.float32))
    ckpt.restore(snap)  # fills the new parameter, not the old one
    np.testing.assert_array_equal(model[0].weight.detach().numpy(), old.detach().numpy())


@pytest.mark.parametrize("change", ["data", "dtype", "shape", "set"])
def test_new_storage_of_the_same_tensor_is_seen(change, walks):
    torch = _torch()
    state = _state(torch, 0)
    ckpt = pyckpt.Checkpoint(state=state)
    snap = ckpt.snapshot()
    ckpt.restore(snap)
    t = state["t1"]
    if change == "data":
        t.data = torch.zeros(4, 2)
    elif change == "dtype":
        t.data = t.data.double()
    elif change == "shape":
        t.data = torch.zeros(5, 2)
    else:
        t.set_(torch.zeros(4, 2).untyped_storage(), 0, (2, 4))
    del walks["walk"][:], walks["match"][:]
    if change == "data":
        ckpt.restore(snap).assert_consumed()
        np.testing.assert_array_equal(t.numpy(), np.array(snap["state/t1/.ATTRIBUTES/"
                                                               "VARIABLE_VALUE"]))
        assert walks["walk"] == [1]  # the kept walk did not hold: walked again
    else:  # refused by the full match, naming the key
        with pytest.raises(ValueError, match="state/t1"):
            ckpt.restore(snap)
        assert walks["match"] == [1]


def test_an_added_attribute_or_entry_is_seen(walks):
    torch = _torch()
    ckpt = pyckpt.Checkpoint(state=_state(torch, 0))
    ckpt.snapshot()
    ckpt.snapshot()
    ckpt.extra = torch.ones(2)
    ckpt.state["new"] = torch.ones(3)
    snap = ckpt.snapshot()
    assert len(walks["walk"]) == 2
    assert "extra/.ATTRIBUTES/VARIABLE_VALUE" in snap.keys()
    assert "state/new/.ATTRIBUTES/VARIABLE_VALUE" in snap.keys()
    ckpt.snapshot()
    assert len(walks["walk"]) == 2  # kept again


def test_a_registered_adapter_drops_the_kept_walks(walks, monkeypatch):
    torch = _torch()
    monkeypatch.setattr(registry, "_ADAPTERS", list(registry._ADAPTERS))
    ckpt = pyckpt.Checkpoint(state=_state(torch, 0))
    ckpt.snapshot()
    ckpt.snapshot()
    registry.register_adapter("test.nothing", leaf=lambda o: None)
    ckpt.snapshot()
    assert len(walks["walk"]) == 2


def test_a_graph_with_an_optimizer_is_kept_for_snapshots_not_for_restores(walks):
    """A state node (graph/kept_states.py): snapshots re-read the optimizer's state
    dict instead of walking it (a new learning rate is taken, without a walk); a
    restore loads it through the optimizer, by the full match, as before."""
    torch = _torch()
    model = torch.nn.Linear(2, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    model(torch.ones(1, 2)).sum().backward()
    opt.step()
    ckpt = pyckpt.Checkpoint(model=model, opt=opt)
    snap = ckpt.snapshot()
    opt.param_groups[0]["lr"] = 0.05
    snap = ckpt.snapshot(into=snap)
    assert len(walks["walk"]) == 1  # kept
    assert float(np.array(snap["opt/param_groups/0/lr/.ATTRIBUTES/VARIABLE_VALUE"])) == 0.05
    momentum = opt.state[model.weight]["momentum_buffer"]
    want = momentum.clone()
    with torch.no_grad():
        momentum.add_(1.0)
    opt.param_groups[0]["lr"] = 0.3
    ckpt.restore(snap).assert_consumed()
    assert len(walks["match"]) == 1  # the full match, which loads the state dict
    assert torch.equal(opt.state[model.weight]["momentum_buffer"], want)
    assert opt.param_groups[0]["lr"] == 0.05
    assert walk_cache._WALKS[ckpt][()].structure is None  # the snapshots' walk, kept


class _Stateful:
    """A user object saved through its state dict: a new dict at each call, holding
    the same leaves."""

    def __init__(self, torch):
        self.state = {"name": "a", "x": 1.5, "n": 5, "t": torch.zeros(3), "l": [1, (2, 3.0)],
                      "a": np.arange(4.0)}

    def state_dict(self):
        return dict(self.state)

    def load_state_dict(self, state):
        self.state = dict(state)


def _change(torch, st, change):
    if change == "name":
        st.state["name"] = "b"  # a text leaf (in the graph's state column)
    elif change == "type":
        st.state["x"] = 2  # a float becomes an int
    elif change == "big":
        st.state["n"] = 2 ** 70  # beyond int64: kept as text
    elif change == "tensor":
        st.state["t"] = torch.ones(3)  # another tensor
    elif change == "data":
        st.state["t"].data = torch.ones(5)  # new storage of the same tensor
    elif change == "array":
        st.state["a"] = np.ones(4)
    elif change == "key":
        st.state["y"] = 1.0
    elif change == "tuple":
        st.state["l"] = [1, [2, 3.0]]  # a tuple becomes a list
    elif change == "raises":
        st.state_dict = lambda: 1 / 0


@pytest.mark.parametrize("change", ["name", "type", "big", "tensor", "data", "array", "key",
                                    "tuple", "raises"])
def test_a_state_dict_of_another_form_is_walked_again(change, walks):
    """Each change of a state dict's form ends its kept walk; the snapshot is then the
    full walk's (same keys, values and graph), or its error."""
    torch = _torch()
    st = _Stateful(torch)
    ckpt = pyckpt.Checkpoint(s=st)
    ckpt.snapshot()
    st.state["x"] = 2.5  # a new number: taken without a walk
    snap = ckpt.snapshot()
    assert len(walks["walk"]) == 1
    assert float(np.array(snap["s/x/.ATTRIBUTES/VARIABLE_VALUE"])) == 2.5
    _change(torch, st, change)
    if change == "raises":
        with pytest.raises(ZeroDivisionError):
            ckpt.snapshot()
        return
    snap = ckpt.snapshot()
    assert len(walks["walk"]) == 2  # the kept walk did not hold
    walk_cache.forget_all()
    full = ckpt.snapshot()
    assert snap.keys() == full.keys() and snap.graph_doc == full.graph_doc
    for k in full.keys():
        np.testing.assert_array_equal(np.array(snap[k]), np.array(full[k]))
    st2 = _Stateful(torch)
    pyckpt.Checkpoint(s=st2).restore(snap).assert_consumed()
    assert st2.state.keys() == st.state.keys() and st2.state["name"] == st.state["name"]


def test_a_pending_restore_takes_the_full_match(walks):
    torch = _torch()
    src = pyckpt.Checkpoint(state=_state(torch, 0), late=torch.ones(2))
    snap = src.snapshot()
    dst = pyckpt.Checkpoint(state=_state(torch, 1))
    dst.snapshot()
    status = dst.restore(snap)  # "late" is pending on dst
    assert status.unmatched_checkpoint_keys() == ["late/.ATTRIBUTES/VARIABLE_VALUE"]
    dst.restore(snap)
    assert len(walks["match"]) == 2
    dst.late = torch.zeros(2)  # restored on creation
    np.testing.assert_array_equal(dst.late.numpy(), np.ones(2, np.float32))


def test_a_partial_restore_reports_as_the_full_match(monkeypatch):
    torch = _torch()

    def run():
        src = pyckpt.Checkpoint(state=_state(torch, 0))
        dst = pyckpt.Checkpoint(state=_state(torch, 1), only_here=torch.ones(2))
        src.snapshot()
        snap = src.snapshot()
        dst.restore(snap)
        status = dst.restore(snap)
        with pytest.raises(AssertionError) as e:
            status.assert_consumed()
        return (status.unmatched_checkpoint_keys(), status.unmatched_objects(), str(e.value),
                dst.state["t0"].numpy().copy())

    kept = run()
    _no_kept_walks(monkeypatch)
    full = run()
    assert kept[:3] == full[:3]
    np.testing.assert_array_equal(kept[3], full[3])


def test_copy_state_of_kept_graphs_and_its_mismatches(walks):
    torch = _torch()
    a = torch.nn.Sequential(torch.nn.Linear(3, 2))
    b = torch.nn.Sequential(torch.nn.Linear(3, 2))
    pyckpt.copy_state(a, b)
    pyckpt.copy_state(a, b)
    assert len(walks["walk"]) == 2  # one per root, then kept
    with torch.no_grad():
        a[0].weight.add_(1)
    pyckpt.copy_state(a, b)
    assert len(walks["walk"]) == 2
    np.testing.assert_array_equal(b[0].weight.detach().numpy(), a[0].weight.detach().numpy())
    b[0].bias = torch.nn.Parameter(torch.zeros(3))
    with pytest.raises(ValueError, match="0/bias"):
        pyckpt.copy_state(a, b)


def test_a_kept_walk_does_not_keep_its_root_alive():
    torch = _torch()
    ckpt = pyckpt.Checkpoint(state=_state(torch, 0))
    ckpt.snapshot()
    ref = weakref.ref(ckpt)
    del ckpt
    gc.collect()
    assert ref() is None


def test_a_stamp_hook_decides_for_foreign_values(monkeypatch, walks):
    """An adapter without a ``stamp`` hook: walked each time; with one: kept while the
    stamps are equal."""
    monkeypatch.setattr(registry, "_ADAPTERS", list(registry._ADAPTERS))

    class Box:
        def __init__(self, a):
            self.a = a

    def target(o):
        return o.a if isinstance(o, Box) else None

    registry.register_adapter("test.box", leaf=target, target=target)
    ckpt = pyckpt.Checkpoint(state={"b": Box(np.ones(3))})
    ckpt.snapshot()
    ckpt.snapshot()
    assert len(walks["walk"]) == 2
    registry.register_adapter("test.box", leaf=target, target=target,
                              stamp=lambda objs: [id(o.a) for o in objs]
                              if all(isinstance(o, Box) for o in objs) else None)
    ckpt.snapshot()
    ckpt.snapshot()
    assert len(walks["walk"]) == 3
    ckpt.state["b"].a = np.full(3, 2.0)  # a new target: a new stamp
    snap = ckpt.snapshot()
    assert len(walks["walk"]) == 4
    np.testing.assert_array_equal(snap["state/b/.ATTRIBUTES/VARIABLE_VALUE"], np.full(3, 2.0))


def test_snapshot_buffers_are_made_without_cyclic_collections(monkeypatch):
    """A buffer object per value, none in a cycle: the collector is paused while they are
    made (each collection would walk every object of the process)."""
    from pyckpt.device.array import DeviceArray
    from pyckpt.device.engine import HostCopyEngine
    from pyckpt.graph import snapshot as snapshot_mod

    monkeypatch.setattr(registry, "_ADAPTERS", list(registry._ADAPTERS))
    eng = HostCopyEngine()

    class Dev:
        def __init__(self, a):
            self.a = a

    def target(o):
        return DeviceArray(o.a, o.a.shape, o.a.dtype, "host", eng) if isinstance(o, Dev) \
            else None

    registry.register_adapter("test.dev", leaf=target, target=target)
    ckpt = pyckpt.Checkpoint(state={f"t{i}": Dev(np.ones(2)) for i in range(300)})
    ckpt.snapshot()
    inside = [False]
    during: list[str] = []
    real = snapshot_mod._snapshot_buffers

    def buffers(*args):
        inside[0] = True
        try:
            return real(*args)
        finally:
            inside[0] = False

    def seen(phase, info):
        if inside[0] and phase == "start":
            during.append(phase)

    monkeypatch.setattr(snapshot_mod, "_snapshot_buffers", buffers)
    old = gc.get_threshold()
    gc.callbacks.append(seen)
    gc.set_threshold(20, 10, 10)
    try:
        ckpt.snapshot()
    finally:
        gc.set_threshold(*old)
        gc.callbacks.remove(seen)
    assert during == []


def test_a_module_listing_its_members_its_own_way_is_checked_by_its_children(walks):
    torch = _torch()

    class Renamed(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.inner = {"w": torch.nn.Parameter(torch.ones(2))}

        def named_parameters(self, prefix="", recurse=True, remove_duplicate=True):
            yield from self.inner.items()

    m = Renamed()
    ckpt = pyckpt.Checkpoint(model=m)
    ckpt.snapshot()
    ckpt.snapshot()
    m.inner["w"] = torch.nn.Parameter(torch.full((2,), 3.0))  # not in m's own dicts
    snap = ckpt.snapshot()
    assert len(walks["walk"]) == 2
    np.testing.assert_array_equal(snap["model/w/.ATTRIBUTES/VARIABLE_VALUE"], [3.0, 3.0])


def test_release_staging_memory_drops_the_kept_walks_and_the_storage_they_hold(walks):
    """A kept walk holds the tensors it copies: after ``.data`` is replaced (what
    ``module.half()`` does), the old storage lives until the root's next walk, or until
    ``pyckpt.device.release_staging_memory()``, which drops every kept walk."""
    torch = _torch()
    model = torch.nn.Linear(64, 64)
    ck = pyckpt.Checkpoint(model=model)
    ck.snapshot()
    ck.snapshot()
    assert len(walks["walk"]) == 1  # kept
    old = weakref.ref(model.weight.data.untyped_storage())
    model.weight.data = torch.zeros(64, 64)
    gc.collect()
    assert old() is not None  # held by the kept walk
    pyckpt.device.release_staging_memory()
    gc.collect()
    assert old() is None
    ck.snapshot()
    assert len(walks["walk"]) == 2  # walked again after the release


@pytest.mark.parametrize("change", ["moved", "non_persistent", "extra_state", "class"])
def test_the_modules_signed_together_see_each_change(change, walks, monkeypatch):
    """A model's modules are re-checked in one call (``ModuleNode._pyckpt_signatures``):
    a child moved to another module under the same name, a buffer made
    non-persistent, a class given ``get_extra_state`` and a module's class swapped
    are each seen, and the snapshot is the full walk's."""
    torch = _torch()

    class Holder(torch.nn.Module):
        pass

    a, b = Holder(), Holder()
    a.register_buffer("x", torch.ones(2))
    a.register_buffer("y", torch.zeros(3))
    ckpt = pyckpt.Checkpoint(model=torch.nn.Sequential(a, b))
    ckpt.snapshot()
    ckpt.snapshot()
    assert len(walks["walk"]) == 1  # kept
    if change == "moved":  # the same names and ids in module order: only the owner moved
        b.register_buffer("y", a._buffers.pop("y"))
    elif change == "non_persistent":
        a.register_buffer("x", a.x, persistent=False)  # the same tensor, no longer saved
    elif change == "extra_state":
        monkeypatch.setattr(Holder, "get_extra_state", lambda self: {"k": 1}, raising=False)
        monkeypatch.setattr(Holder, "set_extra_state", lambda self, s: None, raising=False)
    else:
        class Other(torch.nn.Module):
            def get_extra_state(self):
                return 5

            def set_extra_state(self, s):
                pass

        b.__class__ = Other
    snap = ckpt.snapshot()
    assert len(walks["walk"]) == 2  # the kept walk did not hold
    walk_cache.forget_all()
    full = ckpt.snapshot()
    assert snap.keys() == full.keys()
    if change == "moved":
        assert "model/1/y/.ATTRIBUTES/VARIABLE_VALUE" in snap.keys()
    elif change == "non_persistent":
        assert "model/0/x/.ATTRIBUTES/VARIABLE_VALUE" not in snap.keys()
    else:
        assert any("extra_state" in k for k in snap.keys()), snap.keys()
