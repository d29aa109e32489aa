"""Hostile safetensors files (issue 37, items 6, 7, 9): tensors on the same bytes
(a small file loading as a huge one), gaps, headers nested too deep, names
the format cannot hold. pyckpt accepts a file exactly when the safetensors
library does, and never writes one the library refuses."""

import json
import struct
import time
import warnings

import numpy as np
import pytest

import pyckpt
from pyckpt.cli import main
from pyckpt.errors import CorruptCheckpointError
from pyckpt.format.json_scan import MAX_UNTRUSTED_DEPTH, loads_untrusted, nesting_depth
from pyckpt.interop import safetensors as st
from pyckpt.testing.requirements import require

safetensors_numpy = require("safetensors.numpy")


def _write(path, header, data=b"", raw_header=None):
    body = raw_header if raw_header is not None else json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(body)) + body + data)
    return str(path)


def _u8(begin, end):
    return {"dtype": "U8", "shape": [end - begin], "data_offsets": [begin, end]}


def _library_accepts(path):
    try:
        safetensors_numpy.load_file(path)
    except Exception:  # noqa: BLE001 - the library's own error types
        return False
    return True


def test_tensors_on_the_same_bytes_are_refused_naming_both(tmp_path):
    size = 4 << 20  # 20 tensors on one 4 MiB span: an 80 MiB load from a 4 MiB file
    path = _write(tmp_path / "amp.safetensors", {f"t{i}": _u8(0, size) for i in range(20)},
                  bytes(size))
    with pytest.raises(CorruptCheckpointError) as e:
        pyckpt.load(path)
    msg = str(e.value)
    assert path in msg and "overlaps" in msg and "'t0'" in msg and "'t1'" in msg
    header_end = 8 + len(json.dumps({f"t{i}": _u8(0, size) for i in range(20)}))
    assert f"[{header_end}, {header_end + size})" in msg  # the byte ranges, in the file
    assert not _library_accepts(path)


CASES = {  # header (tensor -> [begin, end) as U8 bytes), data length
    "tiled": ({"a": (0, 4), "b": (4, 8)}, 8),
    "tiled, listed out of order": ({"b": (4, 8), "a": (0, 4)}, 8),
    "empty tensors share an offset": ({"a": (0, 4), "z": (4, 4), "y": (4, 4), "b": (4, 8)}, 8),
    "no tensors, no data": ({}, 0),
    "partial overlap": ({"a": (0, 6), "b": (4, 8)}, 8),
    "contained": ({"a": (0, 8), "b": (2, 4)}, 8),
    "gap between": ({"a": (0, 2), "b": (4, 8)}, 8),
    "gap first": ({"a": (2, 8)}, 8),
    "bytes left at the end": ({"a": (0, 4)}, 8),
    "no tensors, bytes left": ({}, 4),
    "empty tensor inside another": ({"a": (0, 8), "z": (4, 4)}, 8),
}


@pytest.mark.parametrize("case", CASES)
def test_valid_exactly_when_the_safetensors_library_says_so(tmp_path, case):
    spans, n = CASES[case]
    path = _write(tmp_path / "c.safetensors", {k: _u8(*s) for k, s in spans.items()},
                  bytes(range(n)))
    library = _library_accepts(path)
    try:
        out = pyckpt.load(path)
    except CorruptCheckpointError as e:
        assert not library, f"{case}: the library reads it, pyckpt refused: {e}"
        assert path in str(e) and "bytes [" in str(e)
    else:
        assert library, f"{case}: the library refuses it, pyckpt read it"
        assert sum(v.nbytes for v in out.values()) <= n  # output bounded by input
        for k, (b, e) in spans.items():
            assert out[k].tobytes() == bytes(range(n))[b:e]


