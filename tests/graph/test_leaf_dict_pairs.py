"""``tree.paired_leaves`` of two dicts of leaves with the same keys in one order (copy_state
of two state dicts) pairs them in C-level passes (``tree._leaf_dicts``), with the same
result as the step per pair; other dicts take the step per pair."""

import numpy as np

from pyckpt import tree


def _state(seed, keys):
    rng = np.random.default_rng(seed)
    return {k: rng.standard_normal(3) for k in keys}


def test_leaf_dicts_pair_as_the_step_per_pair(monkeypatch):
    keys = [f"layer{i}.w" for i in range(6)]
    a, b = _state(0, keys), _state(1, keys)
    tree.paired_leaves(a, b)  # keys seen (plain)
    calls = []
    real = tree._leaf_dicts
    monkeypatch.setattr(tree, "_leaf_dicts", lambda *x: calls.append(real(*x)) or calls[-1])
    xs, ys = tree.paired_leaves(a, b)
    assert calls == [True]
    assert [id(x) for x in xs] == [id(a[k]) for k in keys]
    assert [id(y) for y in ys] == [id(b[k]) for k in keys]


def test_other_dicts_take_the_step_per_pair():
    keys = ["x", "y", "z"]
    a, b = _state(0, keys), _state(1, keys[::-1])
    b = {k: b[k] for k in ["z", "y", "x"]}  # another order: paired by key
    xs, ys = tree.paired_leaves(a, b)
    assert [id(y) for y in ys] == [id(b[k]) for k in keys]
    nested = {"x": a["x"], "d": {"y": a["y"]}}
    assert tree.paired_leaves(nested, {"x": b["x"], "d": {"y": b["y"]}}) is not None
    assert tree.paired_leaves(nested, {"x": b["x"], "d": b["y"]}) is None  # structure differs
    assert tree.paired_leaves({"a/b": 1}, {"a/b": 2}) is None  # not a plain key
    assert tree.paired_leaves({"x": 1, "y": 2}, {"x": 1, "q": 2}) is None
