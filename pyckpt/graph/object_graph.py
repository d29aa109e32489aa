"""The object graph: live objects joined by named edges, and its stored form.

Live side: ``traverse(root)`` walks edges breadth-first, numbering each object
once (by identity), so an object reachable by several paths is saved once,
under its first path in breadth-first order (docs/FORMAT.md section 9).

Stored side: ``StoredGraph`` is the ``graph`` field of a manifest (or a graph
synthesized from the keys of a flat checkpoint, or a Snapshot's graph).

Python values in lists and dicts, and the leaves of state dicts, are PyValues
(stateful.py): a new one at each visit, so they are never shared by identity.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Iterable

import numpy as np

from ..tree import check_utf8, keyed_error, path_trie
from ..variables import Variable
from .containers import TrackedDict, TrackedList
from .keys import VALUE_SUFFIX, escape, unescape
from ..device.array import DeviceArray
from .nodes import MISSING, Target, TargetMemo, _adapt, is_node, is_value, remembered_target
from .stateful import PyValue, is_python_value, resolve, warn_left_out
from .trackable import Trackable


def _element(container: Any, key: Any, v: Any, memo: TargetMemo | None = None) -> Any:
    """The graph node of a list, tuple or dict element: itself when it is a node, a
    PyValue for a Python value or a framework array (jax.Array...) in a list or dict
    (restored by replacement); else MISSING, with a warning once: for a Python value
    in a tuple (which a restore cannot change: left out on purpose), and for
    anything pyckpt cannot save (once per type). ``memo``: see ``nodes.is_node``."""
    if is_node(v, memo):
        return v
    if isinstance(container, (list, dict)):
        pv = PyValue.of(v, container, key)
        if pv is not None:
            return pv
    elif is_python_value(v):
        warn_left_out(container, key, v, in_tuple=True)  # a restore could not put it back
        return MISSING
    warn_left_out(container, key, v)
    return MISSING


def _container_edges(obj: Any, memo: TargetMemo | None = None) -> list[tuple[str, Any]]:
    items = enumerate(obj) if isinstance(obj, (list, tuple)) else obj.items()
    out = []
    for k, v in items:
        node = _element(obj, k, v, memo)
        if node is not MISSING:
            out.append((str(k), node))
    if isinstance(obj, dict) and len(out) > 1 and any(type(k) is not str for k in obj):
        _refuse_same_names(obj)
    return out


def _refuse_same_names(d: dict) -> None:
    """TypeError when two keys of a dict name one edge (``1`` and ``"1"``): one of
    their values would be saved under the other's key, and lost."""
    seen: dict[str, Any] = {}
    for k in d:
        other = seen.setdefault(str(k), k)
        if other is not k:
            raise TypeError(f"its keys {other!r} and {k!r} are both stored as {str(k)!r}, "
                            "which pyckpt cannot tell apart")


def _edges(obj: Any, memo: TargetMemo | None = None) -> tuple[list[tuple[str, Any]], Any]:
    """(``children(obj)``, the template of obj's state (stateful.py) or None)."""
    if isinstance(obj, Trackable):
        return obj._pyckpt_children(), None
    if isinstance(obj, (list, tuple, dict)):
        return _container_edges(obj, memo), None
    if isinstance(obj, (Variable, np.ndarray)):
        return [], None
    if isinstance(obj, PyValue):
        return [], obj.template() if obj.parent is not None else None
    proxy = _adapt(obj)
    if proxy is None:
        return [], None
    template = getattr(proxy, "_pyckpt_template", None)
    return proxy._pyckpt_children(), template() if template is not None else None


def children(obj: Any) -> list[tuple[str, Any]]:
    """The named edges ``(name, child)`` of obj: a Trackable's tracked attributes, the
    elements of a list or tuple (by index) and the entries of a dict (by ``str(key)``)
    that are graph nodes or Python values (as PyValues), an adapter proxy's
    children; none for a value."""
    return _edges(obj)[0]


def get_child(obj: Any, name: str, memo: TargetMemo | None = None) -> Any:
    """The child of obj under edge ``name`` (as ``children`` names them), or MISSING.
    ``memo``: see ``nodes.is_node``."""
    return child_lookup(obj, memo)(name)


