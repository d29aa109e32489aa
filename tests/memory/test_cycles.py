"""No reference cycle holds a checkpoint's buffers (issue 28, item 1): with the cyclic
collector off, what a load returns is freed as soon as it is dropped, and no save,
load, restore, copy or manager round leaves pyckpt objects, pyckpt functions or
arrays reachable only through a cycle (gc.DEBUG_SAVEALL)."""

import gc
import os
import weakref

import numpy as np
import pytest

import pyckpt
from pyckpt.engine.copy import copy_checkpoint

TREE = {"a": np.arange(100_000.0), "b": [np.ones(10), {"c": np.zeros(5)}], "s": 3, "t": "x",
        "u": (np.arange(3), 2.5)}


@pytest.fixture
def saved(tmp_path):
    p = str(tmp_path / "c")
    pyckpt.save(TREE, p)
    return p


def _arrays(tree):
    if isinstance(tree, dict):
        return [a for v in tree.values() for a in _arrays(v)]
    if isinstance(tree, (list, tuple)):
        return [a for v in tree for a in _arrays(v)]
    return [tree] if isinstance(tree, np.ndarray) else []


@pytest.fixture
def collector_off():
    gc.collect()
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


@pytest.mark.parametrize("kw", [{}, {"mmap": True}, {"select": ["a", "b"]}],
                         ids=["load", "mmap", "select"])
def test_a_dropped_load_is_freed_at_once(saved, collector_off, kw):
    for _ in range(3):
        got = pyckpt.load(saved, **kw)
        refs = [weakref.ref(a) for a in _arrays(got)]
        assert refs
        del got
        assert all(r() is None for r in refs), "a loaded array outlived its result"


def test_a_dropped_reader_and_its_tensors_are_freed_at_once(saved, collector_off):
    r = pyckpt.load_checkpoint(saved)
    t = r.get_tensor("a")
    refs = [weakref.ref(r), weakref.ref(t)]
    del r, t
    assert all(x() is None for x in refs)


def _cyclic_garbage(fn, rounds=3):
    """What ``rounds`` calls of ``fn`` leave reachable only through reference cycles:
    objects of pyckpt's types, functions of pyckpt's modules and containers holding
    arrays (arrays themselves are not tracked by the collector)."""
    gc.collect()
    gc.disable()
    try:
        for _ in range(rounds):
            fn()
        gc.set_debug(gc.DEBUG_SAVEALL)
        gc.collect()
        found = set()
        for o in gc.garbage:
            mod = getattr(type(o), "__module__", "") or ""
            if mod.startswith("pyckpt"):
                found.add(f"{mod}.{type(o).__qualname__}")
            elif callable(o) and (getattr(o, "__module__", "") or "").startswith("pyckpt"):
                found.add(f"function {o.__module__}.{getattr(o, '__qualname__', o)}")
            elif isinstance(o, dict) and any(isinstance(v, np.ndarray) for v in o.values()):
                found.add("a dict of arrays")
            elif isinstance(o, (list, tuple)) and any(isinstance(v, np.ndarray) for v in o):
                found.add("a sequence of arrays")
        return sorted(found)
    finally:
        gc.set_debug(0)
        gc.garbage.clear()
        gc.enable()


def _manager(directory, **kw):
    def run():
        ck = pyckpt.Checkpoint(w=pyckpt.Variable(np.arange(1000.0)))
        with pyckpt.CheckpointManager(ck, directory, max_to_keep=2, **kw) as m:
            m.restore_or_initialize()
            m.save()
            m.save(blocking=False)
            m.wait_until_finished()
    return run


def test_no_round_leaves_cycles(saved, tmp_path):
    into = {"a": np.zeros(100_000), "b": [np.zeros(10), {"c": np.zeros(5)}]}
    counter = iter(range(1000))
    cases = {
        "load": lambda: pyckpt.load(saved),
        "load mmap": lambda: pyckpt.load(saved, mmap=True),
        "load into": lambda: pyckpt.load(saved, into=into, select=["a", "b"]),
        "reader": lambda: pyckpt.load_checkpoint(saved).get_tensor("a"),
        "save": lambda: pyckpt.save(TREE, str(tmp_path / f"s{next(counter)}")),
        "save async": lambda: pyckpt.save(TREE, str(tmp_path / f"s{next(counter)}"),
                                          blocking=False).wait(),
        "copy": lambda: copy_checkpoint(saved, str(tmp_path / f"cp{next(counter)}")),
        "manager": _manager(str(tmp_path / "run")),
        "incremental manager": _manager(str(tmp_path / "inc"), incremental=True),
        "restore": lambda: pyckpt.Checkpoint(w=pyckpt.Variable(np.zeros(1000))).restore(
            str(tmp_path / "run")),
    }
    leftovers = {name: _cyclic_garbage(fn) for name, fn in cases.items()}
    assert leftovers == {name: [] for name in cases}
