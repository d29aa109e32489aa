"""Reading committed checkpoints: resolving paths, opening the index, reading
tensors into new or caller-provided arrays, mmap views, verification."""

from __future__ import annotations

import itertools
import mmap
import os
from typing import Any, Iterable, Sequence

import numpy as np

from .. import _core
from ..errors import CheckpointNotFoundError, CorruptCheckpointError
from ..format import INDEX_NAME, Manifest, TensorEntry, decode_index
from ..storage import Store
from . import naming
from .options import DEFAULT, IOOptions

__all__ = ["OpenCheckpoint", "find_latest", "open_checkpoint"]


def find_latest(store: Store, directory: str, name: str = "ckpt") -> str | None:
    """Path of the committed ``<name>-<N>`` under directory with the highest N."""
    best: tuple[int, str] | None = None
    for entry in store.listdir(directory):
        step = naming.parse_step(entry, name)
        if step is None or (best is not None and step <= best[0]):
            continue
        candidate = store.join(directory, entry)
        if store.exists(store.join(candidate, INDEX_NAME)):
            best = (step, candidate)
    return best[1] if best else None


def _default_name(store: Store, directory: str) -> str:
    from ..manager_state import read_checkpoint_name

    return read_checkpoint_name(store, directory) or "ckpt"


def resolve_checkpoint(store: Store, path: str) -> str:
    """The committed checkpoint at path, or the latest one in the directory path."""
    if store.exists(store.join(path, INDEX_NAME)):
        return path
    if store.isdir(path):
        latest = find_latest(store, path, _default_name(store, path))
        if latest is not None:
            return latest
        if any(naming.is_data_file(n) for n in store.listdir(path)):
            raise CheckpointNotFoundError(
                f"{store.url(path)} holds data files but no index: it was never committed "
                "(an interrupted save?)")
        raise CheckpointNotFoundError(f"no committed checkpoint at {store.url(path)}")
    raise CheckpointNotFoundError(f"no checkpoint at {store.url(path)}")


