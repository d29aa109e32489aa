"""The coordinator's planning step: validate every worker's local plan and
decide who writes what (docs/PROTOCOL.md, "Multi-worker saves", step 3).

- every key has one dtype and one global shape on all workers that hold it;
- the blocks of a sharded array lie inside it and tile it exactly (no gap, no
  overlap); identical blocks held by several workers are written once;
- replicated arrays (the same key as a whole array on several workers) must be
  the same everywhere: their digests (CRC-32C of their bytes) are compared, and a
  difference is refused, naming the key and the ranks (state that differs per
  worker is declared ``PerWorker``); they are written once, and the writing of
  replicated and duplicated blocks is spread over their holders, balancing bytes
  (not all on worker 0);
- a ``PerWorker`` value is a tensor of shape ``(world, *shape)`` whose row i is
  worker i's block, held by every worker with one dtype and shape.

Plans are columnar and the common case (every worker lists the same keys, in
the same order) is checked with numpy, so 1,000 workers x 1,000 tensors plan
in well under a second.
"""

from __future__ import annotations

import math
from typing import Sequence, TypeAlias

import numpy as np

from ..errors import PlanError
from ..sharded.boxes import check_partition
from .plans import GlobalPlan, LocalPlan, TensorPlan


# per tensor, (ranks, items): which worker writes which of its items
_Writes: TypeAlias = "list[tuple[np.ndarray, np.ndarray]]"


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


def _is_per_worker(p: LocalPlan, i: int) -> bool:
    return p.per_worker is not None and bool(p.per_worker[i])


def _ranks(ranks: Sequence[int], limit: int = 8) -> str:
    shown = ", ".join(str(int(r)) for r in ranks[:limit])
    return shown + (f", ... ({len(ranks)} ranks)" if len(ranks) > limit else "")


def _check_meta(key: str, plans: Sequence[LocalPlan],
                idx: Sequence[int] | np.ndarray) -> tuple[str, tuple]:
    per_worker = [_is_per_worker(p, i) for p, i in zip(plans, idx)]
    if any(per_worker) and not all(per_worker):
        declared = [p.rank for p, pw in zip(plans, per_worker) if pw]
        others = [p.rank for p, pw in zip(plans, per_worker) if not pw]
        raise PlanError(f"{key!r} is declared pyckpt.PerWorker on ranks {_ranks(declared)} "
                        f"but not on ranks {_ranks(others)}: every worker must declare it")
    dts = {p.dtypes[i] for p, i in zip(plans, idx)}
    shapes = {p.global_shapes[i] for p, i in zip(plans, idx)}
    if len(dts) > 1 or len(shapes) > 1:
        if any(per_worker):
            raise PlanError(f"PerWorker value {key!r} must have one dtype and shape on every "
                            f"worker: dtypes {sorted(dts)}, shapes "
                            f"{sorted({s[1:] for s in shapes})}")
        raise PlanError(f"workers disagree on {key!r}: dtypes {sorted(dts)}, "
                        f"global shapes {sorted(shapes)}")
    kinds = {bool(p.sharded[i]) for p, i in zip(plans, idx)}
    if len(kinds) > 1:
        raise PlanError(f"{key!r} is a ShardedArray on some workers and a plain array on others")
    return dts.pop(), shapes.pop()


def _differ(keys: Sequence[str], ranks: Sequence[np.ndarray],
            digests: Sequence[np.ndarray]) -> PlanError:
    """The refusal of replicated values whose copies differ: each key with its
    holders' ranks grouped by value."""
    shown = []
    for key, rs, ds in list(zip(keys, ranks, digests))[:10]:
        groups: dict[int, list[int]] = {}
        for r, d in zip(rs, ds):
            groups.setdefault(int(d), []).append(int(r))
        shown.append(f"{key!r} (ranks grouped by value: "
                     f"{' | '.join(_ranks(g) for g in groups.values())})")
    more = f" and {len(keys) - 10} more key(s)" if len(keys) > 10 else ""
    return PlanError(
        f"values saved under one key differ between workers: {'; '.join(shown)}{more}. A plain "
        "value that several workers save under one key is stored once, so every copy must be "
        "the same; declare state that differs per worker (random number generator states, "
        "data positions) with pyckpt.PerWorker(value), which keeps each worker's copy")


def _check_replicas(keys: Sequence[str], ranks: Sequence[np.ndarray],
                    digests: Sequence[np.ndarray]) -> None:
    """PlanError when the copies of a replicated value differ (their digests)."""
    bad = [j for j, d in enumerate(digests) if len(d) > 1 and (d != d[0]).any()]
    if bad:
        raise _differ([keys[j] for j in bad], [ranks[j] for j in bad], [digests[j] for j in bad])


