"""``pyckpt.PerWorker``: a value that each worker of a multi-worker save holds for
itself (docs/API.md, "Per-worker values"; the format: docs/FORMAT.md section 7).

A per-worker value of shape S saved by W workers is stored under its key as one
tensor of shape ``(W, *S)``, sharded by rows: row i is worker i's copy, written
by worker i. The manifest's ``info.per_worker`` lists such keys. Loading picks
the row of the loading worker (the same world size is required), or the row
asked for with ``worker=``.

This module holds the declaration and the rule that picks the row; the hooks
that make it a leaf of ``pyckpt.save`` trees and a node of ``Checkpoint``
graphs are in ``pyckpt/perworker_hooks.py``.
"""

from __future__ import annotations

import operator
from typing import Any, Iterable

from . import ShardedArray

__all__ = ["PerWorker", "INFO_KEY", "per_worker_keys", "choose_row", "row_box"]

#: The manifest ``info`` entry listing the keys stored per worker.
INFO_KEY = "per_worker"


class PerWorker:
    """Declares ``value`` (an array, a Variable, a number, or an adapter's tensor) as
    this worker's own: saved once per worker and restored to the same worker.

    ``worker`` (loading only) picks that worker's copy instead of the loading
    worker's, whatever the number of workers that saved it; a save ignores it."""

    __slots__ = ("value", "worker")

    def __init__(self, value: Any, *, worker: int | None = None) -> None:
        if isinstance(value, (PerWorker, ShardedArray)):
            raise TypeError(f"PerWorker takes one worker's value, not a {type(value).__name__}")
        if value is None or isinstance(value, (str, bytes, bytearray, dict, list, tuple)):
            raise TypeError(f"PerWorker takes one array-like value (an array, Variable, number "
                            f"or tensor), not a {type(value).__name__}: wrap each leaf")
        if worker is not None:
            if isinstance(worker, bool):
                raise TypeError("PerWorker(worker=) must be an integer worker index")
            worker = operator.index(worker)
            if worker < 0:
                raise ValueError(f"PerWorker(worker={worker}): worker indices start at 0")
        self.value = value
        self.worker = worker

    def __repr__(self) -> str:
        extra = "" if self.worker is None else f", worker={self.worker}"
        return f"PerWorker({self.value!r}{extra})"


def per_worker_keys(info: Any) -> frozenset[str]:
    """The keys a manifest's ``info`` declares per-worker (empty when none, or when the
    entry is malformed: it only steers how rows are picked, never what is read)."""
    keys = info.get(INFO_KEY) if isinstance(info, dict) else None
    if not isinstance(keys, list) or not all(isinstance(k, str) for k in keys):
        return frozenset()
    return frozenset(keys)


def _workers(n: int) -> str:
    return f"{n} worker" + ("" if n == 1 else "s")


def choose_row(key: str, stored: tuple[int, ...], target: tuple[int, ...], per_worker: bool,
               worker: int | None, rank: int, world: int) -> int | None:
    """Which stored row a PerWorker target of shape ``target`` takes from the tensor
    ``key`` (its name in messages, quoted) of shape ``stored``: a row index, or None when the
    tensor is a plain value of the target's shape (saved before the value was declared
    per-worker, or replicated), which is read whole. ``per_worker``: whether the
    checkpoint declares the tensor per-worker. ``worker``: the copy asked for, else the
    loading worker ``rank`` of ``world``. ValueError saying why no row fits."""
    if per_worker and tuple(stored[1:]) == tuple(target):
        n = stored[0]
        if worker is None:
            if n != world:
                raise ValueError(
                    f"{key} holds one value per worker, saved by {_workers(n)}; this load "
                    f"runs on {_workers(world)}: pick one worker's copy with "
                    f"pyckpt.PerWorker(target, worker=i), 0 <= i < {n}")
            return rank
        if worker >= n:
            raise ValueError(f"{key}: PerWorker(worker={worker}) asked for a copy that does "
                             f"not exist: it was saved by {_workers(n)} (0..{n - 1})")
        return worker
    if tuple(stored) == tuple(target):
        return None
    if per_worker:
        raise ValueError(f"{key}: checkpoint holds one value per worker of shape "
                         f"{tuple(stored[1:])} ({stored[0]} workers), target has shape "
                         f"{tuple(target)}")
    raise ValueError(f"{key}: checkpoint has shape {tuple(stored)}, the PerWorker target has "
                     f"shape {tuple(target)}")


def row_box(row: int, stored: Iterable[int]) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """``(global shape, offsets)`` of the block that is row ``row`` of a per-worker tensor."""
    shape = tuple(stored)
    return shape, (row,) + (0,) * (len(shape) - 1)
