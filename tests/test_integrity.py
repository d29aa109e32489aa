"""Bad input never returns wrong values silently, never crashes or hangs, and
errors name the key, file and byte range (API.md section 7, issue 2)."""

import json
import os
import struct
import time

import numpy as np
import pytest

import pyckpt
from pyckpt import _core
from pyckpt.format import decode_index

CORRUPT = pyckpt.CorruptCheckpointError


@pytest.fixture
def small_ckpt(ckpt_dir):
    tree = {"a": np.arange(100, dtype=np.int32), "b": np.linspace(0, 1, 33),
            "c": np.array(7, dtype=np.uint8), "e": np.zeros((0, 2))}
    pyckpt.save(tree, ckpt_dir)
    return ckpt_dir, tree


def _ranges(path):
    """(key, file name, begin, end) of every stored tensor, from the index."""
    r = pyckpt.load_checkpoint(path)
    m = r._ck.manifest
    return [(k, m.files[t.blocks[0].file].name, t.blocks[0].offset,
             t.blocks[0].offset + t.blocks[0].nbytes)
            for k, t in m.tensors.items() if t.blocks[0].nbytes]


def test_every_single_bit_flip_in_data_is_detected(small_ckpt, flip):
    path, tree = small_ckpt
    ranges = _ranges(path)
    (fname,) = {r[1] for r in ranges}
    fpath = os.path.join(path, fname)
    size = os.path.getsize(fpath)
    for pos in range(size):
        owner = [r for r in ranges if r[2] <= pos < r[3]]
        flip(fpath, pos, 1 << (pos % 8))
        try:
            if owner:
                key = owner[0][0]
                with pytest.raises(CORRUPT) as ei:
                    pyckpt.load(path)
                msg = str(ei.value)
                assert repr(key) in msg and fname in msg and "bytes [" in msg
                with pytest.raises(CORRUPT):
                    pyckpt.load_checkpoint(path).verify()
            else:  # alignment padding: no value depends on it
                out = pyckpt.load(path)
                np.testing.assert_array_equal(out["a"], tree["a"])
        finally:
            flip(fpath, pos, 1 << (pos % 8))
    pyckpt.load_checkpoint(path).verify()


def test_every_byte_of_the_index_is_protected(small_ckpt, flip):
    path, _ = small_ckpt
    index = os.path.join(path, "pyckpt.index")
    for pos in range(os.path.getsize(index)):
        flip(index, pos, 0x04)
        try:
            with pytest.raises(CORRUPT, match="index file"):
                pyckpt.load(path)
        finally:
            flip(index, pos, 0x04)


def test_get_tensor_reads_only_its_own_bytes(small_ckpt, flip):
    path, tree = small_ckpt
    key, fname, begin, _ = next(r for r in _ranges(path) if r[0] == "a")
    flip(os.path.join(path, fname), begin + 3)
    reader = pyckpt.load_checkpoint(path)
    np.testing.assert_array_equal(reader.get_tensor("b"), tree["b"])  # untouched tensor reads
    with pytest.raises(CORRUPT, match="'a'"):
        reader.get_tensor("a")


@pytest.mark.parametrize("cut", [0, 1, 17, -1])
def test_truncated_data_file(small_ckpt, cut):
    path, _ = small_ckpt
    (fname,) = {r[1] for r in _ranges(path)}
    fpath = os.path.join(path, fname)
    size = os.path.getsize(fpath)
    os.truncate(fpath, cut if cut >= 0 else size + cut)
    with pytest.raises(CORRUPT) as ei:
        pyckpt.load(path)
    assert fname in str(ei.value) and "bytes [" in str(ei.value)
    with pytest.raises(CORRUPT):
        pyckpt.load_checkpoint(path).verify()


