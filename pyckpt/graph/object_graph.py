"""The object graph: live objects joined by named edges, and its stored form.

Live side: ``traverse(root)`` walks edges breadth-first, numbering each object
once (by identity), so an object reachable by several paths is saved once,
under its first path in breadth-first order (docs/FORMAT.md section 9).

Stored side: ``StoredGraph`` is the ``graph`` field of a manifest (or a graph
synthesized from the keys of a flat checkpoint, or a Snapshot's graph).
"""

from __future__ import annotations

from typing import Any, Callable, Iterable

import numpy as np

from ..registry import node_proxy
from ..variables import Variable
from .containers import TrackedDict, TrackedList
from .keys import VALUE_SUFFIX, escape, unescape
from ..device.array import DeviceArray
from .nodes import MISSING, _adapt, is_node, is_value, value_array, value_target
from .trackable import Trackable


def children(obj: Any) -> list[tuple[str, Any]]:
    """The named edges ``(name, child)`` of obj: a Trackable's tracked attributes, the
    elements of a list or tuple (by index) and the entries of a dict (by ``str(key)``)
    that are graph nodes, an adapter proxy's children; none for a value."""
    if isinstance(obj, Trackable):
        return obj._pyckpt_children()
    if isinstance(obj, (list, tuple)):
        return [(str(i), v) for i, v in enumerate(obj) if is_node(v)]
    if isinstance(obj, dict):
        return [(str(k), v) for k, v in obj.items() if is_node(v)]
    if isinstance(obj, (Variable, np.ndarray)):
        return []
    proxy = _adapt(obj)
    return proxy._pyckpt_children() if proxy is not None else []


def get_child(obj: Any, name: str) -> Any:
    """The child of obj under edge ``name`` (as ``children`` names them), or MISSING."""
    if isinstance(obj, Trackable):
        return obj._pyckpt_get_child(name)
    if isinstance(obj, (list, tuple)):
        if name.isdigit() and int(name) < len(obj):
            v = obj[int(name)]
            return v if is_node(v) else MISSING
        return MISSING
    if isinstance(obj, dict):
        if name in obj:
            v = obj[name]
        else:
            for k, v in obj.items():
                if str(k) == name:
                    break
            else:
                return MISSING
        return v if is_node(v) else MISSING
    proxy = _adapt(obj)
    return proxy._pyckpt_get_child(name) if proxy is not None else MISSING


def unit_restorer(obj: Any) -> Any:
    """An adapter node that restores its whole subtree at once (``_pyckpt_restore``)."""
    if isinstance(obj, (Variable, np.ndarray, Trackable, list, tuple, dict)):
        return None
    proxy = _adapt(obj)
    return proxy if proxy is not None and hasattr(proxy, "_pyckpt_restore") else None


def can_defer(obj: Any) -> bool:
    """Whether a value assigned later under some name can be noticed (restore-on-create)."""
    return isinstance(obj, (Trackable, TrackedList, TrackedDict))


class LiveGraph:
    """A breadth-first numbering of the live objects reachable from a root."""

    __slots__ = ("objects", "parents", "names", "prefixes", "edges", "values")

    def __init__(self) -> None:
        self.objects: list[Any] = []
        self.parents: list[int] = []     # first (breadth-first) parent, -1 for the root
        self.names: list[str] = []       # edge name from that parent
        self.prefixes: list[str] = []    # escaped key path of the node ("" for the root)
        self.edges: list[list[tuple[str, int]]] = []
        self.values: list[int] = []      # node ids holding values

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
        value in device memory)."""
        arr = value_array(self.objects[n])
        assert arr is not None, "traverse lists only nodes that hold a value"
        return arr

    def to_json(self) -> dict:
        """The graph as a manifest's ``graph`` field stores it: per node, its edges, the key
        of its value (or None) and the type name of its object."""
        value: list[str | None] = [None] * len(self.objects)
        for n in self.values:
            value[n] = self.prefixes[n] + VALUE_SUFFIX
        return {
            "children": [[[name, c] for name, c in e] for e in self.edges],
            "value": value,
            "kind": [type(o).__name__ for o in self.objects],
        }


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
    return esc


def traverse(root: Any, skip: Iterable[int] = (), stop: Iterable[int] = ()) -> LiveGraph:
    """Breadth-first walk from root; objects whose id() is in ``skip`` are left out,
    those in ``stop`` are included but not descended into."""
    g = LiveGraph()
    ids: dict[int, int] = {id(root): 0}
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
        if t is Variable or t is np.ndarray:
            g.values.append(i)
            i += 1
            continue
        if is_value(obj):
            g.values.append(i)
        if stopped and id(obj) in stopped:
            i += 1
            continue
        edges = edges_all[i]
        base = prefixes[i]
        for name, child in children(obj):
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


class StoredGraph:
    """The object graph of a checkpoint: per node, its named edges and the key of its value."""

    __slots__ = ("edges", "value")

    def __init__(self, edges: list[list[tuple[str, int]]], value: list[str | None]) -> None:
        self.edges = edges
        self.value = value

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
        return cls(edges, list(raw_value))

    @classmethod
    def from_keys(cls, keys: Iterable[str]) -> "StoredGraph":
        """A graph for a checkpoint without one (a flat save): '/'-split keys are paths.

        TensorFlow-style keys (``a/b/.ATTRIBUTES/VARIABLE_VALUE``) become the value
        of node ``a/b`` with their components unescaped."""
        edges: list[list[tuple[str, int]]] = [[]]
        value: list[str | None] = [None]
        index: list[dict[str, int]] = [{}]
        for key in keys:
            if key.endswith(VALUE_SUFFIX):
                parts = [unescape(p) for p in key[: -len(VALUE_SUFFIX)].split("/")]
            else:
                parts = key.split("/")
            node = 0
            for p in parts:
                nxt = index[node].get(p)
                if nxt is None:
                    nxt = len(value)
                    edges.append([])
                    value.append(None)
                    index.append({})
                    edges[node].append((p, nxt))
                    index[node][p] = nxt
                node = nxt
            value[node] = key
        return cls(edges, value)

    def paths(self) -> list[list[str] | None]:
        """First breadth-first path to every node (None if unreachable)."""
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
        return out
