"""A state node (an optimizer, a scheduler: stateful.py) in a kept walk
(walk_cache.py), re-checked by reading its state dict again instead of walking it.

At each check the node's ``state_dict()`` is read afresh and compared with the
template of the walk: the same containers (dict keys, of the same types and
order; lists and tuples of the same lengths), the same text leaves (str, None,
bytes), each array leaf the same object as at the walk (a tensor, whose stamp
the walk re-checks with the graph's other values; a numpy array, whose shape and
dtype it re-checks), and each number (bool, int, float, complex, numpy scalar) of
the same type and array form, whose value is written into the walk's array of
it (a learning rate changes at every step: the snapshot takes the value of the
moment). Any difference, and a state dict that raises, ends the check: the full
walk follows, with its result and its errors.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..tree import as_array_leaf, static_leaf
from .nodes import _adapt
from .stateful import PyValue, StateNode

__all__ = ["KeptState"]

#: Leaf kinds rebuilt from a number (tree.as_array_leaf): their values are read afresh.
_NUMBERS = ("bool", "int", "float", "complex", "numpy_scalar")


class KeptState:
    """One state node of a kept walk: its object (adapted again at each check, so a
    replaced ``state_dict`` is the one called), the template of the walk, the
    template's PyValues in order, and which of them must be the same objects
    (arrays) and which are numbers read afresh."""

    __slots__ = ("obj", "template", "values", "same", "numbers")

    def __init__(self, obj: Any, template: Any, values: list[PyValue], same: list[int],
                 numbers: list[int]) -> None:
        self.obj = obj
        self.template = template
        self.values = values
        self.same = same
        self.numbers = numbers

    @classmethod
    def build(cls, obj: Any, template: Any) -> "KeptState | None":
        """The KeptState of the object of a state node just walked, or None for a state
        it does not keep (a Variable or an array subclass among its leaves)."""
        values: list[PyValue] = []
        _leaves(template, values)
        same, numbers = [], []
        for i, pv in enumerate(values):
            if pv.kind in _NUMBERS:
                if type(pv.array) is not np.ndarray or pv.array.shape != ():
                    return None
                numbers.append(i)
            elif pv.kind == "ndarray" and type(pv.value) is not np.ndarray:
                return None  # a Variable (its array can be replaced), a subclass
            else:
                same.append(i)
        return cls(obj, template, values, same, numbers)

    def arrays(self) -> list[Any]:
        """The leaves that must stay the same objects, as the walk found them."""
        values = self.values
        return [values[i].value for i in self.same]

    def holds(self) -> bool:
        """Whether the state dict read now has the walk's form (module doc); if so,
        its numbers are written into the walk's arrays of them."""
        node = _adapt(self.obj)
        if not isinstance(node, StateNode):
            return False
        try:
            state = node._get()
        except Exception:  # noqa: BLE001 - the full walk raises it, naming the object
            return False
        leaves: list[Any] = []
        if not _same(state, self.template, leaves, 0) or len(leaves) != len(self.values):
            return False
        values = self.values
        for i in self.same:
            if leaves[i] is not values[i].value:
                return False
        fresh: list[tuple[np.ndarray, np.ndarray]] = []
        for i in self.numbers:
            v, pv = leaves[i], values[i]
            if type(v) is not type(pv.value):
                return False
            got = as_array_leaf(v)
            if got is None or got[1] != pv.kind or not isinstance(got[0], np.ndarray) \
                    or got[0].dtype != pv.array.dtype:
                return False
            fresh.append((pv.array, got[0]))
        for arr, new in fresh:
            arr[()] = new
        return True


def _leaves(t: Any, out: list[PyValue]) -> None:
    """The PyValues of a template (stateful._encode's), in order."""
    tag = t[0]
    if tag == "leaf":
        out.append(t[1])
    elif tag == "d":
        for _, sub in t[1]:
            _leaves(sub, out)
    elif tag != "static":
        for sub in t[1]:
            _leaves(sub, out)


def _same(value: Any, t: Any, out: list[Any], depth: int) -> bool:
    """Whether ``value`` has the form of template ``t`` (its containers and text
    leaves, as ``stateful._encode`` would make them); its array leaves go to ``out``."""
    tag = t[0]
    if tag == "leaf":
        out.append(value)
        return True
    if tag == "static":
        return static_leaf(value) == t[1]
    if depth > 512:
        return False
    if tag == "d":
        entries = t[1]
        if not isinstance(value, dict) or len(value) != len(entries):
            return False
        for (k, sub), (vk, v) in zip(entries, value.items()):
            if type(vk) is not type(k) or vk != k or not _same(v, sub, out, depth + 1):
                return False
        return True
    if not (isinstance(value, list) if tag == "l" else
            isinstance(value, tuple) and not isinstance(value, list)):
        return False
    subs = t[1]
    if len(value) != len(subs):
        return False
    for v, sub in zip(value, subs):
        if not _same(v, sub, out, depth + 1):
            return False
    return True
