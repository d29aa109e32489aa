"""The coordinator's planning step: validate every worker's local plan and
decide who writes what (docs/PROTOCOL.md, "Multi-worker saves", step 3).

- every key has one dtype and one global shape on all workers that hold it;
- the blocks of a sharded array lie inside it and tile it exactly (no gap, no
  overlap); identical blocks held by several workers are written once;
- replicated arrays (the same key as a whole array on several workers) are
  written once, and the writing of replicated and duplicated blocks is spread
  over their holders, balancing bytes (not all on worker 0).

Plans are columnar and the common case (every worker lists the same keys, in
the same order) is checked with numpy, so 1,000 workers x 1,000 tensors plan
in well under a second.
"""

from __future__ import annotations

import math
from typing import Sequence, TypeAlias

import numpy as np

from ..sharded.boxes import check_partition
from .plans import GlobalPlan, LocalPlan, TensorPlan


# per tensor, (ranks, items): which worker writes which of its items
_Writes: TypeAlias = "list[tuple[np.ndarray, np.ndarray]]"


class PlanError(ValueError):
    """Local plans that cannot be combined (workers disagree on a key's dtype, shape
    or kind, or blocks do not tile their array); becomes the global plan's error."""

    pass


def _tiles(gshape: tuple[int, ...], offs: np.ndarray, shps: np.ndarray) -> str | None:
    """None when the boxes tile gshape exactly (vectorized for grid-like layouts)."""
    d = len(gshape)
    offs, shps = offs[:, :d], shps[:, :d]
    if (offs < 0).any() or (offs + shps > np.asarray(gshape, dtype=np.int64)).any():
        j = int(np.nonzero(((offs < 0) | (offs + shps > np.asarray(gshape))).any(1))[0][0])
        return f"block at {tuple(offs[j])} of shape {tuple(shps[j])} exceeds {gshape}"
    vol = shps.prod(axis=1) if d else np.ones(len(offs), dtype=np.int64)
    keep = vol > 0
    offs, shps, vol = offs[keep], shps[keep], vol[keep]
    total = math.prod(gshape)
    if int(vol.sum()) != total:
        return f"blocks cover {int(vol.sum())} of {total} elements (a gap or an overlap)"
    if len(offs) <= 1 or d == 0:
        return None
    # Grid check: with the cut points of every dimension, each box must be exactly
    # one cell and no two boxes the same cell.
    cell = np.zeros(len(offs), dtype=np.int64)
    for k in range(d):
        cuts = np.unique(np.concatenate([offs[:, k], offs[:, k] + shps[:, k]]))
        lo = np.searchsorted(cuts, offs[:, k])
        hi = np.searchsorted(cuts, offs[:, k] + shps[:, k])
        if (hi - lo != 1).any():
            boxes = [(tuple(map(int, o)), tuple(map(int, s))) for o, s in zip(offs, shps)]
            return check_partition(gshape, boxes)  # irregular layout: exact sweep
        cell = cell * (len(cuts) - 1) + lo
    if len(np.unique(cell)) != len(cell):
        return "two blocks overlap"
    return None


class _Balancer:
    """Assigns blocks to one of their holders, lightest holder first."""

    def __init__(self, world: int) -> None:
        self.load = np.zeros(world, dtype=np.int64)

    def pick(self, holders: np.ndarray, nbytes: int) -> int:
        r = int(holders[np.argmin(self.load[holders])])
        self.load[r] += nbytes
        return r


def plan_global(plans: Sequence[LocalPlan], attempt: str) -> tuple[GlobalPlan, list[TensorPlan]]:
    """The global plan (for every worker) and the tensor layout (for the manifest)."""
    errors = [f"rank {p.rank}: {p.error}" for p in plans if p.error]
    if errors:
        return GlobalPlan(attempt, tuple(np.zeros(0, np.int64) for _ in plans),
                          "; ".join(errors)), []
    try:
        if all(p.keys == plans[0].keys for p in plans):
            tensors, writes = _plan_aligned(plans)
        else:
            tensors, writes = _plan_general(plans)
    except PlanError as e:
        return GlobalPlan(attempt, tuple(np.zeros(0, np.int64) for _ in plans), str(e)), []
    return GlobalPlan(attempt, _per_rank(writes, len(plans))), tensors


def _per_rank(writes: list[tuple[np.ndarray, np.ndarray]], world: int) -> tuple[np.ndarray, ...]:
    """(rank, item) pairs of every tensor -> per rank, its items to write, sorted."""
    if not writes:
        return tuple(np.zeros(0, np.int64) for _ in range(world))
    ranks = np.concatenate([w[0] for w in writes])
    items = np.concatenate([w[1] for w in writes])
    order = np.lexsort((items, ranks))
    ranks, items = ranks[order], items[order]
    bounds = np.searchsorted(ranks, np.arange(world + 1))
    return tuple(items[bounds[r]:bounds[r + 1]].astype(np.int64) for r in range(world))