def _assign(key: str, dtype: str, gshape: tuple, sharded: bool, ranks: np.ndarray,
            items: np.ndarray, offs: np.ndarray, shps: np.ndarray, nbytes: np.ndarray,
            bal: _Balancer, writes: list[tuple[np.ndarray, np.ndarray]],
            per_worker: bool = False) -> TensorPlan:
    d = len(gshape)
    if not sharded:
        r = bal.pick(ranks, int(nbytes[0]))
        j = int(np.nonzero(ranks == r)[0][0])
        writes.append((ranks[j:j + 1], items[j:j + 1]))
        return TensorPlan(key, dtype, gshape, np.array([r]), items[j:j + 1], None, None)
    boxes = np.concatenate([offs[:, :d], shps[:, :d]], axis=1)
    uniq, first, inverse = np.unique(boxes, axis=0, return_index=True, return_inverse=True)
    problem = _tiles(gshape, uniq[:, :d], uniq[:, d:])
    if problem and per_worker:
        raise PlanError(f"PerWorker value {key!r} is saved by ranks {_ranks(sorted(ranks))} "
                        f"only: every one of the {gshape[0]} workers must save it")
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
    return TensorPlan(key, dtype, gshape, w_ranks, w_items, uniq[:, :d].copy(), uniq[:, d:].copy(),
                      per_worker)


def _padded(boxes: list[np.ndarray], fill: int) -> list[np.ndarray]:
    """Box columns of workers whose plans have different ``ndim_max`` (the largest rank
    of their items), padded along the last axis to the largest (offsets with 0,
    shapes with 1), so they stack."""
    d = max(b.shape[-1] for b in boxes)
    return [b if b.shape[-1] == d else
            np.concatenate([b, np.full(b.shape[:-1] + (d - b.shape[-1],), fill, b.dtype)], -1)
            for b in boxes]


def _plan_aligned(plans: Sequence[LocalPlan]) -> tuple[list[TensorPlan], _Writes]:
    world = len(plans)
    n = len(plans[0].keys)
    if not n:
        return [], []
    ranks = np.arange(world)
    offs = np.stack(_padded([p.offsets for p in plans], 0))   # [world, n, D]
    shps = np.stack(_padded([p.shapes for p in plans], 1))
    nb = np.stack([p.nbytes for p in plans])       # [world, n]
    sharded = np.stack([p.sharded for p in plans])
    dt = [p.dtypes for p in plans]
    gs = [p.global_shapes for p in plans]
    bal = _Balancer(world)
    writes: list[tuple[np.ndarray, np.ndarray]] = []
    tensors: list[TensorPlan] = []
    items_col = np.empty(world, dtype=np.int64)
    pw = np.stack([p.per_worker if p.per_worker is not None else np.zeros(n, bool)
                   for p in plans])
    same_meta = all(d == dt[0] for d in dt) and all(g == gs[0] for g in gs)
    if not ((sharded.all(0) | ~sharded.any(0)).all() and (pw.all(0) | ~pw.any(0)).all()
            and same_meta):
        for i, key in enumerate(plans[0].keys):
            _check_meta(key, plans, [i] * world)
    digests = [p.digest for p in plans]
    if world > 1 and all(d is not None for d in digests):
        dig = np.stack(digests)  # type: ignore[arg-type]  # [world, n], none is None
        bad = np.nonzero(~sharded[0] & (dig != dig[0]).any(0))[0]
        if len(bad):
            raise _differ([plans[0].keys[i] for i in bad], [ranks] * len(bad),
                          [dig[:, i] for i in bad])
    for i, key in enumerate(plans[0].keys):
        dtype, gshape = dt[0][i], gs[0][i]
        items_col.fill(i)
        tensors.append(_assign(key, dtype, gshape, bool(sharded[0, i]), ranks, items_col.copy(),
                               offs[:, i], shps[:, i], nb[:, i], bal, writes, bool(pw[0, i])))
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
    metas = []
    for key, hs in holders.items():
        ranks = np.array([r for r, _ in hs])
        items = np.array([i for _, i in hs])
        metas.append(_check_meta(key, [plans[r] for r in ranks], items))
    if all(p.digest is not None for p in plans):
        replicated = [(k, hs) for k, hs in holders.items() if not plans[hs[0][0]].sharded[hs[0][1]]]
        _check_replicas([k for k, _ in replicated],
                        [np.array([r for r, _ in hs]) for _, hs in replicated],
                        [np.array([plans[r].digest[i] for r, i in hs])  # type: ignore[index]
                         for _, hs in replicated])
    for (key, hs), (dtype, gshape) in zip(holders.items(), metas):
        ranks = np.array([r for r, _ in hs])
        items = np.array([i for _, i in hs])
        offs = np.stack(_padded([plans[r].offsets[i] for r, i in hs], 0))
        shps = np.stack(_padded([plans[r].shapes[i] for r, i in hs], 1))
        nb = np.array([plans[r].nbytes[i] for r, i in hs])
        r0, i0 = hs[0]
        tensors.append(_assign(key, dtype, gshape, bool(plans[r0].sharded[i0]), ranks,
                               items, offs, shps, nb, bal, writes,
                               _is_per_worker(plans[r0], i0)))
    return tensors, writes