class OpenCheckpoint:
    """A committed checkpoint with its validated manifest."""

    def __init__(self, store: Store, path: str, manifest: Manifest,
                 options: IOOptions = DEFAULT) -> None:
        self.store = store
        self.path = path
        self.manifest = manifest
        self.options = options
        self._checked_files: set[int] = set()

    @classmethod
    def open(cls, store: Store, path: str, options: IOOptions = DEFAULT) -> "OpenCheckpoint":
        path = resolve_checkpoint(store, path)
        index = store.join(path, INDEX_NAME)
        try:
            data = store.read_bytes(index)
        except FileNotFoundError:
            raise CheckpointNotFoundError(f"no committed checkpoint at {store.url(path)}") from None
        return cls(store, path, decode_index(data, store.url(index)), options)

    @property
    def url(self) -> str:
        return self.store.url(self.path)

    def entry(self, key: str) -> TensorEntry:
        from ..errors import CheckpointKeyError

        try:
            return self.manifest.tensors[key]
        except KeyError:
            raise CheckpointKeyError(f"key {key!r} not in checkpoint {self.url}") from None

    def file_path(self, index: int) -> str:
        return self.store.join(self.path, self.manifest.files[index].name)

    # -- integrity of files -------------------------------------------------------
    def check_files(self, indices: Iterable[int]) -> None:
        """Every needed file exists with the size the manifest says (before allocating)."""
        for i in sorted(set(indices) - self._checked_files):
            f = self.manifest.files[i]
            p = self.file_path(i)
            try:
                size = self.store.size(p)
            except FileNotFoundError:
                raise CorruptCheckpointError(
                    f"checkpoint {self.url}: data file '{self.store.url(p)}' is missing "
                    f"(needed for bytes [0, {f.size}))") from None
            if size != f.size:
                raise CorruptCheckpointError(
                    f"checkpoint {self.url}: data file '{self.store.url(p)}' has {size} bytes, "
                    f"the index says {f.size} (bytes [{min(size, f.size)}, {max(size, f.size)}) "
                    "differ: truncated or overwritten)")
            self._checked_files.add(i)

    # -- reads -----------------------------------------------------------------------
    def read(self, entries: Sequence[TensorEntry], dsts: Sequence[np.ndarray | None],
             buffers: dict[int, Any] | None = None) -> None:
        """Reads whole (unsharded) tensors into dsts (None: verify only)."""
        if not entries:
            return
        for e in entries:
            if e.sharded:
                raise NotImplementedError(f"{e.key!r} is a sharded array; use load(into=...)")
        blocks = [e.blocks[0] for e in entries]
        used = sorted({b.file for b in blocks if b.nbytes})
        self.check_files(used)
        source_of = {f: i for i, f in enumerate(used)}
        names = [self.file_path(f) for f in used]
        if not self.store.local and buffers is None:
            return self.store.read_tensors(self, entries, dsts)  # type: ignore[attr-defined]
        bufs = [None if buffers is None else buffers[f] for f in used]
        n = len(entries)
        lens = [len(b.crcs) for b in blocks]
        crcs = np.fromiter(itertools.chain.from_iterable(b.crcs for b in blocks), dtype=np.uint32,
                           count=sum(lens))
        crc_begin = np.zeros(n + 1, dtype=np.uint64)
        np.cumsum(lens, out=crc_begin[1:])
        _core.read_shards(
            names, bufs, [0] * len(used), [e.key for e in entries],
            np.fromiter((source_of.get(b.file, 0) for b in blocks), dtype=np.uint32, count=n),
            np.fromiter((b.offset for b in blocks), dtype=np.uint64, count=n),
            np.fromiter((b.nbytes for b in blocks), dtype=np.uint64, count=n),
            crcs, crc_begin, list(dsts), self.manifest.chunk_size, self.options.threads,
            True, self.options.piece_size)

    def read_new(self, entries: Sequence[TensorEntry]) -> list[np.ndarray]:
        """Reads tensors into newly allocated arrays."""
        self.check_files(b.file for e in entries for b in e.blocks if b.nbytes)
        arrays = [np.empty(e.shape, dtype=e.dtype) for e in entries]
        self.read(entries, arrays)
        return arrays

    def mmap(self, entries: Sequence[TensorEntry], verify: bool = True) -> list[np.ndarray]:
        """Read-only arrays backed by the local files (checksums verified through the map)."""
        if not self.store.local:
            return self.read_new(entries)
        used = sorted({e.blocks[0].file for e in entries if e.blocks[0].nbytes})
        self.check_files(used)
        maps = {}
        for f in used:
            with open(self.file_path(f), "rb") as fh:
                maps[f] = mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ)
        out = []
        for e in entries:
            b = e.blocks[0]
            if b.nbytes == 0:
                arr = np.empty(e.shape, dtype=e.dtype)
                arr.flags.writeable = False
            else:
                arr = np.frombuffer(maps[b.file], dtype=e.dtype, count=b.nbytes // e.dtype.itemsize,
                                    offset=b.offset).reshape(e.shape)
            out.append(arr)
        if verify:
            self.read(entries, [None] * len(entries), buffers=maps)
        return out

    def verify(self) -> None:
        """Reads every byte of every tensor and checks every checksum."""
        self.check_files(range(len(self.manifest.files)))
        entries = list(self.manifest.tensors.values())
        plain = [e for e in entries if not e.sharded]
        self.read(plain, [None] * len(plain))
        sharded = [e for e in entries if e.sharded]
        if sharded:
            from .sharded_read import verify_sharded

            verify_sharded(self, sharded)


def open_checkpoint(path: Any, storage_options: dict | None = None,
                    options: IOOptions = DEFAULT) -> OpenCheckpoint:
    from ..storage import resolve

    store, p = resolve(path, storage_options)
    return OpenCheckpoint.open(store, p, options)