def test_truncated_index(small_ckpt):
    path, _ = small_ckpt
    index = os.path.join(path, "pyckpt.index")
    data = open(index, "rb").read()
    for cut in (0, 5, 31, 32, len(data) // 2, len(data) - 1):
        with open(index, "wb") as f:
            f.write(data[:cut])
        with pytest.raises(CORRUPT, match="index file"):
            pyckpt.load(path)


def test_missing_data_file(small_ckpt):
    path, _ = small_ckpt
    (fname,) = {r[1] for r in _ranges(path)}
    os.remove(os.path.join(path, fname))
    with pytest.raises(CORRUPT, match=fname):
        pyckpt.load(path)


def test_uncommitted_and_missing_checkpoints(tmp_path, small_ckpt):
    path, _ = small_ckpt
    os.remove(os.path.join(path, "pyckpt.index"))
    with pytest.raises(pyckpt.CheckpointNotFoundError, match="never committed"):
        pyckpt.load(path)
    with pytest.raises(FileNotFoundError):
        pyckpt.load_checkpoint(tmp_path / "nothing-here")
    assert pyckpt.latest_checkpoint(tmp_path) is None


@pytest.mark.parametrize("seed", range(20))
def test_garbage_index_bytes(tmp_path, seed):
    rng = np.random.default_rng(seed)
    data = rng.integers(0, 256, int(rng.integers(0, 4000)), dtype=np.uint8).tobytes()
    if seed % 2:  # a valid magic, then garbage
        data = b"PYCKPTIX" + data
    with pytest.raises(CORRUPT):
        decode_index(data, "garbage")


# -- hostile manifests inside a valid frame ----------------------------------------

def _frame(doc) -> bytes:
    body = json.dumps(doc).encode() if not isinstance(doc, bytes) else doc
    head = struct.pack("<8sIIQI", b"PYCKPTIX", 1, 0, len(body),
                       _core.crc32c_mask(_core.crc32c(body)))
    return head + struct.pack("<I", _core.crc32c_mask(_core.crc32c(head))) + body + b"PYCKEND\n"


def _doc(tensors, files=None, chunk=1 << 20):
    """A manifest document (docs/FORMAT.md) from {key: _t(...)} entries."""
    cols = {"key": [], "dtype": [], "shape": []}
    blocks = {"file": [], "offset": [], "nbytes": []}
    crcs = []
    if isinstance(tensors, dict) and not isinstance(tensors.get("key"), list):
        for key, t in tensors.items():
            cols["key"].append(key)
            cols["dtype"].append(t["dtype"])
            cols["shape"].append(t["shape"])
            for name in ("file", "offset", "nbytes"):
                blocks[name].append(t[name])
            crcs.extend(t["crcs"])
            if "box" in t:
                blocks.setdefault("box", []).append(t["box"])
    else:
        cols = tensors
    return {"format": "pyckpt", "version": 1, "chunk_size": chunk,
            "files": files if files is not None else [{"name": "data-x.bin", "size": 1 << 20}],
            "tensors": cols, "blocks": blocks, "crc32c": crcs, "tree": None, "graph": None,
            "metadata": {}}


def _t(dtype="float32", shape=(4,), file=0, offset=0, nbytes=16, crcs=(0,), **extra):
    return {"dtype": dtype, "shape": list(shape), "file": file, "offset": offset,
            "nbytes": nbytes, "crcs": list(crcs), **extra}


HOSTILE = {
    "huge shape": _doc({"x": _t(shape=(2**40, 2**40), nbytes=2**82)}),
    "huge shape, small nbytes": _doc({"x": _t(shape=(2**40, 2**40), nbytes=16)}),
    "nbytes mismatch": _doc({"x": _t(nbytes=17)}),
    "negative offset": _doc({"x": _t(offset=-16)}),
    "offset past file": _doc({"x": _t(offset=(1 << 20) - 8)}),
    "overflowing offset": _doc({"x": _t(offset=2**64 - 8)}),
    "file index out of range": _doc({"x": _t(file=3)}),
    "negative file index": _doc({"x": _t(file=-1)}),
    "overlap": _doc({"x": _t(offset=0), "y": _t(offset=8)}),
    "too few crcs": _doc({"x": _t(crcs=())}),
    "crc out of range": _doc({"x": _t(crcs=(2**32,))}),
    "unknown dtype": _doc({"x": _t(dtype="float128")}),
    "object dtype": _doc({"x": _t(dtype="O")}),
    "negative dim": _doc({"x": _t(shape=(-4,))}),
    "float dim": _doc({"x": _t(shape=(4.0,))}),
    "too many dims": _doc({"x": _t(shape=(1,) * 65, nbytes=4)}),
    "path file name": _doc({"x": _t()}, files=[{"name": "../../etc/passwd", "size": 99}]),
    "absolute file name": _doc({"x": _t()}, files=[{"name": "/etc/passwd", "size": 99}]),
    "dot file name": _doc({"x": _t()}, files=[{"name": "..", "size": 99}]),
    "key with ..": _doc({"a/../b": _t()}),
    "absolute key": _doc({"/abs": _t()}),
    "zero chunk": _doc({"x": _t()}, chunk=0),
    "huge file size": _doc({"x": _t()}, files=[{"name": "d.bin", "size": 2**70}]),
    "tensors not columns": _doc([]),
    "columns differ in length": _doc({"key": ["a", "b"], "dtype": ["int8"], "shape": [[1]]}),
    "duplicate key": _doc({"key": ["a", "a"], "dtype": ["int8"] * 2, "shape": [[1]] * 2}),
    "blocks missing": {**_doc({"x": _t()}), "blocks": None},
    "too many crcs": {**_doc({"x": _t()}), "crc32c": [0, 0]},
    "string offset": _doc({"x": _t(offset="0")}),
    "float nbytes": _doc({"x": _t(nbytes=16.0)}),
    "bool file": _doc({"x": _t(file=True)}),
    "block out of box": _doc({"x": _t(box=[[2], [4]])}),
    "overlapping boxes": {**_doc({"x": _t(shape=(4,), nbytes=8, box=[[0], [2]]),
                                  }), "tensors": {"key": ["x"], "dtype": ["float32"],
                                                  "shape": [[4]], "nblocks": [2]},
                          "blocks": {"file": [0, 0], "offset": [0, 64], "nbytes": [8, 8],
                                     "box": [[[0], [2]], [[1], [2]]]}, "crc32c": [0, 0]},
    "gap in boxes": {**_doc({}), "tensors": {"key": ["x"], "dtype": ["float32"],
                                             "shape": [[4]], "nblocks": [2]},
                     "blocks": {"file": [0, 0], "offset": [0, 64], "nbytes": [4, 4],
                                "box": [[[0], [1]], [[3], [1]]]}, "crc32c": [0, 0]},
    "newer version": {**_doc({}), "version": 99},
    "not pyckpt": {"format": "other"},
    "deep nesting": b"[" * 100000 + b"]" * 100000,
    "not utf8": b"\xff\xfe{}",
}


@pytest.mark.parametrize("name", sorted(HOSTILE))
def test_hostile_manifest_is_rejected(name):
    t = time.perf_counter()
    with pytest.raises(CORRUPT) as ei:
        decode_index(_frame(HOSTILE[name]), "hostile.index")
    assert "hostile.index" in str(ei.value)
    assert time.perf_counter() - t < 5


def test_lying_file_size_fails_before_allocating(ckpt_dir):
    """A manifest that promises a 128 TiB tensor in a tiny file must not allocate it."""
    os.makedirs(ckpt_dir)
    n = 2**47
    doc = _doc({"x": _t(dtype="uint8", shape=(n,), nbytes=n, crcs=[0] * (n >> 31))},
               files=[{"name": "data-x.bin", "size": n}], chunk=1 << 31)
    with open(os.path.join(ckpt_dir, "data-x.bin"), "wb") as f:
        f.write(b"\0" * 64)
    with open(os.path.join(ckpt_dir, "pyckpt.index"), "wb") as f:
        f.write(_frame(doc))
    with pytest.raises(CORRUPT, match=r"data-x\.bin.*64 bytes"):
        pyckpt.load(ckpt_dir)


# -- keys are not paths ------------------------------------------------------------------

@pytest.mark.parametrize("key", ["../../x", "/abs", "a//b", ".", "..", "a/./b", "a/", ""])
def test_path_like_keys_are_rejected(tmp_path, key):
    target = tmp_path / "inner" / "ckpt"
    with pytest.raises(ValueError):
        pyckpt.save({key: np.ones(2)}, target)
    with pytest.raises(ValueError):
        pyckpt.save({"a": {key: np.ones(2)}}, target)
    leftovers = [p for p in tmp_path.rglob("*") if p.is_file()]
    assert leftovers == []


def test_keys_never_become_file_names(ckpt_dir):
    pyckpt.save({"x/y/z": np.ones(3), "evil name;rm -rf": np.ones(1)}, ckpt_dir)
    names = os.listdir(ckpt_dir)
    assert all(n == "pyckpt.index" or n.startswith("data-") for n in names)
    assert not os.path.exists(os.path.join(ckpt_dir, "x"))


# -- failures during a save lose nothing ---------------------------------------------------

def test_failed_write_keeps_previous_checkpoint(ckpt_dir, monkeypatch):
    from pyckpt.engine import writer

    pyckpt.save({"x": np.arange(5)}, ckpt_dir)
    before = set(os.listdir(ckpt_dir))
    real = writer._core.write_shards

    def failing(*args, **kwargs):
        real(*args, **kwargs)  # the data files exist...
        raise OSError(28, "No space left on device")  # ...then the disk fills up

    monkeypatch.setattr(writer._core, "write_shards", failing)
    with pytest.raises(OSError, match="No space"):
        pyckpt.save({"x": np.arange(6)}, ckpt_dir)
    assert set(os.listdir(ckpt_dir)) == before
    np.testing.assert_array_equal(pyckpt.load(ckpt_dir)["x"], np.arange(5))


def test_failed_commit_keeps_previous_checkpoint(ckpt_dir, monkeypatch):
    from pyckpt.storage.local import LocalStore

    pyckpt.save({"x": np.arange(5)}, ckpt_dir)
    before = set(os.listdir(ckpt_dir))

    def failing(self, path, data):
        raise OSError(5, "I/O error")

    monkeypatch.setattr(LocalStore, "write_atomic", failing)
    with pytest.raises(OSError):
        pyckpt.save({"x": np.arange(6)}, ckpt_dir)
    assert set(os.listdir(ckpt_dir)) == before
    np.testing.assert_array_equal(pyckpt.load(ckpt_dir)["x"], np.arange(5))


def test_unsupported_values_fail_before_writing(tmp_path):
    target = tmp_path / "c"
    with pytest.raises(TypeError, match="object"):
        pyckpt.save({"ok": np.ones(3), "bad": np.array([object()])}, target)
    with pytest.raises(TypeError, match="set"):
        pyckpt.save({"ok": np.ones(3), "bad": {1, 2}}, target)
    assert not target.exists() or not any(target.iterdir())