def test_a_deeply_nested_header_is_corrupt_not_a_recursion_error(tmp_path):
    deep = b'{"a":' + b"[" * 200_000 + b"]" * 200_000 + b"}"
    path = _write(tmp_path / "deep.safetensors", None, raw_header=deep)
    t0 = time.process_time()
    with pytest.raises(CorruptCheckpointError, match="nested 200001 levels deep") as e:
        pyckpt.load(path)
    assert path in str(e.value) and time.process_time() - t0 < 5


def test_a_name_given_twice_in_the_header_is_refused(tmp_path):
    raw = b'{"a":' + json.dumps(_u8(0, 4)).encode() + b',"a":' + json.dumps(_u8(4, 8)).encode() + b"}"
    path = _write(tmp_path / "dup.safetensors", None, bytes(8), raw_header=raw)
    with pytest.raises(CorruptCheckpointError, match="'a' appears twice"):
        pyckpt.load(path)


def test_a_name_that_is_not_utf8_is_corrupt(tmp_path):
    raw = b'{"a\\udc80":' + json.dumps(_u8(0, 4)).encode() + b"}"  # a lone surrogate escape
    path = _write(tmp_path / "s.safetensors", None, bytes(4), raw_header=raw)
    with pytest.raises(CorruptCheckpointError) as e:
        pyckpt.load(path)
    assert "'a\\udc80'" in str(e.value) and path in str(e.value)
    assert not _library_accepts(path)


def test_a_tensor_named_metadata_is_refused_before_anything_is_written(tmp_path, capsys):
    pyckpt.save({"__metadata__": np.arange(3), "x": np.ones(2)}, tmp_path / "ck")
    dst = tmp_path / "out.safetensors"
    with pytest.raises(ValueError, match="'__metadata__'"):
        st.from_checkpoint(tmp_path / "ck", str(dst))
    assert not dst.exists()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        code = main(["cp", str(tmp_path / "ck"), str(dst)])
    err = capsys.readouterr().err
    assert code == 1 and "'__metadata__'" in err and "Traceback" not in err
    assert not dst.exists()
    # renamed away, it is written, and the library reads the file
    pyckpt.save({"meta": np.arange(3)}, tmp_path / "ck2")
    folder = tmp_path / "hf"
    with pytest.raises(ValueError, match="'__metadata__'"):
        st.export_hf(tmp_path / "ck2", folder, key_map={"meta": "__metadata__"})
    assert not folder.exists() or not list(folder.iterdir())


def test_an_exported_file_is_read_by_the_library(tmp_path):
    pyckpt.save({"a": np.arange(3.0), "b": np.zeros((2, 2), np.float32)}, tmp_path / "ck")
    dst = str(tmp_path / "out.safetensors")
    st.from_checkpoint(tmp_path / "ck", dst)
    assert set(safetensors_numpy.load_file(dst)) == {"a", "b"}


@pytest.mark.parametrize("text, depth", [
    (b"{}", 1), (b"[]", 1), (b"1", 0), (b'{"a":[1,[2,{"b":3}]]}', 4),
    (b'{"[[[[":"]]]]{{"}', 1), (b'{"a\\"[[[":"\\\\"}', 1), (b'["\\\\\\"[["]', 1),
])
def test_nesting_depth_skips_strings(text, depth):
    assert nesting_depth(text) == depth
    assert json.loads(text) == loads_untrusted(text)


def test_untrusted_json_is_refused_in_linear_time():
    ok = b"[" * MAX_UNTRUSTED_DEPTH + b"]" * MAX_UNTRUSTED_DEPTH
    assert loads_untrusted(ok) is not None
    for hostile in (b"[" * (MAX_UNTRUSTED_DEPTH + 1) + b"]" * (MAX_UNTRUSTED_DEPTH + 1),
                    b"[" * 5_000_000, b'{"a' + b'\\"' * 2_000_000,  # unterminated, escapes
                    b'["' + b'\\' * 4_000_001, b'"' * 3_000_001, b"\xff[[[]]]"):
        t0 = time.process_time()
        with pytest.raises(ValueError):
            loads_untrusted(hostile)
        assert time.process_time() - t0 < 5
