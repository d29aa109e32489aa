"""Restoring a ``PerWorker`` value to its worker (docs/API.md, "Per-worker values").

``load(into=)`` (``load_into.py``) and the ``Checkpoint`` graph node
(``pyckpt/perworker_hooks.py``) both read one worker's copy through
``per_worker_read``: it picks the row (``sharded/perworker.py``,
``choose_row``), gives the destination that reads only that row, and puts the
row into the PerWorker's value once it is read.
"""

from __future__ import annotations

from typing import Any, Callable

import numpy as np

from .._dtypes import describe_dtypes, same_dtype
from ..device.array import DeviceArray
from ..registry import target_view
from ..sharded import ShardedArray
from ..sharded.perworker import PerWorker, choose_row
from ..tree import as_array_leaf, rebuild_leaf
from ..variables import Variable
from .comm import Communicator, resolve_comm

__all__ = ["per_worker_read", "place_of"]


def place_of(comm: Communicator | None) -> tuple[int, int]:
    """(rank, world size) of this worker: from ``comm``, else an initialized
    torch.distributed group, else one process (0, 1)."""
    c = resolve_comm(comm)
    return (0, 1) if c is None else (c.rank, c.world_size)


def _view(value: Any) -> tuple[Any, Callable[[], None] | None] | None:
    if isinstance(value, np.ndarray):
        return value, None
    if isinstance(value, Variable):
        return value._value, None
    return target_view(value)  # torch, JAX, user types (pyckpt.registry)


def per_worker_read(name: str, pw: PerWorker, shape: tuple[int, ...], dtype: np.dtype,
                    per_worker: bool, rank: int, world: int
                    ) -> tuple[Any, Callable[[], None]]:
    """Reading one worker's copy of the tensor ``name`` (quoted, for messages; ``shape``,
    ``dtype`` as stored) into ``pw``: the destination to fill (a ShardedArray block
    holding only the chosen row, or a whole array for a plain stored value), and what puts it into
    ``pw.value`` once filled (in place, or replacing a number). ``per_worker``,
    ``rank``, ``world``: as ``choose_row`` takes them. ValueError saying why not."""
    view = _view(pw.value)
    arr: np.ndarray | None = None
    after: Callable[[], None] | None = None
    kind = "ndarray"
    if view is not None:
        if isinstance(view[0], DeviceArray):
            raise ValueError(f"{name}: a PerWorker value in device memory cannot be loaded "
                             "into yet (load into a host array, then copy it)")
        arr, after = view
        if not arr.flags.writeable:
            raise ValueError(f"{name}: target array is read-only")
        if not same_dtype(arr.dtype, dtype):
            ours, theirs = describe_dtypes(dtype, arr.dtype)
            raise ValueError(f"{name}: checkpoint has dtype {ours}, the PerWorker target "
                             f"{theirs}")
        want = tuple(arr.shape)
    else:
        leaf = as_array_leaf(pw.value)
        if leaf is None:
            raise ValueError(f"{name}: cannot load into a PerWorker holding a "
                             f"{type(pw.value).__name__}")
        kind, want = leaf[1], tuple(leaf[0].shape)
    row = choose_row(name, shape, want, per_worker, pw.worker, rank, world)
    tmp = np.empty(want if row is None else (1,) + want, dtype)
    dst = tmp if row is None else ShardedArray(tmp, shape, (row,) + (0,) * len(want))

    def put() -> None:
        value = tmp.reshape(want)
        if arr is None:  # a number: replaced
            pw.value = rebuild_leaf(kind, value)
            return
        np.copyto(arr, value)
        if after is not None:
            after()

    return dst, put
