"""Reading committed checkpoints: resolving paths, opening the index, reading
tensors into new or caller-provided arrays, mmap views, verification."""

from __future__ import annotations

from typing import Any, Iterable, Mapping, Sequence

import numpy as np

from .._dtypes import check_decodable, stored_dtype, undecodable
from ..errors import CheckpointNotFoundError, CorruptCheckpointError
from ..format import INDEX_NAME, FileEntry, Manifest, TensorEntry, decode_index
from ..format.source import CheckpointSource
from ..sharded import ShardedArray
from ..storage import Store, resolve
from .. import run_directory
from . import naming, read_executor, references
from .options import DEFAULT, IOOptions
from .read_executor import BlockReads
from .sharded_read import read_into_targets, read_whole, verify_sharded

__all__ = ["OpenCheckpoint", "open_checkpoint", "resolve_checkpoint", "data_file_path"]


def data_file_path(store: Store, path: str, entry: FileEntry) -> str:
    """Where data file ``entry`` of the checkpoint at ``path`` lies: in its directory,
    or for a reference (``entry.at``, docs/FORMAT.md section 12) in the sibling
    checkpoint directory of that name."""
    if entry.at is None:
        return store.join(path, entry.name)
    trimmed = path.rstrip("/")
    cut = trimmed.rfind("/")
    parent = "" if cut < 0 else (trimmed[:cut] or "/")
    return store.join(parent, entry.at, entry.name) if parent else f"{entry.at}/{entry.name}"


def resolve_checkpoint(store: Store, path: str) -> str:
    """The committed checkpoint at path, or the latest one in the directory path."""
    if store.exists(store.join(path, INDEX_NAME)):
        return path
    if store.isdir(path):
        latest = run_directory.latest(store, path)
        if latest is not None:
            return latest
        if any(naming.is_data_file(n) for n in store.listdir(path)):
            try:
                users = references.referenced_by(store, path)
            except OSError:  # its parent cannot be listed: say what is known
                users = []
            if users:  # a retired checkpoint whose data incremental checkpoints read
                raise CheckpointNotFoundError(
                    f"{store.url(path)} is no checkpoint: it holds data of a retired checkpoint "
                    f"that the incremental checkpoints {', '.join(users)} reference (held "
                    "data, removed once none does); open one of those")
            raise CheckpointNotFoundError(
                f"{store.url(path)} holds data files but no index: it was never committed "
                "(an interrupted save?)")
        raise CheckpointNotFoundError(f"no committed checkpoint at {store.url(path)}")
    raise CheckpointNotFoundError(f"no checkpoint at {store.url(path)}")


