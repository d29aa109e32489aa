"""Writing shard files: the one place where the chunk checksums of new data are
computed (in the C++ core, every core, GIL released).

``write_shards`` asks the store once for its fast path:

- the store has native paths for the files (``Store.native_path``, a local
  disk): the C++ core writes the files itself from several threads, computing
  each chunk's CRC-32C on the way, and fsyncs them (``_core.write_shards``);
- otherwise the core computes the CRCs (``_core.compute_checksums``), and the
  store gets the files as ``NewFile``s: a path, a size and a producer of any
  byte range of the file (``ShardLayout.fill``: ``_core.fill_range`` gathers
  the bytes straight from the tensors, padding included), so it can stream
  them in parallel parts with bounded memory (``Store.write_files``).

Staged writes (``start_staged``: copy live tensors aside while writing them)
exist only on the fast path (``can_stage``).
"""

from __future__ import annotations

import bisect
from typing import Any, Sequence

import numpy as np

from .. import progress
from .._native import core as _core
from ..storage import LeftoverUploads, NewFile, Store
from . import attempts, naming
from .options import IOOptions

__all__ = ["ShardLayout", "can_stage", "start_staged", "write_options", "write_shards"]


class ShardLayout:
    """The tensors of one shard file, sorted by offset: produces any byte range of
    the file (``fill``) without building the file in memory."""

    def __init__(self, arrays: Sequence[np.ndarray], offsets: Sequence[int], size: int) -> None:
        order = sorted(range(len(arrays)), key=lambda i: offsets[i])
        self.arrays = [arrays[i] for i in order]
        self.offsets = [int(offsets[i]) for i in order]
        self.ends = [o + a.nbytes for o, a in zip(self.offsets, self.arrays)]
        self.size = size

    def fill(self, begin: int, buf: Any) -> Any:
        """Writes file bytes [begin, begin + len(buf)) into buf (the GIL released)."""
        end = begin + len(buf)
        lo = bisect.bisect_right(self.ends, begin)
        hi = bisect.bisect_left(self.offsets, end)
        _core.fill_range(self.arrays[lo:hi], np.asarray(self.offsets[lo:hi], dtype=np.uint64),
                         begin, buf)
        return buf

    def parts(self, part_size: int) -> list[tuple[int, int]]:
        """[begin, end) of each part of at most ``part_size`` bytes ([(0, 0)] if empty)."""
        return NewFile("", self.size, self.fill).parts(part_size)


def shard_layouts(sizes: Sequence[int], arrays: Sequence[np.ndarray], file_idx: Any,
                  offsets: Any) -> list[ShardLayout]:
    """The ShardLayout of every shard file of a save (``file_idx``/``offsets``: where
    each array lies)."""
    fi, off = list(file_idx), list(offsets)
    per_file: list[tuple[list, list]] = [([], []) for _ in sizes]
    for i, a in enumerate(arrays):
        if a.nbytes:
            per_file[int(fi[i])][0].append(a)
            per_file[int(fi[i])][1].append(int(off[i]))
    return [ShardLayout(arrs, offs, int(sz)) for (arrs, offs), sz in zip(per_file, sizes)]


def write_options(options: IOOptions, whole_items: bool = False) -> _core.WriteOptions:
    """The core's write options for ``options``, reporting to the current progress
    (``whole_items``: each tensor's slices written in a row, as a ring needs)."""
    return _core.WriteOptions(chunk_size=options.chunk_size, threads=options.threads,
                              piece_size=options.piece_size, sync=options.sync,
                              progress=progress.counter(), whole_items=whole_items)




def leftovers(store: Store, path: str, attempt: str) -> LeftoverUploads:
    """What a store may clean up beside a write of ``attempt`` into the checkpoint
    ``path``: unfinished uploads of other attempts' data files there, once those
    attempts have ended (attempts.py) or are old (docs/PROTOCOL.md, section 1c)."""

    def owner(name: str) -> str | None:
        return naming.attempt_of(name) if naming.is_data_file(name) else None

    return LeftoverUploads(path, owner, attempt, lambda a: attempts.is_live(store, path, a))


def write_shards(store: Store, path: str, paths: list[str], sizes: Sequence[int], keys: list[str],
                 arrays: list[np.ndarray], file_idx: Any, offsets: Any, options: IOOptions, *,
                 attempt: str) -> np.ndarray:
    """Writes the shard files ``paths`` (in the checkpoint ``path``) of one worker and
    returns the masked CRC of every chunk of every array (in array order). Every file
    is durable and complete when it returns; on failure the caller deletes them."""
    natives = store.native_paths(paths)
    if natives is not None:
        crcs, _ = _core.write_shards(paths=natives, file_sizes=list(sizes), keys=keys,
                                     arrays=arrays, files=file_idx, offsets=offsets,
                                     options=write_options(options))
        return crcs
    crcs, _ = _core.compute_checksums(keys=keys, arrays=arrays, options=write_options(options))
    files = [NewFile(p, lay.size, lay.fill)
             for p, lay in zip(paths, shard_layouts(sizes, arrays, file_idx, offsets))]
    store.write_files(files, leftovers=leftovers(store, path, attempt))
    return crcs


def can_stage(store: Store, path: str) -> bool:
    """Whether saves into ``path`` can overlap copying live tensors aside with writing
    them (``start_staged``): the C++ core must write the files itself."""
    return store.native_path(path) is not None


def start_staged(store: Store, paths: list[str], sizes: Sequence[int], keys: list[str],
                 staging: list[np.ndarray], live: list[np.ndarray] | None, file_idx: Any,
                 offsets: Any, options: IOOptions, ring: bool = False) -> Any:
    """Starts a staged write (``_core.StagedWrite``) of the shard files ``paths``:
    it copies ``live`` into ``staging`` itself (``stage()``), or, with ``live``
    None, the caller fills the staging buffers and calls ``mark_ready(i)`` for
    each (``device.staging``). ``ring``: the caller reuses staging memory once
    ``wait_written(i)`` said so (``device.ring``): each tensor's slices are then
    written in a row, which the ring's waits rely on."""
    natives = store.native_paths(paths)
    if natives is None:
        raise ValueError("staged saves write local files")
    return _core.start_staged_write(paths=natives, file_sizes=list(sizes), keys=keys,
                                    staging=staging, live=live, files=file_idx, offsets=offsets,
                                    options=write_options(options, whole_items=ring))
