"""Conformance tests every pyckpt storage backend passes.

A backend's test module subclasses :class:`StoreSuite` (or
:class:`ResolvableStoreSuite` when the store is reached by URL) and provides a
``store_root`` fixture returning ``(store, root)``: a Store and an empty
directory-like prefix in it that the tests may fill::

    class TestMemoryStore(StoreSuite):
        @pytest.fixture
        def store_root(self):
            return pyckpt.storage.resolve("memory://suite/" + uuid4().hex)
"""

from __future__ import annotations

import pytest

from pyckpt.storage import resolve


class StoreSuite:
    """The conformance tests of every Store; a subclass provides the ``store_root``
    fixture (module doc)."""

    def test_write_atomic_then_read(self, store_root):
        """write_atomic creates, then replaces, an object that exists, read_bytes and size see."""
        store, root = store_root
        path = store.join(root, "a", "obj")
        store.makedirs(store.join(root, "a"))
        store.write_atomic(path, b"hello world")
        assert store.exists(path)
        assert store.read_bytes(path) == b"hello world"
        assert store.size(path) == 11
        store.write_atomic(path, b"replaced")
        assert store.read_bytes(path) == b"replaced"

    def test_read_ranges(self, store_root):
        """read_ranges returns the requested byte ranges, in request order."""
        store, root = store_root
        path = store.join(root, "r")
        store.write_atomic(path, bytes(range(256)) * 4)
        assert store.read_ranges(path, [(0, 4), (1020, 1024), (300, 301)]) == [
            bytes([0, 1, 2, 3]), bytes([252, 253, 254, 255]), bytes([44])]

    def test_listdir_isdir_and_missing(self, store_root):
        """listdir names files and subdirectories; a missing directory lists empty; a missing
        file does not exist and read_bytes raises FileNotFoundError."""
        store, root = store_root
        store.makedirs(store.join(root, "d"))
        store.write_atomic(store.join(root, "d", "x"), b"1")
        store.write_atomic(store.join(root, "d", "sub", "y"), b"2")
        assert sorted(store.listdir(store.join(root, "d"))) == ["sub", "x"]
        assert store.isdir(store.join(root, "d"))
        assert store.listdir(store.join(root, "nothing")) == []
        assert not store.exists(store.join(root, "nothing", "x"))
        with pytest.raises(FileNotFoundError):
            store.read_bytes(store.join(root, "nothing", "x"))

    def test_delete_and_rmtree(self, store_root):
        """delete ignores missing paths; rmtree removes a tree and ignores a missing one."""
        store, root = store_root
        for name in ("a", "b"):
            store.write_atomic(store.join(root, "t", name), b"x")
        store.delete([store.join(root, "t", "a"), store.join(root, "t", "missing")])
        assert store.listdir(store.join(root, "t")) == ["b"]
        store.rmtree(store.join(root, "t"))
        assert store.listdir(store.join(root, "t")) == []
        store.rmtree(store.join(root, "never-existed"))


class ResolvableStoreSuite(StoreSuite):
    """StoreSuite plus URL round trips, for stores reached through ``resolve()``
    (local paths and fsspec URLs)."""

    def test_url_round_trips_through_resolve(self, store_root):
        """The ``url`` of a path resolves to a store and path that read the same object."""
        store, root = store_root
        path = store.join(root, "u")
        store.write_atomic(path, b"z")
        other, p = resolve(store.url(path), getattr(store, "storage_options", None))
        assert other.read_bytes(p) == b"z"
