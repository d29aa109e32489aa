"""Incremental multi-worker saves (docs/PROTOCOL.md section 9b): one more round of
the save's planning collectives decides which blocks are written and which are
referenced in the base checkpoint.

After step 3 of the multi-worker save (rank 0 decided who writes each block),
in the caller's thread, with the communicator:

 3b. (every worker) fingerprint the blocks it was assigned
     (engine/fingerprints.py) and send them to rank 0 (gather);
 3c. (rank 0) choose the mode from its base (engine/incremental.py: full or
     selective); in a selective save, every block whose key, dtype, shape, box and
     chunk fingerprints equal a base block's (in a file that is there) is
     referenced instead of written; broadcast, per worker, the blocks it still
     writes (or the error: every worker raises ValueError, nothing written).

The rest of the save runs unchanged on the smaller assignment; rank 0 assembles
the index with the references and every block's fingerprints (``Reuse``).
A full save hashes in this round too: unlike a single process, the workers'
fingerprints must reach rank 0 before the index is assembled, and the round is
where they travel.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Sequence

import numpy as np

from ..engine.fingerprints import block_hashes
from ..engine.incremental import Base, Matcher, damaged, plan_mode, usable_files
from ..engine.writer import PreparedTensor
from ..storage import Store
from .comm import Communicator
from .plans import GlobalPlan, TensorPlan

__all__ = ["Reuse", "decide"]


@dataclasses.dataclass
class Reuse:
    """Rank 0's incremental decision: the base and mode, every written or referenced
    block's fingerprints by (rank, item), the referenced ones' base block index, and
    the bytes found changed (None: nothing to compare with)."""

    base: Base | None
    mode: str
    hashes: dict[tuple[int, int], str]
    blocks: dict[tuple[int, int], int]
    changed: int | None
    total: int


def _box(t: TensorPlan, b: int) -> Any:
    if t.box_offsets is None or t.box_shapes is None:
        return None
    return (tuple(int(x) for x in t.box_offsets[b]), tuple(int(x) for x in t.box_shapes[b]))


def _match(tplans: Sequence[TensorPlan], hashes: dict[tuple[int, int], str],
           nbytes: dict[tuple[int, int], int], base: Base | None, usable: list[bool] | None,
           chunk_size: int) -> tuple[dict[tuple[int, int], int], int | None]:
    """The referenced blocks (selective saves) and the bytes found changed."""
    if base is None or base.manifest.blocks.hashes is None:
        return {}, None
    match = Matcher(base, usable, chunk_size)
    found: dict[tuple[int, int], int] = {}
    for t in tplans:
        ndim = len(t.shape)
        for b in range(len(t.rank)):
            slot = (int(t.rank[b]), int(t.item[b]))
            box = _box(t, b)
            if box is not None:  # boxes are padded to the widest tensor of the plan
                box = (box[0][:ndim], box[1][:ndim])
            j = match.block(t.key, t.dtype, t.shape, box, hashes[slot])
            if j >= 0 and nbytes[slot] > 0:
                found[slot] = j
    return found, sum(n for s, n in nbytes.items() if s not in found)


def decide(comm: Communicator, store: Store, path: str, gp: GlobalPlan,
           prepared: Sequence[PreparedTensor], tplans: Sequence[TensorPlan],
           base: Base | None, options: Any) -> tuple[GlobalPlan, Reuse | None]:
    """Steps 3b-3c on every worker (module doc): the plan of what each worker still
    writes, and on rank 0 the ``Reuse`` the index is assembled with. Raises
    ValueError on every worker when a worker could not fingerprint its blocks (rank
    0's ``save.plan_save`` then ends the attempt it began in step 3)."""
    rank, world = comm.rank, comm.world_size
    mine = [prepared[int(i)] for i in gp.writes[rank]]
    try:
        report: Any = block_hashes([t.array for t in mine], options.chunk_size,
                                   options.threads)
    except Exception as e:  # noqa: BLE001 - travels to rank 0: every worker refuses
        report = f"rank {rank}: {type(e).__name__}: {e}"
    reports = comm.gather((report, [t.array.nbytes for t in mine]))
    decision: Any = None
    reuse = None
    if rank == 0:
        assert reports is not None
        errors = [r[0] for r in reports if isinstance(r[0], str)]
        if errors:
            decision = "\n".join(errors)
        else:
            hashes = {(r, int(i)): h for r in range(world)
                      for i, h in zip(gp.writes[r], reports[r][0])}
            nbytes = {(r, int(i)): n for r in range(world)
                      for i, n in zip(gp.writes[r], reports[r][1])}
            mode = plan_mode(base)
            usable = usable_files(store, base) if mode == "selective" and base else None
            found, changed = _match(tplans, hashes, nbytes, base, usable,
                                    options.chunk_size)
            if mode != "selective":
                found = {}
            elif base is not None:  # never reference data no one has checked
                bad = damaged(store, base, found.values(), options)
                if bad:
                    found = {s: j for s, j in found.items() if j not in bad}
                    changed = sum(n for s, n in nbytes.items() if s not in found)
            reuse = Reuse(base, mode, hashes, found, changed, sum(nbytes.values()))
            decision = [np.asarray([i for i in gp.writes[r] if (r, int(i)) not in found],
                                   dtype=np.int64) for r in range(world)]
    decision = comm.broadcast(decision)
    if isinstance(decision, str):  # (rank 0's plan_save ends the attempt)
        raise ValueError(f"incremental save of {store.url(path)} refused: {decision}")
    return dataclasses.replace(gp, writes=tuple(decision)), reuse