class OpenCheckpoint(CheckpointSource):
    """A committed checkpoint of pyckpt's format with its validated manifest: the
    format interface (format/source.py) for pyckpt checkpoints, local or remote.

    Tensors are addressed by their index in ``manifest.keys``; the bulk read
    paths work on numpy columns so that 100,000 small tensors cost little.
    """

    format = "pyckpt"

    def __init__(self, store: Store, path: str, manifest: Manifest,
                 options: IOOptions = DEFAULT) -> None:
        self.store = store
        self.path = path
        self.manifest = manifest
        self.options = options
        self._checked_files: set[int] = set()
        self._undecodable: bool | None = None  # whether some dtype cannot be decoded

    @classmethod
    def at(cls, store: Store, path: str, options: IOOptions = DEFAULT) -> "OpenCheckpoint | None":
        """The checkpoint committed at ``path`` itself, read in one request (its index;
        on an object store a probe for a missing object costs a HEAD and a LIST), or
        None when ``path`` holds no index."""
        index = store.join(path, INDEX_NAME)
        if store.local and not store.exists(index):  # a stat; a file's path is no directory
            return None
        try:
            data = store.read_bytes(index)
        except FileNotFoundError:
            return None
        return cls(store, path, decode_index(data, store.url(index)), options)

    @classmethod
    def open(cls, store: Store, path: str, options: IOOptions = DEFAULT) -> "OpenCheckpoint":
        path = resolve_checkpoint(store, path)
        ck = cls.at(store, path, options)
        if ck is None:
            raise CheckpointNotFoundError(f"no committed checkpoint at {store.url(path)}")
        return ck

    # -- the format interface ------------------------------------------------------
    @property
    def url(self) -> str:
        return self.store.url(self.path)

    @property
    def keys(self) -> Sequence[str]:
        return self.manifest.keys

    @property
    def index(self) -> Mapping[str, int]:
        return self.manifest.index

    def shape(self, i: int) -> tuple[int, ...]:
        return self.manifest.shapes[i]

    def dtype(self, i: int) -> np.dtype:
        return self.manifest.dtype(i)

    @property
    def metadata(self) -> dict:
        return self.manifest.metadata

    @property
    def tree(self) -> dict | None:
        return self.manifest.tree

    @property
    def graph(self) -> dict | None:
        return self.manifest.graph

    @property
    def info(self) -> dict:
        return self.manifest.info

    def describe(self) -> dict:
        """Format version, chunk size, data files (``in``: the directory of a referenced
        one), bytes of tensor data in its own files and in referenced ones, and ``info``
        (who wrote it; ``info["incremental"]``: base, saves since the last full one,
        bytes found changed: docs/FORMAT.md section 12)."""
        m = self.manifest
        own, referenced = m.own_and_referenced_bytes()
        return {"format_version": m.version, "chunk_size": m.chunk_size,
                "files": [{"name": f.name, "bytes": f.size} if f.at is None
                          else {"name": f.name, "bytes": f.size, "in": f.at} for f in m.files],
                "own_bytes": own, "referenced_bytes": referenced, "info": m.info}

    def blocks(self, i: int) -> int:
        b = self.manifest.blocks
        return int(b.tensor_begin[i + 1] - b.tensor_begin[i])

    def nbytes(self, indices: Sequence[int] | None = None) -> int:
        m = self.manifest
        if indices is None:
            return int(m.blocks.nbytes.sum())
        b = m.blocks
        idx = np.asarray(indices, dtype=np.int64)
        if m.all_plain:
            return int(b.nbytes[b.tensor_begin[idx]].sum())
        return sum(int(b.nbytes[b.tensor_begin[i]:b.tensor_begin[i + 1]].sum())
                   for i in idx.tolist())

    def read(self, indices: Sequence[int], dsts: Sequence[Any]) -> None:
        self._check_decodable(indices)
        m = self.manifest
        if m.all_plain and not any(isinstance(d, ShardedArray) for d in dsts):
            self.read_plain(indices, dsts)
            return
        plain, sharded = [], []
        for i, d in zip(indices, dsts):
            if m.is_plain(i) and not isinstance(d, ShardedArray):
                plain.append((i, d))
            else:
                sharded.append((i, d))
        self.read_plain([i for i, _ in plain], [d for _, d in plain])
        if sharded:
            read_into_targets(self, sharded)

    def read_new(self, indices: Sequence[int], mmap: bool = False) -> list[np.ndarray]:
        self._check_decodable(indices)
        m = self.manifest
        if m.all_plain:
            return self.mmap(indices) if mmap else self.read_new_plain(indices)
        plain = [i for i in indices if m.is_plain(i)]
        out = dict(zip(plain, self.mmap(plain) if mmap else self.read_new_plain(plain)))
        rest = [i for i in indices if not m.is_plain(i)]
        out.update(zip(rest, read_whole(self, rest)))
        return [out[i] for i in indices]

    def _check_decodable(self, indices: Sequence[int]) -> None:
        """DtypeUnavailableError before reading the values of a tensor whose dtype this
        Python cannot decode (``_dtypes.stored_dtype``; its bytes verify all the same)."""
        if self._undecodable is None:
            self._undecodable = any(undecodable(stored_dtype(n))
                                    for n in self.manifest.dtype_names.names)
        if self._undecodable:
            for i in indices:
                check_decodable(self.dtype(int(i)), self.keys[int(i)], self.url)

    # -- pyckpt's own ------------------------------------------------------------------
    def entry(self, key: str) -> TensorEntry:
        return self.manifest.entry(self.index_of(key))

    def file_path(self, index: int) -> str:
        return data_file_path(self.store, self.path, self.manifest.files[index])

    # -- integrity of files -------------------------------------------------------
    def check_files(self, indices: Iterable[int]) -> None:
        """Every needed file exists with the size the manifest says (before allocating)."""
        todo = sorted(set(int(i) for i in indices) - self._checked_files)
        found = self.store.sizes([self.file_path(i) for i in todo])
        for i, size in zip(todo, found):
            f = self.manifest.files[i]
            p = self.file_path(i)
            if size is None:
                what = "data file" if f.at is None else f"data file (of {f.at}, referenced)"
                raise CorruptCheckpointError(
                    f"checkpoint {self.url}: {what} '{self.store.url(p)}' is missing "
                    f"(needed for bytes [0, {f.size}))") from None
            if size != f.size:
                raise CorruptCheckpointError(
                    f"checkpoint {self.url}: data file '{self.store.url(p)}' has {size} bytes, "
                    f"the index says {f.size} (bytes [{min(size, f.size)}, {max(size, f.size)}) "
                    "differ: truncated or overwritten)")
            self._checked_files.add(i)

    # -- block reads ---------------------------------------------------------------
    def block_reads(self, indices: Sequence[int] | np.ndarray) -> "BlockReads":
        """Where the (single) block of each plain tensor lies."""
        m = self.manifest
        b = m.blocks
        idx = np.asarray(indices, dtype=np.int64)
        if not m.all_plain:
            for i in idx.tolist():
                if not m.is_plain(i):
                    raise ValueError(f"{m.keys[i]!r} is a sharded array")
        j = b.tensor_begin[idx]
        if len(idx) == len(m.keys) and (idx == np.arange(len(idx))).all():
            crc_begin = b.crc_begin.astype(np.uint64)
            return BlockReads(list(m.keys), b.file[j], b.offset[j], b.nbytes[j], b.crcs, crc_begin)
        return self.plan_ranges([m.keys[i] for i in idx.tolist()], j, np.zeros(len(j), np.int64),
                                b.nbytes[j])

    def plan_ranges(self, keys: list[str], blocks: np.ndarray, lo: np.ndarray,
                    hi: np.ndarray) -> "BlockReads":
        """Bytes [lo, hi) of stored blocks (lo a multiple of the chunk size, hi one too
        or the block's end): the unit of partial reads of sharded arrays."""
        b = self.manifest.blocks
        cs = self.manifest.chunk_size
        blocks = np.asarray(blocks, dtype=np.int64)
        lo = np.asarray(lo, dtype=np.int64)
        hi = np.asarray(hi, dtype=np.int64)
        starts = b.crc_begin[blocks] + lo // cs
        lens = -(-hi // cs) - lo // cs
        crc_begin = np.zeros(len(blocks) + 1, dtype=np.uint64)
        np.cumsum(lens, out=crc_begin[1:])
        gather = np.repeat(starts - crc_begin[:-1].astype(np.int64), lens) + \
            np.arange(int(crc_begin[-1]), dtype=np.int64)
        return BlockReads(keys, b.file[blocks], b.offset[blocks] + lo, hi - lo, b.crcs[gather],
                          crc_begin)

    # -- reads -----------------------------------------------------------------------
    def read_plain(self, indices: Sequence[int] | np.ndarray, dsts: Sequence[np.ndarray | None],
                   buffers: dict[int, Any] | None = None) -> None:
        """Reads whole (plain) tensors into dsts (None: verify only)."""
        if len(indices) == 0:
            return
        self.read_blocks(self.block_reads(indices), dsts, buffers)

    def read_blocks(self, p: "BlockReads", dsts: Sequence[np.ndarray | None],
                    buffers: dict[int, Any] | None = None) -> None:
        """Reads and verifies a plan into dsts (None: verify only) once the sizes of
        its files are checked (read_executor.py); ``buffers``: the files' bytes."""
        if len(p.keys) == 0:
            return
        used = np.unique(p.file[p.nbytes > 0]).tolist()
        self.check_files(used)
        read_executor.execute(self.store, {f: self.file_path(f) for f in used}, p, dsts,
                              self.manifest.chunk_size, self.options, buffers)

    def new_array(self, i: int) -> np.ndarray:
        return np.empty(self.manifest.shapes[i], dtype=self.manifest.dtype(i))

    def read_new_plain(self, indices: Sequence[int] | np.ndarray) -> list[np.ndarray]:
        """Reads plain tensors into newly allocated arrays (file sizes checked first)."""
        b = self.manifest.blocks
        j = b.tensor_begin[np.asarray(indices, dtype=np.int64)]
        self.check_files(np.unique(b.file[j][b.nbytes[j] > 0]).tolist())
        arrays = [self.new_array(i) for i in np.asarray(indices).tolist()]
        self.read_plain(indices, arrays)
        return arrays

    def mmap(self, indices: Sequence[int] | np.ndarray, verify: bool = True) -> list[np.ndarray]:
        """Read-only arrays backed by the local files (checksums verified through the map);
        new arrays where the store has no local files."""
        p = self.block_reads(indices)
        used = np.unique(p.file[p.nbytes > 0]).tolist()
        self.check_files(used)
        maps = read_executor.map_files(self.store, self.path, {f: self.file_path(f) for f in used})
        if maps is None:
            return self.read_new_plain(indices)
        out = []
        m = self.manifest
        for k, i in enumerate(np.asarray(indices).tolist()):
            dtype, shape = m.dtype(i), m.shapes[i]
            n = int(p.nbytes[k])
            if n == 0:
                arr = np.empty(shape, dtype=dtype)
                arr.flags.writeable = False
            else:
                arr = np.frombuffer(maps[int(p.file[k])], dtype=dtype, count=n // dtype.itemsize,
                                    offset=int(p.offset[k])).reshape(shape)
            out.append(arr)
        if verify:
            self.read_plain(indices, [None] * len(out), buffers=maps)
        return out

    def verify(self) -> None:
        """Reads every byte of every tensor and checks every checksum."""
        m = self.manifest
        self.check_files(range(len(m.files)))
        plain = [i for i in range(len(m.keys)) if m.is_plain(i)]
        self.read_plain(plain, [None] * len(plain))
        sharded = [i for i in range(len(m.keys)) if not m.is_plain(i)]
        if sharded:
            verify_sharded(self, sharded)


def open_checkpoint(path: Any, storage_options: dict | None = None,
                    options: IOOptions = DEFAULT) -> OpenCheckpoint:
    """The committed checkpoint at a path or URL (a directory: its latest)."""
    store, p = resolve(path, storage_options)
    return OpenCheckpoint.open(store, p, options)
