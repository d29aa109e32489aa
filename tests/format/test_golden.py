"""Checkpoints written by format version 1 keep loading, bit for bit."""

import importlib.util
import pathlib

import numpy as np
import pytest

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


GOLDEN_V2 = HERE / "golden" / "v2"


def _golden_v2_values(step):
    spec = importlib.util.spec_from_file_location("make_golden_v2", HERE / "make_golden_v2.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod.golden_values(step)


def test_golden_v2_references_load_exactly():
    """ckpt-2 references ckpt-1's data file (format version 2): every reader follows it."""
    from pyckpt.engine.reader import open_checkpoint
    for step in (1, 2):
        path = GOLDEN_V2 / f"ckpt-{step}"
        r = pyckpt.load_checkpoint(path)
        r.verify()
        ref = _reference_reader.read_all(str(path))
        for k, want in _golden_v2_values(step).items():
            key = next(x for x in r.keys() if x.startswith(k + "/"))
            got = r.get_tensor(key)
            assert got.dtype == want.dtype and got.tobytes() == want.tobytes(), (step, k)
            assert ref[key].tobytes() == want.tobytes()
    m1 = open_checkpoint(GOLDEN_V2 / "ckpt-1").manifest
    m2 = open_checkpoint(GOLDEN_V2 / "ckpt-2").manifest
    assert m1.version == 1 and m1.blocks.hashes is not None
    assert m2.version == 2 and [f.at for f in m2.files] == [None, "ckpt-1"]
    assert (GOLDEN_V2 / "ckpt-2" / "pyckpt.index").read_bytes()[8:12] == b"\x02\x00\x00\x00"


def test_golden_v2_is_refused_by_a_reader_of_version_1(monkeypatch):
    """The gate a pyckpt that predates references applies (checked against that
    release's code when this golden file was made): version 2 is refused, never misread."""
    from pyckpt.format import index
    monkeypatch.setattr(index, "SUPPORTED_VERSION", 1)
    with pytest.raises(pyckpt.CorruptCheckpointError, match="format version 2 is newer"):
        pyckpt.load(GOLDEN_V2 / "ckpt-2")
    assert sorted(pyckpt.load(GOLDEN_V2 / "ckpt-1")) == ["frozen", "head", "ids",
                                                         "save_counter"]
