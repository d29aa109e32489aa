"""Boxes (hyper-rectangles ``[offsets, offsets + shape)``) of a global array."""

from __future__ import annotations

import math
from typing import Sequence

Box = tuple[tuple[int, ...], tuple[int, ...]]


def intersect(a: Box, b: Box) -> Box | None:
    """The intersection of two boxes, or None when it is empty."""
    lo = tuple(max(x, y) for x, y in zip(a[0], b[0]))
    hi = tuple(min(x + s, y + t) for x, s, y, t in zip(a[0], a[1], b[0], b[1]))
    if any(h <= l for l, h in zip(lo, hi)):
        return None
    return lo, tuple(h - l for l, h in zip(lo, hi))


def check_partition(shape: Sequence[int], boxes: Sequence[Box]) -> str | None:
    """None when the non-empty boxes tile ``shape`` exactly (no gap, no overlap),
    else a description of the first problem."""
    total = math.prod(shape)
    nonempty = [b for b in boxes if math.prod(b[1]) > 0]
    covered = sum(math.prod(b[1]) for b in nonempty)
    if covered != total:
        return f"blocks cover {covered} of {total} elements"
    if len(nonempty) < 2:
        return None
    # Sweep along dimension 0: only boxes whose dim-0 ranges overlap can collide.
    order = sorted(nonempty, key=lambda b: b[0][0] if b[0] else 0)
    active: list[Box] = []
    for b in order:
        start = b[0][0] if b[0] else 0
        active = [a for a in active if (a[0][0] + a[1][0] if a[0] else 1) > start]
        for a in active:
            if intersect(a, b) is not None:
                return f"blocks at {a[0]} and {b[0]} overlap"
        active.append(b)
    return None
