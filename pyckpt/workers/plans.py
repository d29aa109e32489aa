"""Plans exchanged between workers of a multi-worker save: plain frozen data,
pickled by the communicator (docs/PROTOCOL.md, "Multi-worker saves")."""

from __future__ import annotations

import dataclasses

import numpy as np


@dataclasses.dataclass(frozen=True)
class LocalPlan:
    """What one worker holds. Columns over its items; boxes padded to ``ndim_max``
    (offsets with 0, shapes with 1). ``digest``: per item, a CRC-32C of a replicated
    value's bytes (0 for blocks), compared across workers by the planner;
    ``per_worker``: the items that are rows of a ``PerWorker`` value (also ``sharded``).
    None (plans built by hand, e.g. benchmarks): nothing to compare, no per-worker item."""

    rank: int
    keys: tuple[str, ...]
    dtypes: tuple[str, ...]
    global_shapes: tuple[tuple[int, ...], ...]
    sharded: np.ndarray  # bool: a ShardedArray block (else a replicated whole array)
    offsets: np.ndarray  # int64 [n, ndim_max]
    shapes: np.ndarray   # int64 [n, ndim_max]
    nbytes: np.ndarray   # int64 [n]
    error: str | None = None
    digest: np.ndarray | None = None      # uint32 [n]
    per_worker: np.ndarray | None = None  # bool [n]


@dataclasses.dataclass(frozen=True)
class GlobalPlan:
    """The coordinator's decision, sent to every worker: which of its items it writes."""

    attempt: str
    writes: tuple[np.ndarray, ...]  # per rank: indices into that rank's LocalPlan items
    error: str | None = None


@dataclasses.dataclass(frozen=True)
class TensorPlan:
    """One tensor of the checkpoint and where its blocks come from (coordinator only).

    ``rank[b]``/``item[b]``: the worker writing block b and the index of the item in
    its LocalPlan; ``box_offsets``/``box_shapes`` [nblocks, ndim], or None for a
    replicated tensor stored whole; ``per_worker``: the rows of a PerWorker value."""

    key: str
    dtype: str
    shape: tuple[int, ...]
    rank: np.ndarray
    item: np.ndarray
    box_offsets: np.ndarray | None
    box_shapes: np.ndarray | None
    per_worker: bool = False


@dataclasses.dataclass(frozen=True)
class WriteResult:
    """What one worker wrote (its files, and per written item file/offset/nbytes/CRCs),
    or the error that stopped it."""

    rank: int
    files: tuple = ()
    file: np.ndarray | None = None
    offset: np.ndarray | None = None
    nbytes: np.ndarray | None = None
    crcs: np.ndarray | None = None
    crc_counts: np.ndarray | None = None
    error: str | None = None
