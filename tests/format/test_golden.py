"""Checkpoints written by format version 1 keep loading, bit for bit."""

import importlib.util
import pathlib

import numpy as np

import pyckpt
from pyckpt import _reference_reader

HERE = pathlib.Path(__file__).parent
GOLDEN = HERE / "golden" / "v1"


def _expected():
    spec = importlib.util.spec_from_file_location("make_golden", HERE / "make_golden.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod.golden_tree()


def _same(a, b):
    if isinstance(a, dict):
        assert isinstance(b, dict) and list(a) == list(b)
        for k in a:
            _same(a[k], b[k])
    elif isinstance(a, (list, tuple)):
        assert type(a) is type(b) and len(a) == len(b)
        for x, y in zip(a, b):
            _same(x, y)
    elif isinstance(a, np.ndarray):
        assert a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes()
    else:
        assert type(a) is type(b) and a == b


def test_golden_v1_loads_exactly():
    _same(_expected(), pyckpt.load(GOLDEN))
    r = pyckpt.load_checkpoint(GOLDEN)
    r.verify()
    assert r.metadata == {"purpose": "golden"}


def test_golden_v1_reference_reader_agrees():
    ref = _reference_reader.read_all(str(GOLDEN))
    got = pyckpt.load(GOLDEN, select=["params", "text", "c"])
    np.testing.assert_array_equal(ref["params/w"], got["params"]["w"])
    np.testing.assert_array_equal(ref["text"], got["text"])
    np.testing.assert_array_equal(ref["c"], got["c"])
