"""A store written against the Store interface alone (the abstract primitives,
no engine hooks) saves, loads and verifies through the generic hooks."""

import contextlib
import io
from typing import Iterable, Sequence

import numpy as np
import pytest

import pyckpt
from pyckpt.engine.reader import OpenCheckpoint
from pyckpt.engine.writer import save_tensors
from pyckpt.storage.base import Store
from pyckpt.testing.store_suite import StoreSuite


class DictStore(Store):
    """Objects in a dict; an object appears when its writer closes cleanly."""

    protocol = "dict"

    def __init__(self):
        self.objects: dict[str, bytes] = {}

    def join(self, *parts):
        return "/".join(p.strip("/") for p in parts if p)

    def exists(self, path):
        return path in self.objects or self.isdir(path)

    def isdir(self, path):
        return any(k.startswith(path.rstrip("/") + "/") for k in self.objects)

    def listdir(self, path):
        base = path.rstrip("/") + "/"
        return sorted({k[len(base):].split("/")[0] for k in self.objects if k.startswith(base)})

    def size(self, path):
        if path not in self.objects:
            raise FileNotFoundError(path)
        return len(self.objects[path])

    def read_bytes(self, path):
        if path not in self.objects:
            raise FileNotFoundError(path)
        return self.objects[path]

    def read_ranges(self, path, ranges: Sequence[tuple[int, int]]):
        data = self.read_bytes(path)
        return [data[s:e] for s, e in ranges]

    def makedirs(self, path):
        pass

    def write_atomic(self, path, data):
        self.objects[path] = bytes(data)

    @contextlib.contextmanager
    def open_write(self, path):
        buf = io.BytesIO()
        yield buf
        self.objects[path] = buf.getvalue()

    def delete(self, paths: Iterable[str]):
        for p in list(paths):
            self.objects.pop(p, None)

    def rmtree(self, path):
        for k in [k for k in self.objects if k.startswith(path.rstrip("/") + "/")]:
            del self.objects[k]


class TestDictStoreSuite(StoreSuite):
    @pytest.fixture
    def store_root(self):
        return DictStore(), "root"


def test_generic_hooks_save_load_and_verify():
    store = DictStore()
    rng = np.random.default_rng(0)
    arrays = {"a": rng.standard_normal((300, 300)), "b": np.arange(10), "t": np.ones((4, 3)).T}
    save_tensors(store, "ck", list(arrays.items()))
    ck = OpenCheckpoint.open(store, "ck")
    out = ck.read_new(range(len(ck.manifest.keys)))
    for k, v in zip(ck.manifest.keys, out):
        np.testing.assert_array_equal(v, arrays[k])
    ck.verify()
    name = next(k for k in store.objects if "data-" in k)
    data = bytearray(store.objects[name])
    data[1000] ^= 1
    store.objects[name] = bytes(data)
    with pytest.raises(pyckpt.CorruptCheckpointError, match="dict://ck/data-"):
        OpenCheckpoint.open(store, "ck").verify()
