"""Walks of the object graph ask the adapters for each value's target once (the
per-value work of save, snapshot(), restore(snapshot) and copy_state), and a
restore still fills the storage an object holds once the objects restored as a
whole before it ran their own code."""

from __future__ import annotations

import numpy as np
import pytest

import pyckpt
from pyckpt import registry
from pyckpt.graph.object_graph import traverse


class Box:
    """A foreign value type: its array is reached through a registered adapter."""

    def __init__(self, a: np.ndarray) -> None:
        self.a = a


@pytest.fixture
def box_calls(monkeypatch):
    """Registers an adapter for Box (undone after the test); the list of the ids of
    the Boxes its ``target`` hook was asked about."""
    monkeypatch.setattr(registry, "_ADAPTERS", list(registry._ADAPTERS))
    calls: list[int] = []

    def target(o):
        if not isinstance(o, Box):
            return None
        calls.append(id(o))
        return o.a

    registry.register_adapter("test.box", leaf=lambda o: o.a if isinstance(o, Box) else None,
                              target=target)
    return calls


def _boxes(n: int) -> dict[str, Box]:
    return {f"b{i}": Box(np.full((3,), i, np.float32)) for i in range(n)}


def test_a_walk_asks_for_each_target_once(box_calls):
    boxes = _boxes(50)
    ckpt = pyckpt.Checkpoint(state=boxes, extra=[Box(np.ones(2))])
    live = traverse(ckpt)
    assert len(box_calls) == 51 and len(set(box_calls)) == 51
    assert len(live.values) == 51
    for n in live.values:  # the arrays found are the boxes' own
        assert live.array_of(n) is live.objects[n].a


def test_snapshot_and_restore_ask_once_per_value(box_calls, tmp_path):
    src = pyckpt.Checkpoint(state=_boxes(20))
    snap = src.snapshot()
    assert len(box_calls) == 20
    dst_boxes = {k: Box(np.zeros(3, np.float32)) for k in src.state}
    dst = pyckpt.Checkpoint(state=dst_boxes)
    del box_calls[:]
    status = dst.restore(snap)
    assert len(box_calls) == 20
    status.assert_existing_objects_matched()  # (a walk of its own)
    for i in range(20):
        np.testing.assert_array_equal(dst_boxes[f"b{i}"].a, np.full(3, i, np.float32))
    del box_calls[:]
    path = src.write(tmp_path / "c")
    assert len(box_calls) == 20
    for b in dst_boxes.values():
        b.a[...] = 0
    del box_calls[:]
    dst.restore(path)
    assert len(box_calls) == 20
    np.testing.assert_array_equal(dst_boxes["b7"].a, np.full(3, 7, np.float32))


def test_copy_state_of_graphs_asks_once_per_value(box_calls):
    src = pyckpt.Checkpoint(state=_boxes(10))
    dst_boxes = {k: Box(np.zeros(3, np.float32)) for k in src.state}
    del box_calls[:]
    pyckpt.copy_state(src, pyckpt.Checkpoint(state=dst_boxes))
    assert len(box_calls) == 20  # each source and each destination once
    np.testing.assert_array_equal(dst_boxes["b3"].a, np.full(3, 3, np.float32))


class Swapper:
    """Restored as a whole (state_dict / load_state_dict); its load gives the Box it
    points at a new array, as code that replaces a tensor's storage does."""

    def __init__(self, box: Box) -> None:
        self.box = box
        self.n = np.zeros((), np.int64)

    def state_dict(self):
        return {"n": self.n}

    def load_state_dict(self, sd):
        self.n = np.array(sd["n"])
        self.box.a = np.zeros_like(self.box.a)  # new storage, after the walk met the box


def test_restore_fills_storage_replaced_by_a_unit_restored_before(box_calls, tmp_path):
    box = Box(np.arange(4, dtype=np.float32))
    # breadth-first: the walk meets the box before the swapper
    src = pyckpt.Checkpoint(x=box, swapper=Swapper(box))
    path = src.write(tmp_path / "c")
    box2 = Box(np.full(4, -1, np.float32))
    dst = pyckpt.Checkpoint(x=box2, swapper=Swapper(box2))
    dst.restore(path).assert_consumed()
    # the swapper ran before the box was filled: the values are in the box's new array
    np.testing.assert_array_equal(box2.a, np.arange(4, dtype=np.float32))