def child_lookup(obj: Any, memo: TargetMemo | None = None) -> Callable[[str], Any]:
    """``get_child(obj, name, memo)`` as a function of ``name``, for asking one object
    for many children: what a lookup works out (an adapter's proxy, a dict's keys by
    their names) is worked out once. obj must not change while it is used."""
    if isinstance(obj, Trackable):
        return obj._pyckpt_get_child
    if isinstance(obj, (list, tuple)):
        return lambda name: _item_child(obj, name, memo)
    if isinstance(obj, dict):
        return _DictChildren(obj, memo).get
    if isinstance(obj, PyValue):
        return _no_child
    proxy = _adapt(obj)
    return proxy._pyckpt_get_child if proxy is not None else _no_child


class _DictChildren:
    """The children of a dict by edge name (``str(key)``): the key spelled as the name
    first, else the first key whose ``str`` is the name; the names of all keys are
    made once, at the first name that is not a key itself."""

    def __init__(self, d: dict, memo: TargetMemo | None) -> None:
        self.d, self.memo = d, memo
        self.by_name: dict[str, Any] | None = None

    def get(self, name: str) -> Any:
        d = self.d
        if name in d:
            key = name
        else:
            if self.by_name is None:
                self.by_name = {}
                for k in d:
                    self.by_name.setdefault(str(k), k)
            key = self.by_name.get(name, MISSING)
            if key is MISSING:
                return MISSING
        return _element(d, key, d[key], self.memo)


def _item_child(obj: list | tuple, name: str, memo: TargetMemo | None) -> Any:
    if name.isdigit() and int(name) < len(obj):
        return _element(obj, int(name), obj[int(name)], memo)
    return MISSING


def _no_child(name: str) -> Any:
    return MISSING


def unit_restorer(obj: Any) -> Any:
    """An adapter node that restores its whole subtree at once (``_pyckpt_restore``):
    a StateNode (stateful.py) or an adapter's node with that method."""
    if isinstance(obj, (Variable, np.ndarray, Trackable, list, tuple, dict, PyValue)):
        return None
    proxy = _adapt(obj)
    return proxy if proxy is not None and hasattr(proxy, "_pyckpt_restore") else None


def ident(obj: Any) -> Any:
    """What identifies a live node across traversals: ``id(obj)``, or a PyValue's place."""
    return obj.ident if isinstance(obj, PyValue) else id(obj)


def can_defer(obj: Any) -> bool:
    """Whether a value assigned later under some name can be noticed (restore-on-create)."""
    return isinstance(obj, (Trackable, TrackedList, TrackedDict))


@dataclass(slots=True, eq=False, repr=False)
class LiveGraph:
    """A breadth-first numbering of the live objects reachable from a root."""

    objects: list[Any] = field(default_factory=list)
    parents: list[int] = field(default_factory=list)   # first breadth-first parent, -1: root
    names: list[str] = field(default_factory=list)     # edge name from that parent
    prefixes: list[str] = field(default_factory=list)  # escaped key path ("" for the root)
    edges: list[list[tuple[str, int]]] = field(default_factory=list)
    values: list[int] = field(default_factory=list)    # node ids holding values
    targets: dict[int, Target] = field(default_factory=dict)  # value node -> value_target
    templates: dict[int, Any] = field(default_factory=dict)  # node -> its state's template
    units: list[int] = field(default_factory=list)     # restored as a whole, not descended into
    ids: dict[int, int] = field(default_factory=dict)  # id(object) -> node

    def path(self, i: int) -> list[str]:
        """The edge names from the root to node i."""
        out = []
        while i > 0:
            out.append(self.names[i])
            i = self.parents[i]
        return out[::-1]

    @property
    def paths(self) -> "_Paths":
        """``paths[i]``: ``path(i)`` through indexing."""
        return _Paths(self)

    def value_keys(self) -> list[str]:
        """The checkpoint key of every value node, in ``values`` order."""
        return [self.prefixes[n] + VALUE_SUFFIX for n in self.values]

    def array_of(self, n: int) -> np.ndarray | DeviceArray:
        """The array of value node n (one listed in ``values``; a DeviceArray for a
        value in device memory), as the walk found it (``traverse(with_targets=True)``)."""
        return self.targets[n][0]

    def target_of(self, n: int) -> Target:
        """``value_target`` of value node n, as the walk found it: (array, finish)."""
        return self.targets[n]

    def to_json(self) -> dict:
        """The graph as a manifest's ``graph`` field stores it: per node, its edges, the key
        of its value (or None) and the type name of its object; and, when some node has
        one, its ``state`` (docs/FORMAT.md section 9)."""
        value: list[str | None] = [None] * len(self.objects)
        for n in self.values:
            value[n] = self.prefixes[n] + VALUE_SUFFIX
        doc = {
            "children": [[[name, c] for name, c in e] for e in self.edges],
            "value": value,
            "kind": [_kind(o) for o in self.objects],
        }
        if self.templates:
            state: list[Any] = [None] * len(self.objects)
            for n, t in self.states().items():
                state[n] = t
            doc["state"] = state
        return doc

    def structure(self) -> tuple | None:
        """What ``to_json`` makes its document from, as one comparable value (the edges,
        which fix the numbering and the keys; the value nodes; the type names): two
        walks of equal structures give equal documents. None for a graph with states,
        whose templates hold values of the moment."""
        if self.templates:
            return None
        return self.edges, self.values, [_kind(o) for o in self.objects]

    def states(self) -> dict[int, Any]:
        """The state tree of every node that has one (a stateful object's, a Python
        value's: docs/FORMAT.md section 9), its leaves naming the keys of its values."""
        prefixes = self.prefixes

        values = set(self.values)

        def key_of(pv: PyValue) -> str:
            n = self.ids[id(pv)]
            assert n in values, "a template's leaves are value nodes"
            return prefixes[n] + VALUE_SUFFIX

        return {n: resolve(t, key_of) for n, t in self.templates.items()}


