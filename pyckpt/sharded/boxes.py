"""Boxes (hyper-rectangles ``[offsets, offsets + shape)``) of a global array.

``check_partition`` decides whether boxes tile an array exactly in O(n log n) for n
boxes (times a factor of the dimensions the boxes split), by their signed corners:
for the coverage function f (how many boxes hold each element) and the mixed
difference D = D_1 ... D_d (D_k f(x) = f(x) - f(x - e_k)), D of one box is +-1 at
its 2^d corners and 0 elsewhere, and D is one-to-one on functions of finite
support (summing undoes it). So the boxes tile the array exactly (f is 1 on the
array, 0 elsewhere) if and only if their corners, with signs, add up to the
array's own corners. The corners are added one dimension at a time: a box's
interval in that dimension becomes its two ends (+ at the start, - at the end),
and equal records cancel before the next dimension. Where the boxes are rows,
columns or any grid, the records of neighbours cancel at once and the work stays
near n; boxes that split k dimensions irregularly make up to 2^k records each,
and layouts whose records would add up to more than ``WORK_PER_CELL`` times
the input's numbers are refused (as too irregular to check) rather than checked
slowly: time and memory stay within a fixed factor of the input's size.
"""

from __future__ import annotations

import math
from typing import Sequence

import numpy as np

Box = tuple[tuple[int, ...], tuple[int, ...]]

#: boxes checked pairwise (no numpy) up to this many
PAIRWISE = 8
#: the corner records made in all may hold this many numbers per number of the input
WORK_PER_CELL = 32


def intersect(a: Box, b: Box) -> Box | None:
    """The intersection of two boxes, or None when it is empty."""
    lo = tuple(max(x, y) for x, y in zip(a[0], b[0]))
    hi = tuple(min(x + s, y + t) for x, s, y, t in zip(a[0], a[1], b[0], b[1]))
    if any(h <= l for l, h in zip(lo, hi)):
        return None
    return lo, tuple(h - l for l, h in zip(lo, hi))


def check_partition(shape: Sequence[int], boxes: Sequence[Box]) -> str | None:
    """None when the non-empty boxes tile ``shape`` exactly (no gap, no overlap, none
    outside), else a description of the first problem found. O(n log n) for n boxes
    forming rows, columns, grids or other layouts splitting few dimensions
    irregularly; layouts too irregular to check within a work bound proportional to
    n are refused with a description saying so (module doc)."""
    shape = tuple(shape)
    total = math.prod(shape)
    vols = [math.prod(s) for _, s in boxes]
    nonempty = [b for b, v in zip(boxes, vols) if v > 0]
    covered = sum(v for v in vols if v > 0)
    if len(nonempty) <= PAIRWISE:
        return _pairwise(shape, nonempty, covered, total)
    try:
        lo = np.array([b[0] for b in nonempty], dtype=np.int64)
        size = np.array([b[1] for b in nonempty], dtype=np.int64)
        g = np.array(shape, dtype=np.int64)
        ok = lo.shape == size.shape == (len(nonempty), len(shape))
    except (ValueError, OverflowError):  # ragged ranks, or numbers beyond int64
        ok = False
    if not ok:
        return _pairwise(shape, nonempty, covered, total, inside_only=True) or \
            "blocks of another rank than the array's, or of impossible sizes"
    hi = lo + size
    out = ((lo < 0) | (size < 0) | (hi > g)).any(axis=1)
    if out.any():
        o, s = nonempty[int(np.nonzero(out)[0][0])]
        return f"block at {tuple(o)} of shape {tuple(s)} is not inside {shape}"
    if covered != total:
        return f"blocks cover {covered} of {total} elements"
    return _corners(shape, nonempty, lo, hi)


def _pairwise(shape: tuple[int, ...], boxes: Sequence[Box], covered: int, total: int,
              inside_only: bool = False) -> str | None:
    """check_partition of a few boxes, each pair compared."""
    for o, s in boxes:
        if len(o) != len(shape) or len(s) != len(shape) or any(
                x < 0 or n < 0 or x + n > g for x, n, g in zip(o, s, shape)):
            return f"block at {tuple(o)} of shape {tuple(s)} is not inside {shape}"
    if inside_only:
        return None
    if covered != total:
        return f"blocks cover {covered} of {total} elements"
    for i, a in enumerate(boxes):
        for b in boxes[i + 1:]:
            if intersect(a, b) is not None:
                return f"blocks at {tuple(a[0])} and {tuple(b[0])} overlap"
    return None


def _corners(shape: tuple[int, ...], boxes: Sequence[Box], lo: np.ndarray,
             hi: np.ndarray) -> str | None:
    """The signed-corner check (module doc) of boxes [lo, hi) inside ``shape`` whose
    volumes add up to the array's."""
    g = np.array(shape, dtype=np.int64)
    # dimensions no box splits add nothing: leave them out
    split = np.nonzero(~((lo == 0).all(axis=0) & (hi == g).all(axis=0)))[0]
    d = len(split)
    if d == 0:  # several boxes, each the whole array
        return f"blocks at {tuple(boxes[0][0])} and {tuple(boxes[1][0])} overlap"
    # one record per box, [starts..., stops...] of the split dimensions, weight 1, and
    # the array itself with weight -1: all records must cancel
    rows = np.vstack([np.hstack([lo[:, split], hi[:, split]]),
                      np.concatenate([np.zeros(d, np.int64), g[split]])[None, :]])
    weight = np.ones(len(rows), dtype=np.int64)
    weight[-1] = -1
    budget, work = WORK_PER_CELL * rows.size, 0
    for k in range(d):
        # a record: the ends chosen in dimensions < k, then the starts and the stops of
        # the dimensions >= k (w of each); dimension k becomes its start (+) and stop (-)
        w = d - k
        work += 2 * len(rows) * (rows.shape[1] - 1)
        if work > budget:
            return (f"the {len(boxes)} blocks split {d} dimensions too irregularly to be "
                    "checked (pyckpt refuses such layouts)")
        ends, starts, stops = rows[:, :k], rows[:, k:k + w], rows[:, k + w:]
        rest = [starts[:, 1:], stops[:, 1:]]
        rows, weight = _cancel(np.vstack([np.hstack([ends, starts[:, :1], *rest]),
                                          np.hstack([ends, stops[:, :1], *rest])]),
                               np.concatenate([weight, -weight]))
        if not len(rows):
            return None
    # left: corners whose signed counts differ from the array's; the lexicographically
    # first is an element held by no block or by several (module doc)
    at = np.zeros(len(shape), dtype=np.int64)
    at[split] = rows[0]
    holders = np.nonzero(((lo <= at) & (at < hi)).all(axis=1))[0]
    where = tuple(int(x) for x in at)
    if len(holders) >= 2:
        a, b = boxes[int(holders[0])], boxes[int(holders[1])]
        return f"blocks at {tuple(a[0])} and {tuple(b[0])} overlap (at element {where})"
    return f"no block holds element {where} (so others overlap)"


def _cancel(rows: np.ndarray, weight: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Equal rows merged (weights added), rows of weight 0 dropped; sorted."""
    order = np.lexsort(rows.T[::-1])
    rows, weight = rows[order], weight[order]
    new = np.ones(len(rows), dtype=bool)
    new[1:] = (rows[1:] != rows[:-1]).any(axis=1)
    starts = np.nonzero(new)[0]
    sums = np.add.reduceat(weight, starts)
    keep = sums != 0
    return rows[starts[keep]], sums[keep]
