"""No reference cycle holds a checkpoint's buffers (issue 28, item 1): with the cyclic
collector off, what a load returns is freed as soon as it is dropped, and no save,
load, restore, copy or manager round leaves pyckpt objects, pyckpt functions or
arrays reachable only through a cycle (gc.DEBUG_SAVEALL)."""

import gc
import json
import pathlib
import subprocess
import sys
import weakref

import numpy as np
import pytest

import pyckpt

HERE = pathlib.Path(__file__).parent

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


def test_no_round_leaves_cycles(tmp_path):
    # a fresh interpreter: a thread left running by another test could add its own
    # garbage to the census while the collector is off
    out = subprocess.run([sys.executable, str(HERE / "cycle_census.py"), str(tmp_path)],
                         cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert got["leftovers"] == {name: [] for name in got["leftovers"]}
    assert len(got["leftovers"]) == 10