def _kind(obj: Any) -> str:
    return type(obj.value).__name__ if isinstance(obj, PyValue) else type(obj).__name__


class _Paths:
    """``live.paths[i]``: the edge names from the root to node i."""

    def __init__(self, g: LiveGraph) -> None:
        self._g = g

    def __getitem__(self, i: int) -> list[str]:
        return self._g.path(i)


def _component(name: str) -> str:
    esc = escape(name) if ("." in name or "/" in name) else name
    if esc in ("", ".", ".."):
        raise ValueError(f"edge name {name!r} cannot be stored as a checkpoint key component")
    check_utf8([name], "edge name")  # the rule of every key (tree.validate_key)
    return esc


def traverse(root: Any, skip: Iterable[int] = (), stop: Iterable[int] = (),
             whole_units: bool = False, with_targets: bool = True) -> LiveGraph:
    """Breadth-first walk from root; objects whose id() is in ``skip`` are left out,
    those in ``stop`` are included but not descended into, and so are objects
    restored as a whole (``unit_restorer``) with ``whole_units`` (listed in
    ``units``). A state that cannot be saved raises TypeError naming its path.

    With ``with_targets`` (default) the walk keeps each value's target
    (``LiveGraph.targets``: what a save or a copy reads and writes), asking the
    adapters once for a value held in a list, tuple or dict (``memo``); without it
    (walks that need the graph's shape only) no target is kept: a target may be a
    host copy (a tensor on a device other than the CPU or CUDA)."""
    g = LiveGraph()
    memo: TargetMemo | None = {} if with_targets else None
    targets = g.targets
    ids = g.ids
    ids[id(root)] = 0
    skipped = set(skip)
    stopped = set(stop)
    objects, parents, names, prefixes, edges_all = g.objects, g.parents, g.names, g.prefixes, g.edges
    objects.append(root)
    parents.append(-1)
    names.append("")
    prefixes.append("")
    edges_all.append([])
    i = 0
    while i < len(objects):
        obj = objects[i]
        t = type(obj)
        if t is np.ndarray or t is Variable:
            if with_targets:
                targets[i] = (obj, None) if t is np.ndarray else (obj._value, None)
            g.values.append(i)
            i += 1
            continue
        try:
            if memo is not None:
                target = remembered_target(obj, memo)
                value = target is not None
                if target is not None:
                    targets[i] = target
            else:
                value = is_value(obj)
        except (TypeError, ValueError, RuntimeError) as e:  # an adapter refused the value
            raise keyed_error(e, _where(g, i)) from e
        if value:
            g.values.append(i)
        if stopped and id(obj) in stopped:
            i += 1
            continue
        if whole_units and not value and unit_restorer(obj) is not None:
            g.units.append(i)
            i += 1
            continue
        try:
            kids, template = _edges(obj, memo)
        except TypeError as e:
            raise TypeError(f"cannot save {_where(g, i)} ({type(obj).__module__}."
                            f"{type(obj).__qualname__}): {e}") from None
        if template is not None:
            g.templates[i] = template
        edges = edges_all[i]
        base = prefixes[i]
        for name, child in kids:
            if skipped and id(child) in skipped:
                continue
            j = ids.get(id(child))
            if j is None:
                j = len(objects)
                ids[id(child)] = j
                objects.append(child)
                parents.append(i)
                names.append(name)
                comp = _component(name)
                prefixes.append(f"{base}/{comp}" if base else comp)
                edges_all.append([])
            edges.append((name, j))
        i += 1
    return g


