"""Writing checkpoints: shard data first, the index (the commit record) last.

Save sequence for one process (docs/PROTOCOL.md gives the multi-worker one):
 1. validate every value (dtype, key) before any byte is written;
 2. place tensors into a few shard files (balanced, aligned; C++ planner);
 3. write the shard files under names unique to this attempt, computing the
    CRC32C of every chunk on the way, and fsync them (C++ core, GIL released);
 4. write the index atomically (temp + fsync + rename locally, one PUT on an
    object store): from this moment the checkpoint is committed;
 5. delete the data files of the index that was replaced, if any.
A failure before step 4 deletes this attempt's files and leaves any previous
checkpoint at the path untouched.
"""

from __future__ import annotations

import json
import math
import time
import warnings
from typing import Any, Sequence

import numpy as np

from .. import _core
from .._dtypes import dtype_name, little_endian
from ..format import INDEX_NAME, Manifest, decode_index, encode_index
from ..format.manifest import FileEntry, build_manifest
from ..storage import Store
from ..tree import validate_key
from . import naming
from .options import DEFAULT, IOOptions

__all__ = ["PreparedTensor", "WrittenData", "prepare_tensors", "write_data", "commit", "delete_replaced", "save_tensors"]


class PreparedTensor:
    """A validated tensor ready to write: little-endian array and stored dtype name."""

    __slots__ = ("key", "array", "dtype_name")

    def __init__(self, key: str, array: np.ndarray, dtype_name: str) -> None:
        self.key = key
        self.array = array
        self.dtype_name = dtype_name


def prepare_tensors(items: Sequence[tuple[str, Any]], keys_checked: bool = False
                    ) -> list[PreparedTensor]:
    """Validates keys (unless the caller did) and dtypes; makes data little-endian."""
    out = []
    seen = set()
    for key, arr in items:
        if not keys_checked:
            validate_key(key)
            if key in seen:
                raise ValueError(f"duplicate checkpoint key {key!r}")
            seen.add(key)
        if not isinstance(arr, np.ndarray):
            arr = np.asarray(arr)
        try:
            name = dtype_name(arr.dtype)
        except TypeError as e:
            raise TypeError(f"{key!r}: {e}") from None
        out.append(PreparedTensor(key, little_endian(arr), name))
    return out


def check_metadata(metadata: Any) -> dict:
    if metadata is None:
        return {}
    if not isinstance(metadata, dict):
        raise TypeError("metadata must be a dict of JSON-serializable values")
    try:
        json.dumps(metadata, allow_nan=False)
    except (TypeError, ValueError) as e:
        raise ValueError(f"metadata is not JSON-serializable: {e}") from None
    return metadata


def _num_files(total: int, nonzero: int, opts: IOOptions) -> int:
    if nonzero == 0:
        return 0
    threads = opts.threads if opts.threads > 0 else _core.default_threads()
    want = max(min(threads, math.ceil(total / opts.min_file_bytes)),
               math.ceil(total / opts.max_file_bytes), 1)
    return min(want, nonzero)


class WrittenData:
    """What one worker wrote: its files, and per tensor the (file, offset, nbytes)
    of its block and its masked chunk CRCs (concatenated, in tensor order)."""

    __slots__ = ("files", "file", "offset", "nbytes", "crcs")

    def __init__(self, files: list[FileEntry], file: np.ndarray, offset: np.ndarray,
                 nbytes: np.ndarray, crcs: np.ndarray) -> None:
        self.files = files
        self.file = file
        self.offset = offset
        self.nbytes = nbytes
        self.crcs = crcs


