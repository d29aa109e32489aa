"""A torch.distributed.checkpoint directory (FileSystemWriter's ``.metadata`` +
``__<rank>_<n>.distcp`` files) as a checkpoint source (format/source.py), read
without torch.

Opening reads and checks ``.metadata`` (metadata.py). Keys are DCP's fully
qualified names, in the metadata's order; a tensor stored as several chunks
(the shards of a DTensor, from several ranks) is one key with ``blocks(i)``
chunks, assembled on read, and any box of it (a ShardedArray target) is read
from the chunks it overlaps. Non-tensor entries ("bytes entries": the torch.save
archive DCP made of each non-tensor value) are not keys: they are in
``tree`` as ``{"b": ...}`` values (so ``pyckpt.load`` returns them as bytes and
``pyckpt cp`` keeps them), in ``describe()["bytes_entries"]``, and
``bytes_entry(key)`` returns one. They are never unpickled.

Reads touch only the byte ranges of the chunks asked for: small items are read
whole, larger ones as their first and last bytes (zip headers and directory)
and then the storage's bytes (archive.py); reads of many items go to the store
together (``Store.fetch``). Every zip entry read has its CRC-32 checked.
"""

from __future__ import annotations

import base64
import math
from typing import Any, Callable, Sequence

import numpy as np

from ..._dtypes import check_decodable, stored_dtype
from ...errors import CheckpointKeyError, CorruptCheckpointError
from ...format.source import KeyedSource
from ..record_file import read_record_file
from ...sharded import ShardedArray
from ...sharded.boxes import intersect
from ...storage import ByteRange, Store
from .archive import (Item, Place, StoredTensor, UnsupportedDCPError, decode_tensor,
                      member_range, read_directory, read_member, tensor_view)
from .metadata import (BytesEntry, Chunk, DcpMetadata, TensorEntry, decode_metadata,
                       torch_itemsize)

__all__ = ["DCPCheckpoint", "METADATA_NAME", "MAX_METADATA_BYTES"]

METADATA_NAME = ".metadata"
MAX_METADATA_BYTES = 1 << 30
WHOLE = 1 << 20           # items up to this size are read in one request
HEAD, TAIL = 64 << 10, 80 << 10   # else their first and last bytes, then the storage
BATCH_BYTES = 256 << 20   # bytes read ahead at once (first reads of many items)
OBJECT = np.dtype(object)

#: a chunk to read: (tensor position, chunk position)
ChunkId = tuple[int, int]
#: where a chunk's values go: (destination array, its box's offsets, the box to copy)
Job = tuple[np.ndarray, tuple[int, ...], tuple[tuple[int, ...], tuple[int, ...]]]