def _check_meta(key: str, plans: Sequence[LocalPlan],
                idx: Sequence[int] | np.ndarray) -> tuple[str, tuple]:
    dts = {p.dtypes[i] for p, i in zip(plans, idx)}
    shapes = {p.global_shapes[i] for p, i in zip(plans, idx)}
    if len(dts) > 1 or len(shapes) > 1:
        raise PlanError(f"workers disagree on {key!r}: dtypes {sorted(dts)}, "
                        f"global shapes {sorted(shapes)}")
    kinds = {bool(p.sharded[i]) for p, i in zip(plans, idx)}
    if len(kinds) > 1:
        raise PlanError(f"{key!r} is a ShardedArray on some workers and a plain array on others")
    return dts.pop(), shapes.pop()


def _assign(key: str, dtype: str, gshape: tuple, sharded: bool, ranks: np.ndarray,
            items: np.ndarray, offs: np.ndarray, shps: np.ndarray, nbytes: np.ndarray,
            bal: _Balancer, writes: list[tuple[np.ndarray, np.ndarray]]) -> TensorPlan:
    d = len(gshape)
    if not sharded:
        r = bal.pick(ranks, int(nbytes[0]))
        j = int(np.nonzero(ranks == r)[0][0])
        writes.append((ranks[j:j + 1], items[j:j + 1]))
        return TensorPlan(key, dtype, gshape, np.array([r]), items[j:j + 1], None, None)
    boxes = np.concatenate([offs[:, :d], shps[:, :d]], axis=1)
    uniq, first, inverse = np.unique(boxes, axis=0, return_index=True, return_inverse=True)
    problem = _tiles(gshape, uniq[:, :d], uniq[:, d:])
    if problem:
        raise PlanError(f"ShardedArray {key!r}: {problem}")
    if len(uniq) == len(boxes):  # every block held once: its holder writes it
        chosen = first
        np.add.at(bal.load, ranks[chosen], nbytes[chosen])
    else:  # identical blocks on several workers: the lightest holder writes each
        inverse = inverse.reshape(-1)
        order = np.argsort(inverse, kind="stable")
        starts = np.searchsorted(inverse[order], np.arange(len(uniq)))
        ends = np.append(starts[1:], len(order))
        chosen = np.empty(len(uniq), dtype=np.int64)
        for u in range(len(uniq)):
            group = order[starts[u]:ends[u]]
            j = int(group[np.argmin(bal.load[ranks[group]])])
            bal.load[ranks[j]] += int(nbytes[j])
            chosen[u] = j
    w_ranks, w_items = ranks[chosen], items[chosen]
    writes.append((w_ranks, w_items))
    return TensorPlan(key, dtype, gshape, w_ranks, w_items, uniq[:, :d].copy(), uniq[:, d:].copy())


def _plan_aligned(plans: Sequence[LocalPlan]) -> tuple[list[TensorPlan], _Writes]:
    world = len(plans)
    n = len(plans[0].keys)
    if not n:
        return [], []
    ranks = np.arange(world)
    offs = np.stack([p.offsets for p in plans])   # [world, n, D]
    shps = np.stack([p.shapes for p in plans])
    nb = np.stack([p.nbytes for p in plans])       # [world, n]
    sharded = np.stack([p.sharded for p in plans])
    dt = [p.dtypes for p in plans]
    gs = [p.global_shapes for p in plans]
    bal = _Balancer(world)
    writes: list[tuple[np.ndarray, np.ndarray]] = []
    tensors: list[TensorPlan] = []
    items_col = np.empty(world, dtype=np.int64)
    same_meta = all(d == dt[0] for d in dt) and all(g == gs[0] for g in gs)
    if not ((sharded.all(0) | ~sharded.any(0)).all() and same_meta):
        for i, key in enumerate(plans[0].keys):
            _check_meta(key, plans, [i] * world)
    for i, key in enumerate(plans[0].keys):
        dtype, gshape = dt[0][i], gs[0][i]
        items_col.fill(i)
        tensors.append(_assign(key, dtype, gshape, bool(sharded[0, i]), ranks, items_col.copy(),
                               offs[:, i], shps[:, i], nb[:, i], bal, writes))
    return tensors, writes


def _plan_general(plans: Sequence[LocalPlan]) -> tuple[list[TensorPlan], _Writes]:
    world = len(plans)
    holders: dict[str, list[tuple[int, int]]] = {}
    for p in plans:
        for i, k in enumerate(p.keys):
            holders.setdefault(k, []).append((p.rank, i))
    bal = _Balancer(world)
    writes: list[tuple[np.ndarray, np.ndarray]] = []
    tensors: list[TensorPlan] = []
    for key, hs in holders.items():
        ranks = np.array([r for r, _ in hs])
        items = np.array([i for _, i in hs])
        sub = [plans[r] for r in ranks]
        dtype, gshape = _check_meta(key, sub, items)
        offs = np.stack([plans[r].offsets[i] for r, i in hs])
        shps = np.stack([plans[r].shapes[i] for r, i in hs])
        nb = np.array([plans[r].nbytes[i] for r, i in hs])
        tensors.append(_assign(key, dtype, gshape, bool(plans[hs[0][0]].sharded[hs[0][1]]), ranks,
                               items, offs, shps, nb, bal, writes))
    return tensors, writes
