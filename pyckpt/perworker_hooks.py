"""``pyckpt.PerWorker`` as a leaf of ``pyckpt.save`` trees and a node of
``Checkpoint`` graphs (docs/API.md, "Per-worker values").

The declaration and the rule that picks a worker's row are in
``pyckpt/sharded/perworker.py``, reading a row into a value in
``pyckpt/workers/per_worker_read.py``; saving (``workers/save.py``) and ``load(into=)``
(``load_into.py``) know PerWorker directly. This module registers its hooks in
``pyckpt.registry`` when pyckpt is imported:

- ``leaf``: in a tree, a PerWorker is a leaf whose array is its value's;
- ``node``: in an object graph, a PerWorker is a node with one edge,
  ``per_worker``, to its value (so the key of a ``Checkpoint`` attribute ``rng``
  is ``rng/per_worker/.ATTRIBUTES/VARIABLE_VALUE``). It restores as a unit: the
  stored tensor (every worker's row) is read, and this worker's row, or the row
  its ``worker`` names, is copied into the value;
- ``target``: the value under that edge (``_Row``), saved as a PerWorker.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .workers.per_worker_read import per_worker_read, place_of
from .graph.nodes import MISSING
from .registry import register_adapter, target_view
from .sharded.perworker import PerWorker
from .tree import as_array_leaf, describe_value
from .variables import Variable

__all__ = ["PerWorker", "EDGE", "register"]

#: The edge from a PerWorker node to its value in an object graph.
EDGE = "per_worker"


class _Row(PerWorker):
    """The value node under a PerWorker graph node: saved as this worker's row."""

    __slots__ = ("owner",)

    def __init__(self, owner: PerWorker) -> None:
        super().__init__(owner.value, worker=owner.worker)
        self.owner = owner


def _leaf(obj: Any) -> Any:
    """The array a PerWorker leaf of a tree saves (its value's)."""
    if type(obj) is not PerWorker:
        return None
    leaf = as_array_leaf(obj.value)
    if leaf is None:
        raise TypeError(f"cannot save PerWorker({describe_value(obj.value)}): it holds one "
                        "array-like value (an array, Variable, number or tensor)")
    return leaf[0]


def _target(obj: Any) -> Any:
    """The array of the value under a PerWorker graph node (for saving it)."""
    if not isinstance(obj, _Row):
        return None
    v = obj.value
    if isinstance(v, np.ndarray):
        return v, None
    if isinstance(v, Variable):
        return v._value, None
    view = target_view(v)
    if view is not None:
        return view
    leaf = as_array_leaf(v)  # a number: saved from a 0-d copy, restored by replacing it
    return None if leaf is None else (leaf[0], None)


class _Node:
    """The graph node standing for a PerWorker (module doc)."""

    def __init__(self, pw: PerWorker) -> None:
        self.pw = pw

    def _pyckpt_children(self) -> list[tuple[str, Any]]:
        return [(EDGE, _Row(self.pw))]

    def _pyckpt_get_child(self, name: str) -> Any:
        return _Row(self.pw) if name == EDGE else MISSING

    def _pyckpt_restore(self, values: Any) -> None:
        stored = values.get(EDGE) if isinstance(values, dict) else None
        if not isinstance(stored, np.ndarray):
            return  # nothing stored under the edge: LoadStatus reports what stayed unmatched
        rank, world = place_of(None) if self.pw.worker is None else (0, 1)
        dst, put = per_worker_read(f"Checkpoint.restore: the PerWorker value of shape "
                                   f"{stored.shape[1:]}", self.pw,
                                   tuple(stored.shape), stored.dtype, True, rank, world)
        if isinstance(dst, np.ndarray):  # a plain value: the whole of it
            dst[...] = stored
        else:  # the chosen worker's row
            dst.local[...] = stored[dst.offsets[0]:dst.offsets[0] + 1]
        put()


def _node(obj: Any) -> Any:
    return _Node(obj) if type(obj) is PerWorker else None


def register() -> None:
    """Registers the hooks (module doc); called when pyckpt is imported."""
    register_adapter("pyckpt.PerWorker", leaf=_leaf, target=_target, node=_node)
