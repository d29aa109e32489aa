"""Storage knows bytes, not checkpoints (issue 11): stores get typed byte-range
requests (``fetch``) and byte producers (``write_files``), the engine computes and
verifies every checksum, and the C++ fast path is a capability of the store
(``native_path``), not a flag callers branch on."""

import ast
import json
import os
import pathlib

import numpy as np
import pytest

import pyckpt
from pyckpt.engine.reader import OpenCheckpoint
from pyckpt.engine.writer import save_tensors
from pyckpt.storage import ByteRange, LeftoverUploads, LocalStore, NewFile, Store

STORAGE = pathlib.Path(pyckpt.__file__).parent / "storage"


class BytesOnlyStore(LocalStore):
    """A local directory reached through the Store methods only: no native paths, so
    every read is a ``fetch`` and every data write a ``write_files``."""

    def __init__(self):
        self.fetched: list[list] = []
        self.written: list[list] = []
        self.leftovers: list = []

    def native_path(self, path):
        return None

    def fetch(self, ranges, into=None):
        self.fetched.append(list(ranges))
        return super().fetch(ranges, into)

    def write_files(self, files, *, leftovers=None):
        self.written.append(list(files))
        self.leftovers.append(leftovers)
        super().write_files(files, leftovers=leftovers)


class NativeOnlyStore(LocalStore):
    """A local store whose byte-level bulk methods fail: the engine must take the
    native path (the C++ core opens the files itself) for every bulk read and write."""

    def fetch(self, ranges, into=None):
        raise AssertionError("fetch used although the store has native paths")

    def write_files(self, files, *, leftovers=None):
        raise AssertionError("write_files used although the store has native paths")


def _arrays(rng):
    return {"a": rng.standard_normal((300, 500)), "b": np.arange(10, dtype=np.int32),
            "t": np.ones((40, 3)).T, "z": np.zeros((0, 4))}


def test_reads_reach_the_store_as_byte_ranges(tmp_path, rng):
    store = BytesOnlyStore()
    arrays = _arrays(rng)
    path = str(tmp_path / "ck")
    save_tensors(store, path, list(arrays.items()))
    ck = OpenCheckpoint.open(store, path)
    out = ck.read_new(range(len(ck.keys)))
    for k, v in zip(ck.keys, out):
        np.testing.assert_array_equal(v, arrays[k])
    ranges = [r for call in store.fetched for r in call]
    assert ranges and all(type(r) is ByteRange for r in ranges)
    for r in ranges:
        assert r.path.startswith(path + os.sep) and os.path.basename(r.path).startswith("data-")
        assert isinstance(r.start, int) and isinstance(r.end, int) and 0 <= r.start < r.end
    ck.verify()


def test_writes_reach_the_store_as_byte_producers(tmp_path, rng):
    store = BytesOnlyStore()
    path = str(tmp_path / "ck")
    manifest = save_tensors(store, path, list(_arrays(rng).items()))
    (files,) = store.written
    assert files and all(type(f) is NewFile for f in files)
    assert sorted(os.path.basename(f.path) for f in files) == sorted(f.name for f in manifest.files)
    for f in files:
        with open(f.path, "rb") as fh:
            data = fh.read()
        assert f.size == len(data)
        assert bytes(f.fill(0, bytearray(f.size))) == data   # any range, any number of times
        assert bytes(f.fill(7, bytearray(100))) == data[7:107]
    (left,) = store.leftovers
    attempt = manifest.info["attempt"]
    assert isinstance(left, LeftoverUploads) and left.prefix == path and left.current == attempt
    assert left.owner(manifest.files[0].name) == attempt
    assert left.owner("data-000000000000-00000-0000.bin") == "000000000000"
    assert left.owner("pyckpt.index") is None and left.owner("notes.txt") is None
    assert left.is_live("0123456789ab") is False   # no marker: that attempt has ended