class DCPCheckpoint(KeyedSource):
    """A DCP checkpoint directory in a store, its ``.metadata`` checked when opened."""

    format = "dcp"

    def __init__(self, store: Store, path: str) -> None:
        self.store, self.path = store, path
        mpath = store.join(path, METADATA_NAME)
        url = store.url(mpath)
        data = read_record_file(store, mpath, MAX_METADATA_BYTES, "DCP metadata",
                                f"DCP checkpoint at {store.url(path)}")
        self._open(decode_metadata(data, url), len(data))

    @classmethod
    def from_metadata_bytes(cls, store: Store, path: str, data: bytes) -> "DCPCheckpoint":
        """A checkpoint whose ``.metadata`` bytes are at hand (tests, fuzzing); its data
        files are read from ``store`` under ``path`` when needed."""
        self = cls.__new__(cls)
        self.store, self.path = store, path
        self._open(decode_metadata(data, store.url(store.join(path, METADATA_NAME))), len(data))
        return self

    def _open(self, meta: DcpMetadata, nbytes: int) -> None:
        self.meta, self.metadata_bytes = meta, nbytes
        self.tensors = [e for e in meta.entries if isinstance(e, TensorEntry)]
        self.bytes_entries = {e.key: e for e in meta.entries if isinstance(e, BytesEntry)}
        self._keys = [e.key for e in self.tensors]
        self._index = {k: i for i, k in enumerate(self._keys)}
        self._dtypes = [self._numpy(e) for e in self.tensors]
        self._sizes: dict[str, int] = {}
        self._tree: dict | None = None

    @staticmethod
    def _numpy(e: TensorEntry) -> np.dtype:
        """numpy dtype of a tensor (``object`` for those without one: listed, not read)."""
        if e.dtype_name is None:
            return OBJECT
        try:
            return stored_dtype(e.dtype_name)  # bfloat16 without ml_dtypes: bytes only
        except ValueError:
            return OBJECT

    # -- the format interface -----------------------------------------------------------
    @property
    def url(self) -> str:
        return self.store.url(self.path)

    def shape(self, i: int) -> tuple[int, ...]:
        return self.tensors[i].shape

    def dtype(self, i: int) -> np.dtype:
        return self._dtypes[i]

    def nbytes(self, indices: Sequence[int] | None = None) -> int:
        """Bytes of the given tensors' values (all by default), at torch's element size
        (also for the dtypes numpy lacks, ``object`` here)."""
        idx = range(len(self.tensors)) if indices is None else indices
        return sum(math.prod(self.tensors[i].shape) * torch_itemsize(self.tensors[i].torch_dtype)
                   for i in idx)

    def blocks(self, i: int) -> int:
        return len(self.tensors[i].chunks)

    @property
    def info(self) -> dict:
        # no "library": the metadata does not say which torch version wrote it
        return {"format": "torch.distributed.checkpoint", "dcp_version": self.meta.version,
                "save_id": self.meta.save_id}

    @property
    def tree(self) -> dict:
        """A flat dict of every entry under its key: tensors, and bytes entries as
        ``{"b": base64}`` (their stored bytes, read on first use)."""
        if self._tree is None:
            raw = self._read_bytes(list(self.bytes_entries.values()))
            self._tree = {"d": [[e.key, e.key] if isinstance(e, TensorEntry) else
                                [e.key, {"b": base64.b64encode(raw[e.key]).decode("ascii")}]
                                for e in self.meta.entries]}
        return self._tree

    def describe(self) -> dict:
        files = sorted({ch.storage.relative_path for e in self.tensors for ch in e.chunks}
                       | {e.storage.relative_path for e in self.bytes_entries.values()})
        return {"layout": "torch.distributed.checkpoint (FileSystemWriter)",
                "metadata_bytes": self.metadata_bytes,
                "files": [{"name": f, "bytes": self._size_or_none(f)} for f in files],
                "bytes_entries": [{"key": e.key, "file": e.storage.relative_path,
                                   "offset": e.storage.offset, "bytes": e.storage.length}
                                  for e in self.bytes_entries.values()],
                "torch_dtypes": {e.key: f"torch.{e.torch_dtype}" for e, d in
                                 zip(self.tensors, self._dtypes) if d == OBJECT}}

    def bytes_entry(self, key: str) -> bytes:
        """The stored bytes of the non-tensor entry ``key`` (not unpickled)."""
        e = self.bytes_entries.get(key)
        if e is None:
            raise CheckpointKeyError(f"{key!r} is not a bytes entry of DCP checkpoint {self.url}")
        return self._read_bytes([e])[key]

    # -- files --------------------------------------------------------------------------
    def _file(self, name: str) -> str:
        return self.store.join(self.path, name)

    def _size_or_none(self, name: str) -> int | None:
        try:
            return self._file_size(name, "")
        except CorruptCheckpointError:
            return None

    def _file_size(self, name: str, who: str) -> int:
        size = self._sizes.get(name)
        if size is None:
            try:
                size = self._sizes[name] = self.store.size(self._file(name))
            except FileNotFoundError:
                raise CorruptCheckpointError(f"{who}data file {self.store.url(self._file(name))} "
                                             f"of DCP checkpoint {self.url} is missing") from None
        return size

    def _place(self, what: str, key: str, info: Any) -> Place:
        """The item's place, checked to lie inside its file."""
        name = info.relative_path
        place = Place(what, key, self.store.url(self._file(name)), info.offset, info.length)
        size = self._file_size(name, f"{what} {key!r}: ")
        if info.offset + info.length > size:
            raise place.bad(f"the item lies outside the file, which holds {size} bytes "
                            "(truncated file?)")
        return place

    # -- bytes entries ------------------------------------------------------------------
    def _read_bytes(self, entries: list[BytesEntry]) -> dict[str, bytes]:
        for e in entries:
            if e.storage.transforms:
                raise UnsupportedDCPError(
                    f"bytes entry {e.key!r} of {self.url} was written through stream "
                    f"transforms {list(e.storage.transforms)}, which pyckpt does not read")
        places = [self._place("bytes entry", e.key, e.storage) for e in entries]
        got = self.store.fetch([ByteRange(self._file(e.storage.relative_path), p.offset,
                                          p.offset + p.length) for e, p in zip(entries, places)])
        out = {}
        for e, p, data in zip(entries, places, got):
            if len(data) != p.length:
                raise p.bad(f"only {len(data)} bytes could be read (truncated file?)")
            out[e.key] = bytes(data)
        return out

    # -- tensors ------------------------------------------------------------------------
    def _check_readable(self, i: int, values: bool = True) -> None:
        """Refuses what pyckpt cannot read of tensor i; with ``values=False`` (verify:
        bytes only) a dtype this Python cannot decode passes."""
        e = self.tensors[i]
        if values:
            check_decodable(self._dtypes[i], e.key, self.url)
        if self._dtypes[i] == OBJECT:
            raise UnsupportedDCPError(f"tensor {e.key!r} of {self.url} is torch.{e.torch_dtype}, "
                                      "which pyckpt cannot read (numpy has no such dtype)")
        if e.layout != "strided":
            raise UnsupportedDCPError(f"tensor {e.key!r} of {self.url} has layout "
                                      f"torch.{e.layout}; pyckpt reads strided tensors only")
        for ch in e.chunks:
            if ch.storage.transforms:
                raise UnsupportedDCPError(
                    f"tensor {e.key!r} of {self.url} was written through stream transforms "
                    f"{list(ch.storage.transforms)} (DCP extensions such as compression), "
                    "which pyckpt does not read")

    def read(self, indices: Sequence[int], dsts: Sequence[Any]) -> None:
        jobs: dict[ChunkId, list[Job]] = {}
        for i, d in zip(indices, dsts):
            i = int(i)
            self._check_readable(i)
            arr, lo = (d.local, tuple(d.offsets)) if isinstance(d, ShardedArray) else \
                (d, (0,) * len(self.tensors[i].shape))
            box = (lo, tuple(arr.shape))
            for j, ch in enumerate(self.tensors[i].chunks):
                part = intersect(box, (ch.offsets, ch.sizes))
                if part is not None:
                    jobs.setdefault((i, j), []).append((arr, lo, part))
        self._run(jobs, deep=False)

    def read_new(self, indices: Sequence[int], mmap: bool = False) -> list[np.ndarray]:
        """New arrays (``mmap`` is ignored: the values are inside zip archives)."""
        indices = [int(i) for i in indices]
        for i in indices:
            self._check_readable(i)
        out = [np.empty(self.tensors[i].shape, dtype=self._dtypes[i]) for i in indices]
        self.read(indices, out)
        return out

    def verify(self) -> None:
        """Reads every chunk, checking every zip entry's CRC-32 (not only those a read
        needs), and every bytes entry (the CRC-32s of those that are zip archives)."""
        for i in range(len(self.tensors)):
            self._check_readable(i, values=False)
        self._run({(i, j): [] for i, e in enumerate(self.tensors)
                   for j in range(len(e.chunks))}, deep=True)
        raw = self._read_bytes(list(self.bytes_entries.values()))
        for key, data in raw.items():
            if data[:4] == b"PK\x03\x04":  # torch.save'd: its entries' CRCs, not unpickled
                e = self.bytes_entries[key]
                item = Item(self._place("bytes entry", key, e.storage), _no_fetch,
                            [(0, data)])
                for m in read_directory(item).values():
                    read_member(item, m)

    # -- reading chunks -----------------------------------------------------------------
    def _run(self, jobs: dict[ChunkId, list[Job]], deep: bool) -> None:
        """Reads each chunk of ``jobs`` (in file order, first reads batched) and copies
        its parts into their destinations."""
        order = sorted(jobs, key=lambda c: (self._chunk(c).storage.relative_path,
                                            self._chunk(c).storage.offset))
        batch: list[ChunkId] = []
        size = 0
        for c in order:
            batch.append(c)
            size += min(self._chunk(c).storage.length, WHOLE)
            if size >= BATCH_BYTES:
                self._run_batch(batch, jobs, deep)
                batch, size = [], 0
        if batch:
            self._run_batch(batch, jobs, deep)

    def _chunk(self, c: ChunkId) -> Chunk:
        return self.tensors[c[0]].chunks[c[1]]

    def _run_batch(self, batch: list[ChunkId], jobs: dict[ChunkId, list[Job]],
                   deep: bool) -> None:
        """Reads a batch of chunks: their archives' heads and tails (small ones whole)
        together, then the storage bytes of the large ones together, then copies."""
        items = self._probe(batch)
        stored = [self._decode(c, item) for c, item in zip(batch, items)]
        ranges = [(self._file(self._chunk(c).storage.relative_path), item,
                   member_range(item, t.storage)) for c, item, t in zip(batch, items, stored)]
        self._prefetch([(path, item, b, e) for path, item, (b, e) in ranges
                        if not item.cached(b, e)])
        for (i, j), item, t in zip(batch, items, stored):
            if deep:
                for m in read_directory(item).values():
                    if m != t.storage:
                        read_member(item, m)
            values = tensor_view(t, read_member(item, t.storage))
            offsets = self._chunk((i, j)).offsets
            for arr, lo, (at, n) in jobs[(i, j)]:
                # (... keeps 0-d results arrays)
                src = values[tuple(slice(a - o, a - o + k) for a, o, k in zip(at, offsets, n))
                             + (Ellipsis,)]
                dst = arr[tuple(slice(a - o, a - o + k) for a, o, k in zip(at, lo, n)) + (Ellipsis,)]
                np.copyto(dst, src, casting="no")
            item.segments.clear()  # done with its bytes

    def _probe(self, batch: list[ChunkId]) -> list[Item]:
        """An Item per chunk, holding its archive (small items) or its first and last
        bytes (the others), fetched together."""
        places = [self._place("tensor", self._keys[i], self._chunk((i, j)).storage)
                  for i, j in batch]
        paths = [self._file(self._chunk(c).storage.relative_path) for c in batch]
        probes: list[ByteRange] = []
        for path, p in zip(paths, places):
            if p.length <= WHOLE:
                probes.append(ByteRange(path, p.offset, p.offset + p.length))
            else:
                probes += [ByteRange(path, p.offset, p.offset + HEAD),
                           ByteRange(path, p.offset + p.length - TAIL, p.offset + p.length)]
        got = iter(self.store.fetch(probes))
        return [Item(p, _ranged(self.store, path, p.offset),
                     [(0, next(got))] if p.length <= WHOLE else
                     [(0, next(got)), (p.length - TAIL, next(got))])
                for path, p in zip(paths, places)]

    def _prefetch(self, wanted: list[tuple[str, Item, int, int]]) -> None:
        """Fetches item bytes [b, e) of each (file, item, b, e), BATCH_BYTES at a time,
        into the items (large storages: concurrent ranged reads on object stores)."""
        while wanted:
            n, size = 0, 0
            while n < len(wanted) and (n == 0 or size + wanted[n][3] - wanted[n][2] <= BATCH_BYTES):
                size += wanted[n][3] - wanted[n][2]
                n += 1
            group, wanted = wanted[:n], wanted[n:]
            got = self.store.fetch([ByteRange(path, item.place.offset + b, item.place.offset + e)
                                    for path, item, b, e in group])
            for (_, item, b, e), data in zip(group, got):
                if len(data) == e - b:  # a short read is reported by Item.get
                    item.segments.append((b, data))

    def _decode(self, c: ChunkId, item: Item) -> StoredTensor:
        """What chunk ``c``'s archive holds (its pickle read), checked against the metadata."""
        e, ch = self.tensors[c[0]], self._chunk(c)
        if bytes(item.get(0, min(4, item.place.length))) != b"PK\x03\x04":
            self._not_an_archive(item, ch.storage.relative_path)
        t = decode_tensor(item, e.torch_dtype)
        if t.shape != ch.sizes:
            raise item.place.bad(f"the archive holds a tensor of shape {list(t.shape)}; the "
                                 f"metadata gives chunk {c[1]} at {list(ch.offsets)} the shape "
                                 f"{list(ch.sizes)}")
        return t

    def _not_an_archive(self, item: Item, name: str) -> None:
        """Raises for an item that is no torch.save archive: UnsupportedDCPError when its
        file ``name`` is a safetensors file (DCP's SerializationFormat.SAFETENSORS),
        else CorruptCheckpointError."""
        head = self.store.read_ranges(self._file(name), [(0, 9)])[0]
        if len(head) == 9 and head[8:9] == b"{" and \
                int.from_bytes(head[:8], "little") < self._file_size(name, ""):
            raise UnsupportedDCPError(
                f"tensor {item.place.key!r}: {item.place.url} is a safetensors file (DCP's "
                "SerializationFormat.SAFETENSORS), which pyckpt does not read: save with the "
                "default torch_save serialization")
        raise item.place.bad("not a torch.save archive (no zip header at the item's start)")


def _ranged(store: Store, path: str, base: int) -> Callable[[int, int], Any]:
    """fetch(b, e) for an Item: bytes [base + b, base + e) of ``path``."""
    def fetch(b: int, e: int) -> Any:
        return store.read_ranges(path, [(base + b, base + e)])[0]
    return fetch


def _no_fetch(b: int, e: int) -> bytes:
    return b""