def write_data(store: Store, path: str, tensors: list[PreparedTensor], *, attempt: str,
               rank: int = 0, options: IOOptions = DEFAULT) -> WrittenData:
    """Writes the shard files of one worker. Deletes its own files on failure."""
    n = len(tensors)
    nbytes = np.fromiter((t.array.nbytes for t in tensors), dtype=np.uint64, count=n)
    total = int(nbytes.sum()) if n else 0
    n_files = _num_files(total, int(np.count_nonzero(nbytes)), options)
    if n_files == 0:
        zeros = np.zeros(n, dtype=np.int64)
        return WrittenData([], zeros, zeros, zeros, np.zeros(0, dtype=np.uint32))
    file_idx, offsets, sizes = _core.plan_layout(nbytes, n_files, options.alignment)
    names = [naming.data_file_name(attempt, rank, i) for i in range(n_files)]
    paths = [store.join(path, name) for name in names]
    keys = [t.key for t in tensors]
    arrays = [t.array for t in tensors]
    try:
        if store.local:
            crcs, _ = _core.write_shards(paths, sizes, keys, arrays, file_idx, offsets,
                                         options.chunk_size, options.threads,
                                         options.piece_size, options.sync)
        else:
            crcs = store.write_shards(  # type: ignore[attr-defined]
                paths, sizes, keys, arrays, file_idx, offsets, options)
    except BaseException:
        store.delete(paths)
        raise
    files = [FileEntry(name, int(size)) for name, size in zip(names, sizes)]
    return WrittenData(files, file_idx.astype(np.int64), offsets.astype(np.int64),
                       nbytes.astype(np.int64), crcs)


def read_previous(store: Store, path: str) -> Manifest | None:
    """The manifest currently committed at path, if any and readable."""
    index = store.join(path, INDEX_NAME)
    try:
        return decode_index(store.read_bytes(index), store.url(index))
    except (FileNotFoundError, ValueError, OSError):
        return None


def commit(store: Store, path: str, manifest: Manifest) -> Manifest | None:
    """Writes the index: the checkpoint is committed when this returns.

    Returns the manifest it replaced (if any), whose files the caller deletes
    with ``delete_replaced`` once nothing can fail any more."""
    previous = read_previous(store, path)
    store.write_atomic(store.join(path, INDEX_NAME), encode_index(manifest))
    return previous


def delete_replaced(store: Store, path: str, previous: Manifest | None, manifest: Manifest) -> None:
    """Best-effort removal of the data files of a replaced index."""
    if previous is None:
        return
    keep = {f.name for f in manifest.files}
    try:
        store.delete(store.join(path, f.name) for f in previous.files if f.name not in keep)
    except OSError as e:
        warnings.warn(f"could not delete old data files under {store.url(path)}: {e}")


def abandon(store: Store, path: str, files: list[FileEntry], attempt: str) -> None:
    """Deletes an attempt's data files after a failed commit, unless its index
    became visible anyway (a failure after the rename): then the files stay."""
    current = read_previous(store, path)
    if current is not None and current.info.get("attempt") == attempt:
        return
    try:
        store.delete(store.join(path, f.name) for f in files)
    except OSError:
        pass


def info(attempt: str, world_size: int = 1) -> dict:
    from .. import __version__

    return {"library": "pyckpt", "version": __version__, "attempt": attempt,
            "created": time.time(), "world_size": world_size}


def save_tensors(store: Store, path: str, items: Sequence[tuple[str, Any]], *,
                 tree: Any = None, graph: dict | None = None,
                 metadata: dict | None = None, options: IOOptions = DEFAULT,
                 keys_checked: bool = False) -> Manifest:
    """Single-process save of (key, array) pairs as one committed checkpoint."""
    metadata = check_metadata(metadata)
    tensors = prepare_tensors(items, keys_checked)
    if store.exists(path) and not store.isdir(path):
        raise FileExistsError(f"{store.url(path)} exists and is not a checkpoint directory")
    store.makedirs(path)
    attempt = naming.new_attempt_id()
    data = write_data(store, path, tensors, attempt=attempt, options=options)
    manifest = build_manifest(
        chunk_size=options.chunk_size, files=data.files, keys=[t.key for t in tensors],
        dtype_names=[t.dtype_name for t in tensors], shapes=[t.array.shape for t in tensors],
        file=data.file, offset=data.offset, nbytes=data.nbytes, crcs=data.crcs,
        tree=tree, metadata=metadata, graph=graph, info=info(attempt))
    try:
        previous = commit(store, path, manifest)
    except BaseException:
        abandon(store, path, data.files, attempt)
        raise
    delete_replaced(store, path, previous, manifest)
    return manifest
