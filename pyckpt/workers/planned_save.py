"""Saves planned by another framework: torch DCP's planners decide which worker
writes which block of which tensor, and pyckpt stores the blocks and commits.

The steps (docs/PROTOCOL.md section 8), driven by the framework's own calls:

 1. (coordinator) ``begin``: a new attempt id and its marker, before any data;
    the id reaches every worker inside the framework's plan;
 2. (every worker) ``write_blocks``: its blocks into its own shard files, named
    with the attempt id and its rank, every chunk checksummed; returns one
    ``StoredBlock`` per block, which the framework carries to the coordinator;
 3. (coordinator) ``commit_blocks``: checks that the blocks of every tensor tile
    it exactly, with its dtype, then writes the index last through the one
    commit routine, and ends the attempt.

A worker's failure deletes its own files; the framework then never calls step 3,
and the attempt's marker ends with its ``end()`` (the writer object's finalizer), so
the next commit at that path sweeps the other workers' files as orphans.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Sequence

import numpy as np

from .._dtypes import dtype_name, little_endian
from ..device.array import DeviceArray
from ..device.buffers import lease_shared
from ..device.staging import has_device_values, stage_values
from ..engine import commit, writer
from ..engine.commit import Attempt
from ..engine.options import DEFAULT, IOOptions
from ..engine.writer import PreparedTensor, info
from ..format.manifest import FileEntry
from ..sharded.boxes import check_partition
from ..storage import Store
from ..tree import validate_keys

__all__ = ["StoredBlock", "PlannedTensor", "Attempt", "begin", "write_blocks", "commit_blocks"]


@dataclasses.dataclass(frozen=True)
class StoredBlock:
    """Where one block landed: its file (None when empty), byte offset and length,
    chunk CRCs, stored dtype name, and its box in the tensor (offsets, shape)."""
    key: str
    file: FileEntry | None
    offset: int
    nbytes: int
    crcs: np.ndarray
    dtype: str
    offsets: tuple[int, ...]
    shape: tuple[int, ...]


@dataclasses.dataclass(frozen=True)
class PlannedTensor:
    """One tensor of the checkpoint as the framework declares it."""
    key: str
    dtype: str
    shape: tuple[int, ...]
    blocks: list[StoredBlock]


def begin(store: Store, path: str) -> Attempt:
    """Step 1: a new attempt at ``path`` (a WORKERS commit's: the coordinator's), marked
    live before any data is written; every worker writes under its ``id``. Its marker
    ends at its commit (``commit_blocks``) or at its ``end()`` (a save given up)."""
    return commit.Attempt.begin(commit.Kind.WORKERS, store, path)


def write_blocks(store: Store, path: str, attempt: str, rank: int,
                 blocks: Sequence[tuple[str, np.ndarray | DeviceArray, Sequence[int]]],
                 options: IOOptions = DEFAULT) -> list[StoredBlock]:
    """Step 2: writes ``(key, array, offsets)`` blocks of this worker; raises (having
    deleted its own files) on failure. Host arrays are written from where they are.
    DeviceArrays (device memory) are copied into the pinned staging buffers every
    save of device values uses (``device.buffers.lease_shared``); into local files
    the writers start on each value as soon as its copy landed (``StagedWrite``,
    as ``pyckpt.save`` does), elsewhere every value is staged first."""
    arrays = [arr for _, arr, _ in blocks]
    if not has_device_values(arrays):
        prepared = _prepared(blocks)  # type: ignore[arg-type]  # host arrays only
        store.makedirs(path)
        return _stored(blocks, prepared, writer.write_data(
            store, path, prepared, attempt=attempt, rank=rank, options=options), options)
    keys = [f"{key}#{j}" for j, (key, _, _) in enumerate(blocks)]
    buffers, done = lease_shared()
    try:
        staging = buffers.get(keys, arrays, copy_host=False)  # a host array is its own
        if writer.stages_natively(store, path, arrays):
            staged = writer.StagedWrite(store, path, keys, arrays, staging, attempt=attempt,
                                        rank=rank, options=options)
            staged.stage()
            return _stored(blocks, staged.tensors, staged.written(), options)
        stage_values(arrays, staging, threads=options.threads)
        return write_blocks(store, path, attempt, rank,
                            [(key, s, offsets) for (key, _, offsets), s in zip(blocks, staging)],
                            options)
    finally:
        done()


def _prepared(blocks: Sequence[tuple[str, np.ndarray, Sequence[int]]]) -> list[PreparedTensor]:
    """The host blocks as the writers take them (stored dtype names checked)."""
    prepared = []
    for j, (key, arr, _) in enumerate(blocks):
        try:
            name = dtype_name(arr.dtype)
        except TypeError as e:
            raise TypeError(f"{key!r}: {e}") from None
        prepared.append(PreparedTensor(f"{key}#{j}", little_endian(arr), name))
    return prepared


def _stored(blocks: Sequence[tuple[str, Any, Sequence[int]]], prepared: list[PreparedTensor],
            data: writer.WrittenData, options: IOOptions) -> list[StoredBlock]:
    """Where each block landed (``data``: what the writers wrote); each block's CRCs
    are a view of the worker's CRC column."""
    crcs = np.asarray(data.crcs, dtype=np.uint32)
    ends = np.cumsum(-(-data.nbytes // options.chunk_size)).tolist()
    files, file_idx, offsets = data.files, data.file.tolist(), data.offset.tolist()
    out = []
    start = 0
    for (key, arr, offs), n, f, off, end, p in zip(blocks, data.nbytes.tolist(), file_idx,
                                                   offsets, ends, prepared):
        out.append(StoredBlock(key, files[f] if n else None, off, n, crcs[start:end],
                               p.dtype_name, tuple(map(int, offs)), tuple(map(int, arr.shape))))
        start = end
    return out


def _check(t: PlannedTensor) -> None:
    rank = len(t.shape)
    for b in t.blocks:
        if b.dtype != t.dtype:
            raise ValueError(f"{t.key!r}: a block at {b.offsets} was written as {b.dtype}, "
                             f"the tensor is {t.dtype}")
        if len(b.offsets) != rank or len(b.shape) != rank:
            raise ValueError(f"{t.key!r}: block at {b.offsets} of shape {b.shape} does not "
                             f"match the tensor's rank ({t.shape})")
    if len(t.blocks) == 1 and t.blocks[0].shape == t.shape and not any(t.blocks[0].offsets):
        return  # one block, the whole tensor (the common case: no partition to check)
    problem = check_partition(t.shape, [(b.offsets, b.shape) for b in t.blocks])
    if problem is not None:
        raise ValueError(f"{t.key!r} of shape {t.shape}: the written blocks do not tile it "
                         f"({problem})")


def commit_blocks(store: Store, path: str, attempt: Attempt,
                  tensors: Sequence[PlannedTensor], *,
                  world_size: int, tree: Any = None, extra_info: dict | None = None,
                  options: IOOptions = DEFAULT) -> None:
    """Step 3 (coordinator): validates the blocks, commits the index, ends the attempt.
    Raises ValueError naming the tensor when blocks are missing, overlap or disagree
    (nothing committed)."""
    try:
        validate_keys([t.key for t in tensors])
        files: dict[str, int] = {}
        entries: list[FileEntry] = []
        file_col, offset_col, nbytes_col, crcs, boxes = [], [], [], [], []
        for t in tensors:
            _check(t)
            blocks = t.blocks
            whole = len(blocks) == 1 and blocks[0].shape == t.shape
            if len(blocks) > 1:
                blocks = sorted(blocks, key=lambda b: b.offsets)
            for b in blocks:
                fi = 0
                if b.file is not None:
                    fi = files.get(b.file.name, -1)
                    if fi < 0:
                        fi = files[b.file.name] = len(entries)
                        entries.append(b.file)
                file_col.append(fi)
                offset_col.append(b.offset)
                nbytes_col.append(b.nbytes)
                crcs.append(b.crcs)
                boxes.append(None if whole else (b.offsets, b.shape))
        if extra_info and "attempt" in extra_info:
            raise ValueError("extra_info may not set 'attempt': the commit takes it from "
                             "the save's own attempt")
        doc = info(attempt.id, world_size)
        doc.update(extra_info or {})
        parts = commit.ManifestParts(
            chunk_size=options.chunk_size, files=entries,
            keys=[t.key for t in tensors], dtype_names=[t.dtype for t in tensors],
            shapes=[t.shape for t in tensors], file=np.asarray(file_col, np.int64),
            offset=np.asarray(offset_col, np.int64),
            nbytes=np.asarray(nbytes_col, np.int64),
            crcs=np.concatenate(crcs) if crcs else np.zeros(0, np.uint32),
            nblocks=np.asarray([len(t.blocks) for t in tensors], np.int64),
            box=boxes if any(b is not None for b in boxes) else None,
            tree=tree, info=doc)
        attempt.finish(parts)
    finally:
        attempt.end()
