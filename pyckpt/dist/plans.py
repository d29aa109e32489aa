"""Plans exchanged between workers of a multi-worker save: plain frozen data,
pickled by the communicator (docs/PROTOCOL.md, "Multi-worker saves")."""

from __future__ import annotations

import dataclasses

import numpy as np


@dataclasses.dataclass(frozen=True)
class LocalPlan:
    """What one worker holds. Columns over its items; boxes padded to ``ndim_max``
    (offsets with 0, shapes with 1)."""

    rank: int
    keys: tuple[str, ...]
    dtypes: tuple[str, ...]
    global_shapes: tuple[tuple[int, ...], ...]
    sharded: np.ndarray  # bool: a ShardedArray block (else a replicated whole array)
    offsets: np.ndarray  # int64 [n, ndim_max]
    shapes: np.ndarray   # int64 [n, ndim_max]
    nbytes: np.ndarray   # int64 [n]
    error: str | None = None


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
    replicated tensor stored whole."""

    key: str
    dtype: str
    shape: tuple[int, ...]
    rank: np.ndarray
    item: np.ndarray
    box_offsets: np.ndarray | None
    box_shapes: np.ndarray | None


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
