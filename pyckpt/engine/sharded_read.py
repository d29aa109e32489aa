"""Reading sharded arrays (stored as several blocks) and resharding: filling any
box of a global array from the stored blocks that overlap it.

Blocks overlapping a wanted box are found with an interval index over the
blocks' first dimension (sorted starts plus a running maximum of ends), not by
scanning every block. Only the rows of a block that the box needs are read,
widened to whole checksum chunks, and the C++ reader verifies them. A block
that lies entirely inside the wanted box is read straight into its place in
the destination (a strided copy in C++); partial overlaps go through a buffer
the size of the rows read.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any, Sequence

import numpy as np

from ..sharded import ShardedArray

if TYPE_CHECKING:  # for signatures only (reader.py imports this module)
    from .reader import OpenCheckpoint


class BlockIndex:
    """The stored blocks of one tensor, queryable by box."""

    def __init__(self, ck: "OpenCheckpoint", i: int) -> None:
        m = ck.manifest
        b = m.blocks
        self.shape = m.shapes[i]
        self.dtype = m.dtype(i)
        self.key = m.keys[i]
        j0, j1 = int(b.tensor_begin[i]), int(b.tensor_begin[i + 1])
        self.blocks = np.arange(j0, j1)
        d = len(self.shape)
        offs = np.zeros((j1 - j0, d), dtype=np.int64)
        shps = np.tile(np.asarray(self.shape, dtype=np.int64), (j1 - j0, 1)) if d else \
            np.zeros((j1 - j0, 0), dtype=np.int64)
        if b.box is not None:
            for k, j in enumerate(range(j0, j1)):
                if b.box[j] is not None:
                    offs[k], shps[k] = b.box[j]
        self.offs, self.shps = offs, shps
        if d:
            self.order = np.argsort(offs[:, 0], kind="stable")
            self.starts = offs[self.order, 0]
            self.max_end = np.maximum.accumulate((offs + shps)[self.order, 0])

    def query(self, lo: Sequence[int], shape: Sequence[int]) -> np.ndarray:
        """Positions (into self.blocks) of stored blocks overlapping box [lo, lo+shape)."""
        if not len(self.shape):
            return np.arange(len(self.blocks))
        lo_a = np.asarray(lo, dtype=np.int64)
        hi = lo_a + np.asarray(shape, dtype=np.int64)
        if (hi <= lo_a).any():
            return np.zeros(0, dtype=np.int64)
        first = int(np.searchsorted(self.max_end, lo_a[0], side="right"))
        last = int(np.searchsorted(self.starts, hi[0], side="left"))
        cand = self.order[first:last]
        o, s = self.offs[cand], self.shps[cand]
        hit = ((o < hi) & (o + s > lo_a)).all(axis=1) & (s > 0).all(axis=1)
        return cand[hit]


class _Job:
    """One read: block rows [r0, r1) to copy into a destination sub-box."""

    __slots__ = ("key", "block", "lo", "hi", "dst", "buf", "take", "out")

    def __init__(self, key: str, block: int, lo: int, hi: int, dst: np.ndarray | None,
                 buf: np.ndarray | None = None, take: Any = None, out: Any = None) -> None:
        self.key, self.block, self.lo, self.hi = key, block, lo, hi
        self.dst, self.buf, self.take, self.out = dst, buf, take, out


def _jobs_for(ck: "OpenCheckpoint", idx: BlockIndex, t_lo: tuple, t_shape: tuple,
              target: np.ndarray) -> list[_Job]:
    """Reads that fill target (the box [t_lo, t_lo+t_shape) of the tensor)."""
    m = ck.manifest
    cs = m.chunk_size
    item = idx.dtype.itemsize
    jobs = []
    d = len(idx.shape)
    for k in idx.query(t_lo, t_shape):
        j = int(idx.blocks[k])
        bo, bs = idx.offs[k], idx.shps[k]
        nbytes = int(m.blocks.nbytes[j])
        if d == 0:
            jobs.append(_Job(idx.key, j, 0, nbytes, target))
            continue
        ilo = np.maximum(bo, t_lo)
        ihi = np.minimum(bo + bs, np.asarray(t_lo) + np.asarray(t_shape))
        dst_sl = tuple(slice(int(a - t), int(b - t)) for a, b, t in zip(ilo, ihi, t_lo))
        dst = target[dst_sl]
        if (ilo == bo).all() and (ihi == bo + bs).all():  # the whole block lands in target
            jobs.append(_Job(idx.key, j, 0, nbytes, dst))
            continue
        row = math.prod(int(x) for x in bs[1:]) * item
        r0, r1 = int(ilo[0] - bo[0]), int(ihi[0] - bo[0])
        lo, hi = r0 * row, r1 * row
        lo_c, hi_c = lo // cs * cs, min(-(-hi // cs) * cs, nbytes)
        buf = np.empty(hi_c - lo_c, dtype=np.uint8)
        take = (slice(lo - lo_c, hi - lo_c), (r1 - r0, *(int(x) for x in bs[1:])),
                (slice(None),) + tuple(slice(int(a - o), int(b - o))
                                       for a, b, o in zip(ilo[1:], ihi[1:], bo[1:])))
        jobs.append(_Job(idx.key, j, lo_c, hi_c, None, buf, take, dst))
    return jobs


def _run(ck: "OpenCheckpoint", jobs: list[_Job]) -> None:
    if not jobs:
        return
    plan = ck.plan_ranges([j.key for j in jobs], np.array([j.block for j in jobs]),
                          np.array([j.lo for j in jobs]), np.array([j.hi for j in jobs]))
    ck.read_blocks(plan, [j.dst if j.buf is None else j.buf for j in jobs])
    for j in jobs:
        if j.buf is not None:
            rows, shape, sl = j.take
            src = j.buf[rows].view(j.out.dtype).reshape(shape)[sl]
            np.copyto(j.out, src)


def read_whole(ck: "OpenCheckpoint", indices: Sequence[int]) -> list[np.ndarray]:
    """Whole arrays assembled from their blocks (one process loading everything)."""
    m = ck.manifest
    out, jobs = [], []
    for i in indices:
        arr = np.empty(m.shapes[i], dtype=m.dtype(i))
        idx = BlockIndex(ck, i)
        jobs.extend(_jobs_for(ck, idx, (0,) * arr.ndim, arr.shape, arr))
        out.append(arr)
    _run(ck, jobs)
    return out


def read_into_targets(ck: "OpenCheckpoint", targets: Sequence[tuple[int, Any]]) -> None:
    """Fills ShardedArray blocks (any layout) or whole arrays from stored tensors."""
    jobs = []
    for i, target in targets:
        idx = BlockIndex(ck, i)
        if isinstance(target, ShardedArray):
            jobs.extend(_jobs_for(ck, idx, target.offsets, target.local.shape, target.local))
        else:
            jobs.extend(_jobs_for(ck, idx, (0,) * target.ndim, target.shape, target))
    _run(ck, jobs)


def verify_sharded(ck: "OpenCheckpoint", indices: Sequence[int]) -> None:
    """Reads and verifies every block of the sharded tensors ``indices``."""
    m = ck.manifest
    b = m.blocks
    blocks = np.concatenate([np.arange(b.tensor_begin[i], b.tensor_begin[i + 1]) for i in indices])
    keys = []
    for i in indices:
        keys.extend([m.keys[i]] * int(b.tensor_begin[i + 1] - b.tensor_begin[i]))
    plan = ck.plan_ranges(keys, blocks, np.zeros(len(blocks), np.int64), b.nbytes[blocks])
    ck.read_blocks(plan, [None] * len(blocks))
