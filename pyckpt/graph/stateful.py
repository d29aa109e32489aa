"""Stateful values in the object graph (docs/API.md section 11, docs/FORMAT.md
section 9): Python values held by lists and dicts, and objects saved through
their state dict.

- ``PyValue``: a value saved from a host array or as typed text and restored by
  *replacement* (a new object put where the old one was), not filled in place: a
  Python number, string, ``None`` or bytes in a tracked list or dict, and every
  leaf of a state dict. Numbers are 0-d tensors; strings, ``None``, bytes and
  integers beyond int64 are kept in the graph's ``state`` column.
- ``StateNode``: the graph node standing for an object with ``state_dict()`` and
  ``load_state_dict()`` (torch schedulers and optimizers, samplers, data loaders,
  user iterators) or a random generator (``pyckpt.rng.state_functions``). Its
  state dict is saved as graph values below it plus a *template*, the state dict's
  structure in the form of a flat save's tree (FORMAT.md section 8); a restore
  rebuilds the state dict exactly (dict keys, lists and tuples, bool / int / float,
  tensors as tensors) and calls ``load_state_dict``.

A template is built before keys are known: its leaves name the PyValue objects,
and ``resolve`` turns it into JSON once the graph has numbered them.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np

from ..registry import leaf_adapter
from ..rng import state_functions
from ..tree import as_array_leaf, describe_value, rebuild_leaf, static_leaf
from ..variables import Variable
from .missing import MISSING

__all__ = ["PyValue", "StateNode", "is_python_value", "state_proxy", "resolve", "warn_left_out"]

_MAX_DEPTH = 512
_PY_TYPES = (bool, int, float, complex, str, bytes, bytearray, type(None))


def is_python_value(obj: Any) -> bool:
    """A number, string, None or bytes (Python's or a numpy scalar): what a tracked
    list or dict saves as a typed value."""
    return type(obj) in _PY_TYPES or isinstance(obj, np.generic)


@dataclass(slots=True, eq=False, repr=False)
class PyValue:
    """A value of the graph restored by replacement (module doc).

    ``array`` is the host (or device) array saved for it, None for a value kept as
    text (``static``: str, None, bytes, an int beyond int64); ``kind`` says how the
    array is rebuilt (``tree.rebuild_leaf``). ``parent`` / ``name``: the list or
    dict holding it and its index or key there (None under a StateNode, whose
    state dict is rebuilt as a whole)."""

    value: Any
    array: Any
    kind: str | None
    static: Any
    parent: Any = None
    name: Any = None

    @classmethod
    def of(cls, value: Any, parent: Any = None, name: Any = None) -> "PyValue | None":
        """The PyValue of a Python value, an ndarray / Variable (under a StateNode only:
        restored as a new ndarray) or a framework array; None for anything else."""
        if isinstance(value, bytearray):
            value = bytes(value)
        if isinstance(value, (np.ndarray, Variable)) or is_python_value(value):
            leaf = as_array_leaf(value)
            if leaf is not None:
                return cls(value, leaf[0], leaf[1], None, parent, name)
            static = static_leaf(value)
            return None if static is None else cls(value, None, None, static, parent, name)
        found = leaf_adapter(value)  # a torch tensor, a jax.Array...
        if found is None:
            return None
        return cls(value, found[1], found[0], None, parent, name)

    @property
    def ident(self) -> Any:
        """What identifies this value across traversals: its place in its container
        (a new PyValue is made at each visit)."""
        return ("slot", id(self.parent), self.name) if self.parent is not None else id(self)

    def template(self) -> Any:
        """Its template: ``("leaf", self)`` for an array, ``("static", node)`` else."""
        return ("leaf", self) if self.array is not None else ("static", self.static)

    def put(self, value: Any) -> None:
        """Replaces the value in its container (without restore-on-create hooks)."""
        if isinstance(self.parent, dict):
            dict.__setitem__(self.parent, self.name, value)
        elif isinstance(self.parent, list):
            list.__setitem__(self.parent, self.name, value)
        else:
            raise TypeError(f"cannot put a value back into {describe_value(self.parent)}")
        self.value = value

    def __repr__(self) -> str:
        return f"PyValue({self.value!r})"


def resolve(template: Any, key_of: Callable[[PyValue], str]) -> Any:
    """The JSON tree (FORMAT.md section 8) of a template: leaves become their keys."""
    tag = template[0]
    if tag == "leaf":
        pv = template[1]
        key = key_of(pv)
        return key if pv.kind == "ndarray" else {"s": key, "as": pv.kind}
    if tag == "static":
        return template[1]
    if tag == "d":
        return {"d": [[k, resolve(t, key_of)] for k, t in template[1]]}
    return {tag: [resolve(t, key_of) for t in template[1]]}


def _encode(value: Any, where: str, depth: int) -> tuple[Any, Any]:
    """(graph mirror, template) of one state-dict value: containers become plain
    dicts of their graph nodes (keyed by ``str(key)`` or the index), every leaf
    with an array a PyValue (None for one kept as text, in the template only);
    the template keeps the exact structure."""
    if depth > _MAX_DEPTH:
        raise TypeError(f"its state is nested deeper than {_MAX_DEPTH} levels at {where}")
    if isinstance(value, dict):
        mirror: dict[str, Any] = {}
        entries = []
        for k, v in value.items():
            if isinstance(k, bool) or not isinstance(k, (str, int)):
                raise TypeError(f"its state has the key {k!r} ({type(k).__name__}) at "
                                f"{where or 'the top'}: keys must be str or int")
            if str(k) in mirror:
                raise TypeError(f"its state has the keys {k!r} and {str(k)!r} at "
                                f"{where or 'the top'}, which pyckpt cannot tell apart")
            m, t = _encode(v, f"{where}[{k!r}]", depth + 1)
            if m is not None:
                mirror[str(k)] = m
            entries.append((k, t))
        return mirror, ("d", entries)
    if isinstance(value, (list, tuple)):  # a dict of the graph nodes, by index
        kids = [_encode(v, f"{where}[{i}]", depth + 1) for i, v in enumerate(value)]
        seq = {str(i): m for i, (m, _) in enumerate(kids) if m is not None}
        return seq, ("l" if isinstance(value, list) else "u", [t for _, t in kids])
    pv = PyValue.of(value)
    if pv is None:
        raise TypeError(f"its state holds {describe_value(value)} at {where or 'the top'}, "
                        "which pyckpt cannot save: state dicts may hold arrays, tensors, "
                        "numbers, str, bytes, None, and dicts, lists and tuples of those")
    if pv.array is None:
        return None, pv.template()  # kept in the template only
    return pv, pv.template()


class StateNode:
    """The graph node of an object saved through its state (module doc).

    ``get()`` returns the state dict (called once, when the graph first asks for
    it); ``load(state)`` restores it. ``_pyckpt_restore(values)`` rebuilds a state
    from a checkpoint that holds no template (one written before templates
    existed) on top of the object's current state."""

    def __init__(self, obj: Any, get: Callable[[], Any], load: Callable[[Any], None]) -> None:
        self.obj = obj
        self._get = get
        self._load = load
        self._built: tuple[Any, Any] | None = None

    def _build(self) -> tuple[Any, Any]:
        if self._built is None:
            state = self._get()
            if not isinstance(state, (dict, list, tuple)):
                raise TypeError(f"its state is {describe_value(state)}, not a dict")
            self._built = _encode(state, "", 0)
        return self._built

    def _pyckpt_children(self) -> list[tuple[str, Any]]:
        return list(self._build()[0].items())

    def _pyckpt_get_child(self, name: str) -> Any:
        return self._build()[0].get(name, MISSING)

    def _pyckpt_template(self) -> Any:
        """The state's template (module doc)."""
        return self._build()[1]

    def _pyckpt_load(self, state: Any) -> None:
        """Restores the object from its rebuilt state dict."""
        self._load(state)

    def _pyckpt_restore(self, values: Any) -> None:
        """Restores from stored values without a template: ``values`` (nested dicts and
        lists of arrays, by edge name) replace the matching leaves of the current
        state, each rebuilt in the type of the leaf it replaces."""
        self._load(_merge(self._get(), values))

    def __repr__(self) -> str:
        return f"StateNode({type(self.obj).__name__})"


def _merge(current: Any, stored: Any) -> Any:
    if isinstance(current, dict):
        if not isinstance(stored, dict):
            return current
        return {k: _merge(v, stored[str(k)]) if str(k) in stored else v
                for k, v in current.items()}
    if isinstance(current, (list, tuple)):
        if not isinstance(stored, (list, dict)):
            return current
        pick = (lambda i: stored[i] if i < len(stored) else None) if isinstance(stored, list) \
            else (lambda i: stored.get(str(i)))
        out = [v if pick(i) is None else _merge(v, pick(i)) for i, v in enumerate(current)]
        return out if isinstance(current, list) else tuple(out)
    if not isinstance(stored, np.ndarray):
        return current
    pv = PyValue.of(current)
    if pv is None or pv.kind is None:
        return current
    return rebuild_leaf(pv.kind, stored)


def state_proxy(obj: Any) -> StateNode | None:
    """The StateNode of an object with ``state_dict()`` and ``load_state_dict()``
    methods or of a random generator (``rng.state_functions``), else None."""
    if isinstance(obj, type):
        return None
    t = type(obj)
    if callable(getattr(t, "state_dict", None)) and callable(getattr(t, "load_state_dict", None)):
        return StateNode(obj, obj.state_dict, obj.load_state_dict)
    fns = state_functions(obj)
    return None if fns is None else StateNode(obj, *fns)


_WARNED: set[type] = set()


def warn_left_out(container: Any, name: Any, value: Any, in_tuple: bool = False) -> None:
    """Warns (once per type of value) that a list, tuple or dict element is left out
    of checkpoints because pyckpt cannot save it; with ``in_tuple``, (once) that a
    Python value in a tuple is left out because a restore could not put it back."""
    t = tuple if in_tuple else type(value)
    if t in _WARNED:
        return
    _WARNED.add(t)
    if in_tuple:
        warnings.warn(
            f"pyckpt leaves numbers, strings and None inside tuples out of checkpoints (here "
            f"{describe_value(value)}, element {name} of a tuple): a restore cannot change a "
            "tuple. Use a list to have them saved and restored. (Shown once; docs/API.md "
            "section 11.)", stacklevel=2)
        return
    warnings.warn(
        f"pyckpt leaves {describe_value(value)} out of checkpoints (element {name!r} of a "
        f"{type(container).__name__}): it cannot be saved. Give it state_dict() and "
        "load_state_dict() methods, or wrap its arrays in pyckpt.Variable. (Shown once per "
        "type; docs/API.md section 11.)", stacklevel=2)