def _where(g: LiveGraph, i: int) -> str:
    path = g.path(i)
    return ".".join(path) if path else "the root"


def _key_path(key: str) -> list[str]:
    """The path a key of a checkpoint without a graph stands for: its ``/``-split parts,
    unescaped for a TensorFlow-style key (``a/b/.ATTRIBUTES/VARIABLE_VALUE``)."""
    if key.endswith(VALUE_SUFFIX):
        return [unescape(p) for p in key[: -len(VALUE_SUFFIX)].split("/")]
    return key.split("/")


class StoredGraph:
    """The object graph of a checkpoint: per node, its named edges, the key of its
    value, and its state (the tree of a stateful object's state dict or of a Python
    value, docs/FORMAT.md section 9), each None where there is none."""

    __slots__ = ("edges", "value", "state", "_paths")

    def __init__(self, edges: list[list[tuple[str, int]]], value: list[str | None],
                 state: list[Any] | None = None) -> None:
        self.edges = edges
        self.value = value
        self.state: list[Any] = state if state is not None else [None] * len(value)
        self._paths: list[list[str] | None] | None = None

    @classmethod
    def from_doc(cls, doc: dict) -> "StoredGraph":
        """The graph of a document ``LiveGraph.to_json`` made (trusted: not validated)."""
        return cls([[(name, c) for name, c in e] for e in doc["children"]], doc["value"],
                   doc.get("state"))

    def __len__(self) -> int:
        return len(self.value)

    @classmethod
    def from_json(cls, doc: Any, keys: Any, bad: Callable[[str], Exception]) -> "StoredGraph":
        """Validates a manifest's ``graph`` field (edges in range, values among ``keys``);
        a defect raises ``bad(message)``."""
        if not isinstance(doc, dict):
            raise bad("graph must be an object")
        raw_children, raw_value = doc.get("children"), doc.get("value")
        if not isinstance(raw_children, list) or not isinstance(raw_value, list) \
                or len(raw_children) != len(raw_value) or not raw_value:
            raise bad("graph needs equally long non-empty 'children' and 'value' lists")
        n = len(raw_value)
        edges: list[list[tuple[str, int]]] = []
        for i, es in enumerate(raw_children):
            if not isinstance(es, list):
                raise bad(f"graph node {i}: children must be a list")
            out = []
            for e in es:
                if (not isinstance(e, list) or len(e) != 2 or not isinstance(e[0], str)
                        or type(e[1]) is not int or not 0 <= e[1] < n):
                    raise bad(f"graph node {i}: bad edge {e!r}")
                out.append((e[0], e[1]))
            edges.append(out)
        for i, k in enumerate(raw_value):
            if k is not None and (not isinstance(k, str) or k not in keys):
                raise bad(f"graph node {i}: value {k!r} is not a key of the checkpoint")
        state = doc.get("state")  # absent in checkpoints without stateful values
        if state is not None and (not isinstance(state, list) or len(state) != n):
            raise bad("graph 'state' must be a list with one entry per node")
        if state is not None:
            for i, t in enumerate(state):
                if t is not None and not isinstance(t, (dict, str)):
                    raise bad(f"graph node {i}: state must be a tree node or null")
        return cls(edges, list(raw_value), state)

    @classmethod
    def from_keys(cls, keys: Iterable[str]) -> "StoredGraph":
        """A graph for a checkpoint without one (a flat save): '/'-split keys are paths.

        TensorFlow-style keys (``a/b/.ATTRIBUTES/VARIABLE_VALUE``) become the value
        of node ``a/b`` with their components unescaped."""
        keys = list(keys)
        edges, ends = path_trie(_key_path(k) for k in keys)
        value: list[str | None] = [None] * len(edges)
        for key, node in zip(keys, ends):
            value[node] = key
        return cls(edges, value)

    def paths(self) -> list[list[str] | None]:
        """First breadth-first path to every node (None if unreachable)."""
        if self._paths is not None:
            return self._paths
        out: list[list[str] | None] = [None] * len(self.value)
        out[0] = []
        queue = [0]
        for node in queue:
            base = out[node]
            assert base is not None  # a node is queued only once its path is set
            for name, child in self.edges[node]:
                if out[child] is None:
                    out[child] = base + [name]
                    queue.append(child)
        self._paths = out
        return out