def test_checksums_are_verified_for_stores_without_native_paths(tmp_path, rng):
    store = BytesOnlyStore()
    path = str(tmp_path / "ck")
    save_tensors(store, path, list(_arrays(rng).items()))
    name = next(n for n in os.listdir(path) if n.startswith("data-"))
    with open(os.path.join(path, name), "r+b") as fh:
        fh.seek(1000)
        byte = fh.read(1)
        fh.seek(1000)
        fh.write(bytes([byte[0] ^ 1]))
    with pytest.raises(pyckpt.CorruptCheckpointError, match=name):
        OpenCheckpoint.open(store, path).verify()


def test_a_short_answer_of_the_store_is_corruption(tmp_path, rng):
    class Truncating(BytesOnlyStore):
        def fetch(self, ranges, into=None):
            return [data[:-1] for data in super().fetch(ranges, into)]

    store = Truncating()
    path = str(tmp_path / "ck")
    save_tensors(store, path, [("a", rng.standard_normal(1000))])
    with pytest.raises(pyckpt.CorruptCheckpointError, match="returned 7999 bytes"):
        OpenCheckpoint.open(store, path).read_new([0])


def test_native_paths_are_the_fast_path(tmp_path, rng):
    store = NativeOnlyStore()
    arrays = _arrays(rng)
    path = str(tmp_path / "ck")
    save_tensors(store, path, list(arrays.items()))
    ck = OpenCheckpoint.open(store, path)
    for k, v in zip(ck.keys, ck.read_new(range(len(ck.keys)))):
        np.testing.assert_array_equal(v, arrays[k])
    mapped = ck.read_new([ck.index["a"]], mmap=True)[0]
    assert not mapped.flags.writeable and not mapped.flags.owndata
    np.testing.assert_array_equal(mapped, arrays["a"])
    ck.verify()


def test_mmap_without_native_paths_reads_new_arrays(tmp_path, rng):
    store = BytesOnlyStore()
    path = str(tmp_path / "ck")
    save_tensors(store, path, [("a", np.arange(100.0))])
    (arr,) = OpenCheckpoint.open(store, path).read_new([0], mmap=True)
    assert arr.flags.writeable   # a copy: there is no local file to map
    np.testing.assert_array_equal(arr, np.arange(100.0))
    assert store.fetched


def test_the_legacy_local_flag_declares_native_paths():
    class Flagged(LocalStore):
        native_path = Store.native_path   # the default, which honours ``local``

    store = Flagged()
    assert store.native_path("/x/y") == "/x/y"
    store.local = False
    assert store.native_path("/x/y") is None


def test_new_file_parts_cover_the_file():
    f = NewFile("p", 10, lambda b, buf: buf)
    assert f.parts(4) == [(0, 4), (4, 8), (8, 10)]
    assert NewFile("p", 0, lambda b, buf: buf).parts(4) == [(0, 0)]


def _imports(path: pathlib.Path) -> list[str]:
    out = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            base = "pyckpt.storage" if node.level == 1 else "pyckpt" if node.level == 2 else ""
            mod = f"{base}.{node.module}" if base and node.module else base or node.module or ""
            out.append(mod)
            out.extend(f"{mod}.{a.name}" for a in node.names)
        elif isinstance(node, ast.Import):
            out.extend(a.name for a in node.names)
    return out


def test_storage_imports_nothing_of_the_engine():
    for p in sorted(STORAGE.glob("*.py")):
        bad = [m for m in _imports(p) if m.startswith("pyckpt.engine") or m == "pyckpt._core"
               or m.startswith("pyckpt.format")]
        assert not bad, f"{p.name} imports {bad}"


def test_storage_modules_are_small():
    for p in sorted(STORAGE.glob("*.py")):
        n = len(p.read_text().splitlines())
        assert n <= 500, f"{p.name} has {n} lines"


def test_remote_checkpoint_round_trip_through_fetch(rng):
    url = f"memory://pyckpt-tests/iface-{os.getpid()}-{rng.integers(1 << 30)}"
    arrays = _arrays(rng)
    pyckpt.save(arrays, url)
    back = pyckpt.load(url)
    for k, v in arrays.items():
        np.testing.assert_array_equal(back[k], v)
    reader = pyckpt.load_checkpoint(url)
    reader.verify()
    assert json.loads(json.dumps(reader.get_variable_to_shape_map()))