@pytest.mark.parametrize("prefix,key,want", [
    ("opt", "opt/.ATTRIBUTES/VARIABLE_VALUE", None),  # the node itself, not below it
    ("opt", "opt/a/0/.ATTRIBUTES/VARIABLE_VALUE", ["a", "0"]),
    ("opt", "optimizer/a/.ATTRIBUTES/VARIABLE_VALUE", None),
    ("", "a/b..c/.ATTRIBUTES/VARIABLE_VALUE", ["a", "b.c"]),
    ("a/b", "a/b/c.Sd/.ATTRIBUTES/VARIABLE_VALUE", ["c/d"]),
    ("x", "x/y", None),  # not a value's key
])
def test_keys_below_an_object_restored_as_a_whole(prefix, key, want):
    from pyckpt.graph.snapshot import _below, _is_below

    assert _below(prefix, key) == want
    assert _is_below(prefix, key) is (want is not None)


def test_copy_state_fills_storage_replaced_by_a_unit_restored_before(box_calls):
    """copy_state restores the objects restored as a whole first: their own code may
    give a value new storage, and the values must land there."""
    box = Box(np.arange(4, dtype=np.float32))
    box2 = Box(np.full(4, -1, np.float32))
    dst = pyckpt.Checkpoint(x=box2, swapper=Swapper(box2))
    pyckpt.copy_state(pyckpt.Checkpoint(x=box, swapper=Swapper(box)), dst)
    np.testing.assert_array_equal(box2.a, np.arange(4, dtype=np.float32))


class QWeight(pyckpt.Trackable):
    """A value an adapter takes that also tracks attributes of its own."""

    def __init__(self, data: np.ndarray, scale: float) -> None:
        self._data = data
        self.scale = pyckpt.Variable(np.float64(scale))


def test_a_value_that_tracks_attributes_keeps_them(monkeypatch, tmp_path):
    monkeypatch.setattr(registry, "_ADAPTERS", list(registry._ADAPTERS))
    take = lambda o: o._data if isinstance(o, QWeight) else None  # noqa: E731
    registry.register_adapter("test.qweight", leaf=take, target=take)
    path = pyckpt.Checkpoint(w=QWeight(np.arange(4.0), 2.5)).write(tmp_path / "c")
    w = QWeight(np.zeros(4), 0.0)
    pyckpt.Checkpoint(w=w).restore(path).assert_consumed()
    np.testing.assert_array_equal(w._data, np.arange(4.0))
    assert float(w.scale.numpy()) == 2.5


def test_walks_for_the_graphs_shape_keep_no_targets(box_calls):
    ckpt = pyckpt.Checkpoint(state=_boxes(5))
    assert len(traverse(ckpt).targets) == 5
    shape_only = traverse(ckpt, with_targets=False)
    assert shape_only.targets == {} and len(shape_only.values) == 5


class Shrinker(Swapper):
    def load_state_dict(self, sd):
        self.box.a = np.zeros(2, np.float32)  # a new array of another shape


def test_copy_state_raises_when_a_unit_changed_a_values_shape(box_calls):
    box = Box(np.arange(4, dtype=np.float32))
    box2 = Box(np.full(4, -1, np.float32))
    with pytest.raises(ValueError, match="'x/.ATTRIBUTES/VARIABLE_VALUE' of the destination "
                                         "changed"):
        pyckpt.copy_state(pyckpt.Checkpoint(x=box, swapper=Swapper(box)),
                          pyckpt.Checkpoint(x=box2, swapper=Shrinker(box2)))


def test_dict_keys_that_name_one_edge_are_refused(tmp_path):
    """1 and "1" would both be stored under "1": one value lost. A clear error instead."""
    ckpt = pyckpt.Checkpoint(state={1: np.zeros(2), "1": np.ones(2)})
    with pytest.raises(TypeError, match=r"cannot save state .*keys 1 and '1' are both "
                                        r"stored as '1'"):
        ckpt.write(tmp_path / "c")
    assert not (tmp_path / "c").exists()
    pyckpt.Checkpoint(state={1: np.zeros(2), 2: np.ones(2)}).write(tmp_path / "ok")
