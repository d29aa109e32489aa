"""What takes part in the object graph, without the graph itself: values
(arrays, Variables, adapter targets, PyValues), the MISSING marker and the node
test. trackable.py and object_graph.py both build on it."""

from __future__ import annotations

from typing import Any, Callable

import numpy as np

from .._dtypes import refuse_masked
from ..device.array import DeviceArray
from ..registry import node_proxy, target_view
from ..variables import Variable
from .missing import MISSING
from .stateful import PyValue, state_proxy

__all__ = ["MISSING", "Target", "value_target", "value_array", "is_value", "is_node",
           "TargetMemo", "remembered_target"]

#: What a value node saves from and restores into: (array, finish or None).
Target = tuple[np.ndarray | DeviceArray, Callable[[], None] | None]


def _adapt(obj: Any) -> Any:
    """The graph node standing for a foreign object: an adapter's (pyckpt.registry),
    else a StateNode for an object with ``state_dict()`` / ``load_state_dict()`` or a
    random generator (stateful.py); None for anything else."""
    proxy = node_proxy(obj)
    return proxy if proxy is not None else state_proxy(obj)


def value_target(obj: Any) -> Target | None:
    """(array, finish) a value node saves from and restores into (a DeviceArray for
    a value in device memory): ``finish`` (or None) must run after the array was
    filled (e.g. to copy a host copy back to its device)."""
    if isinstance(obj, Variable):
        return obj._value, None
    if isinstance(obj, np.ndarray):
        if type(obj) is not np.ndarray:
            refuse_masked(obj)
        return obj, None
    if isinstance(obj, PyValue):
        return None if obj.array is None else (obj.array, None)
    return target_view(obj)


def value_array(obj: Any) -> np.ndarray | DeviceArray | None:
    """The array a value node saves from and restores into, or None."""
    t = value_target(obj)
    return None if t is None else t[0]


def is_value(obj: Any) -> bool:
    """Whether obj is a value node: one with an array to save from and restore into
    (an ndarray, a Variable, an adapter's target)."""
    return value_array(obj) is not None


#: What a walk learnt of the objects it met: ``id(obj) -> (obj, value_target(obj))``
#: (``obj`` held so that its id cannot be reused while the memo lives).
TargetMemo = dict[int, tuple[Any, Target | None]]


def is_node(obj: Any, memo: TargetMemo | None = None) -> bool:
    """Whether obj takes part in the object graph (as a value or an object): a value,
    a container, anything with the graph protocol (``Trackable`` and adapter
    proxies: ``_pyckpt_children``), or a foreign object an adapter stands for.

    With ``memo``, the value target found for obj is recorded there, so that a
    walk visiting obj next does not ask the adapters again (``object_graph.traverse``)."""
    if isinstance(obj, (Variable, np.ndarray, list, tuple, dict, PyValue)) or \
            hasattr(type(obj), "_pyckpt_children"):
        return True
    target = value_target(obj)
    if memo is not None:
        memo[id(obj)] = (obj, target)
    return target is not None or _adapt(obj) is not None


def remembered_target(obj: Any, memo: TargetMemo) -> Target | None:
    """``value_target(obj)``, taken from ``memo`` where ``is_node`` recorded it."""
    seen = memo.pop(id(obj), None)
    if seen is not None and seen[0] is obj:
        return seen[1]
    return value_target(obj)
