"""The last walk of a root, kept and re-checked instead of walked again (issue 40 item 4).

``Checkpoint.snapshot()``, ``restore(snapshot)`` and ``copy_state`` of object graphs
walk the graph (``object_graph.traverse``: several microseconds per value) only to
find what they found the last time. ``walk_of(root)`` keeps, per root (weakly: the
kept walk goes with the root), the last walk of a graph without Python values in
lists and dicts, objects restored as a whole or targets with a finish, whose values
are numpy arrays, Variables or objects an adapter stamps (``registry.stamps``:
torch tensors), and at the next call re-checks it by identity, in C-level passes.
A graph with state nodes (optimizers, objects with ``state_dict()``) is kept for
the snapshots only (``walk_of(states=True)``): each state dict is read again and
compared with the walk's template (``kept_states.py``); such a walk has no
``structure``, so restores and ``copy_state`` never pair values through it.

- each container, Trackable and adapter node still holds the same children under
  the same names (dicts: their keys and the ids of their values; lists and tuples:
  the ids of their items; Trackables: ``_pyckpt_children``; adapter nodes: their
  ``_pyckpt_signature`` where they have one, asked of the node made at the walk
  (so it must read its object afresh at every call, as torch's module node does;
  nodes of a kind with a ``_pyckpt_signatures(nodes)`` are signed all at once),
  else ``_pyckpt_children`` of a node made at each check);
- each Variable holds the same array, each array keeps its shape and dtype, and the
  adapter's stamps of the other values are equal (torch: data pointer, shape,
  strides, dtype: a replaced ``.data``, ``set_`` or ``resize_`` is seen);
- no adapter was registered since (``registry.generation``);
- nothing is pending on a Trackable or tracked container (restore-on-create).

Any difference, and any graph it does not keep, takes the full walk. A kept walk
holds its objects (the root excepted) and their targets until the next walk of its
root replaces it (so a tensor given new storage keeps its old storage alive until
then); ``forget(root)`` drops it, ``pyckpt.device.release_staging_memory()`` drops
them all.
"""

from __future__ import annotations

import weakref
from operator import attrgetter
from typing import Any

import numpy as np

from ..device.buffers import on_release
from ..device.array import DeviceArray
from ..device.copies import one_engine
from ..device.engine import Batch
from ..registry import generation, node_proxy, stamps
from ..variables import Variable
from . import deferred
from .nodes import Target, _adapt
from .kept_states import KeptState
from .nodes import _adapt as adapt_node
from .object_graph import LiveGraph, StoredGraph, traverse, unit_restorer
from .stateful import PyValue, StateNode
from .trackable import Trackable

__all__ = ["Walk", "Split", "walk_of", "forget", "forget_all"]

#: root -> {ids of the skipped objects: the kept walk, or the generation in which the
#: last walk was not kept}
_WALKS: "weakref.WeakKeyDictionary[Any, dict[tuple, Walk | int]]" = \
    weakref.WeakKeyDictionary()
_VALUE = attrgetter("_value")
_UNKNOWN = object()
_SHAPE, _DTYPE = attrgetter("shape"), attrgetter("dtype")

#: How a node's children are re-checked.
_DICT, _SEQ, _TRACKABLE, _SIGNED, _LISTED = range(5)


class Walk:
    """A walk of a root kept to be re-checked: the live graph (its root replaced by
    None, so that the kept walk does not keep its root alive), the values' keys and
    targets in ``values`` order, its ``structure`` and, once made, its stored graph."""

    __slots__ = ("live", "keys", "targets", "structure", "graph", "doc", "_generation",
                 "_checks", "_variables", "_var_ids", "_arrays", "_array_meta", "_foreign",
                 "_stamps", "_pending", "same_graphs", "skipped", "held", "fit", "_engine",
                 "_srcs", "_batch", "_groups", "_states", "_split", "__weakref__")

    def __init__(self, live: LiveGraph, structure: tuple | None, keys: list[str],
                 targets: list[Target],
                 checks: list[tuple[int, Any, Any, Any]], foreign: list,
                 foreign_stamps: list | None,
                 pending: list) -> None:
        self.live = live
        self.keys = keys
        self.targets = targets
        self.structure = structure
        self.graph: StoredGraph | None = None
        self.doc: dict | None = None
        self._generation = generation()
        self._checks = checks
        objs = live.objects
        self._variables = [objs[n] for n in live.values if type(objs[n]) is Variable]
        self._var_ids = [id(v._value) for v in self._variables]
        self._arrays = [objs[n] for n in live.values if type(objs[n]) is np.ndarray] + \
            [v._value for v in self._variables]
        self._array_meta = [list(map(_SHAPE, self._arrays)), list(map(_DTYPE, self._arrays))]
        self._foreign = foreign
        self._stamps = foreign_stamps
        self._pending = pending  # the Trackables and tracked containers (restore-on-create)
        #: stored graphs and walks (kept alive here) found equal to ``structure``
        self.same_graphs: list[Any] = []
        self.skipped: tuple = ()
        self.held: list = []  # objects whose ids the checks compare (not all are nodes)
        #: (weak reference to a snapshot's Batch, engine): buffers found to pair with
        #: ``srcs`` as one engine batch (restore_kept); snapshots taken ``into=`` one
        #: another share their buffers' Batch
        self.fit: tuple | None = None
        self._engine: Any = _UNKNOWN
        self._srcs = [t[0] for t in targets]
        #: (sign, nodes, signature): adapter nodes of one kind signed in one call
        self._groups: list[tuple[Any, list, Any]] = []
        #: the state nodes (kept_states.py); a walk with some has no ``structure``
        self._states: list[KeptState] = []
        self._split: Any = _UNKNOWN
        self._batch: Batch | None = None

    @property
    def engine(self) -> Any:
        """The engine of every value when all are DeviceArrays of one engine (their
        buffers made like them, by ``empties_like`` or kept by ``into=``, pair with
        them as one ``engine.copy`` batch), else None; found once (the values of a
        kept walk are the same objects at every call)."""
        if self._engine is _UNKNOWN:
            srcs = self.srcs
            self._engine = one_engine(srcs, srcs)
        return self._engine

    @property
    def srcs(self) -> list:
        """The arrays of the values, in ``values`` order (one list: not to be changed)."""
        return self._srcs

    @property
    def split(self) -> "Split | None":
        """Where the values are DeviceArrays of one engine and plain host arrays (a
        graph with state nodes: device tensors, host numbers), the two parts (a
        Split); else None. Found once (the values of a kept walk are the same
        objects at every call)."""
        if self._split is _UNKNOWN:
            self._split = Split.of(self._srcs)
        return self._split

    def batch(self) -> Batch:
        """The values as their engine's ``Batch`` (``engine`` is not None), made once:
        while the walk holds, each value is the same array with the same stamp."""
        if self._batch is None:
            self._batch = self.engine.batch(self._srcs)
        return self._batch

    def stored(self, root: Any) -> tuple[StoredGraph, dict]:
        """The stored graph of the walk of ``root`` and its document (made once)."""
        if self.graph is None or self.doc is None:
            self.live.objects[0] = root
            try:
                self.doc = self.live.to_json()
            finally:
                self.live.objects[0] = None
            self.graph = StoredGraph.from_doc(self.doc)
        return self.graph, self.doc

    def same_as(self, other: Any, structure: tuple | None) -> bool:
        """Whether ``structure`` (that of ``other``: a stored graph or another Walk)
        equals this walk's; ``other`` is remembered (a few), to be known by identity."""
        if structure is None or self.structure is None:
            return False  # a graph with states: its values are not all filled in place
        if any(o is other for o in self.same_graphs):
            return True
        if structure is not self.structure and structure != self.structure:
            return False
        self.same_graphs = [other] + self.same_graphs[:3]
        return True

    def objects(self, root: Any) -> list[Any]:
        """The walk's objects, numbered as ``traverse`` numbers them."""
        return [root] + self.live.objects[1:]

    def holds(self, root: Any) -> bool:
        """Whether the graph of ``root`` is still the one walked (module doc)."""
        if generation() != self._generation:
            return False
        for sign, nodes, seen in self._groups:  # (adapter nodes signed together)
            if sign(nodes) != seen:
                return False
        for how, obj, seen, node in self._checks:
            if node is not None:  # (a module's node, made at the walk: its signature)
                if node._pyckpt_signature() != seen:
                    return False
            elif _signature(how, root if obj is None else obj) != seen:
                return False
        for state in self._states:  # (reads each state dict; its numbers taken afresh)
            if not state.holds():
                return False
        if [id(v._value) for v in self._variables] != self._var_ids:
            return False
        arrays = self._arrays
        if [list(map(_SHAPE, arrays)), list(map(_DTYPE, arrays))] != self._array_meta:
            return False
        if self._foreign and stamps(self._foreign) != self._stamps:
            return False
        for obj in self._pending:
            if deferred.pending(root if obj is None else obj):
                return False
        return True


class Split:
    """The values of a walk in two parts: the positions of the DeviceArrays, all of
    ``engine``, as its Batch, and the positions of the plain host arrays."""

    __slots__ = ("engine", "device", "host", "batch", "host_arrays")

    def __init__(self, engine: Any, device: list[int], host: list[int], values: list) -> None:
        self.engine = engine
        self.device = device
        self.host = host
        self.batch = engine.batch([values[i] for i in device])
        self.host_arrays: list[np.ndarray] = [values[i] for i in host]

    @classmethod
    def of(cls, values: list) -> "Split | None":
        device = [i for i, v in enumerate(values) if type(v) is DeviceArray]
        host = [i for i, v in enumerate(values) if type(v) is np.ndarray]
        if not device or not host or len(device) + len(host) != len(values):
            return None
        engines = {values[i].engine for i in device}
        if len(engines) != 1:
            return None
        return cls(engines.pop(), device, host, values)


def _signature(how: int, obj: Any) -> Any:
    if how == _DICT:
        return list(obj), list(map(id, obj.values()))
    if how == _SEQ:
        return list(map(id, obj))
    if how == _TRACKABLE:
        return [(name, id(c)) for name, c in obj._pyckpt_children()]
    proxy = _adapt(obj)
    if proxy is None:
        return None
    if how == _SIGNED:
        return proxy._pyckpt_signature()
    return [(name, id(c)) for name, c in proxy._pyckpt_children()]


def _build(root: Any, live: LiveGraph) -> Walk | None:
    """A Walk of ``live`` (just walked from root), or None for a graph it does not keep."""
    if live.units or 0 in live.templates:
        return None
    values = set(live.values)
    states: list[KeptState] = []
    below: set[int] = set()  # the nodes of the state dicts (their mirrors and values)
    leaf_arrays: list[np.ndarray] = []  # numpy arrays among the states' leaves
    checks: list[tuple[int, Any, Any, Any]] = []
    together: dict[Any, list[Any]] = {}  # adapter nodes signed in one call per kind
    pending: list[Any] = []
    foreign: list[Any] = []
    held: list[Any] = []  # the items of containers: their ids, compared, stay theirs
    parents = live.parents
    for n, obj in enumerate(live.objects):
        if n and (parents[n] in below or parents[n] in live.templates):
            below.add(n)  # checked through its state node (breadth-first: parents first)
            if isinstance(obj, PyValue) and (n not in values or live.edges[n] or
                                             live.targets[n][1] is not None):
                return None
            continue
        if isinstance(obj, PyValue):
            return None  # a Python value in a list or dict: restored by replacement
        if n in live.templates:  # a state node: its state dict re-read at each check
            kept = KeptState.build(obj, live.templates[n]) \
                if isinstance(adapt_node(obj), StateNode) else None
            if kept is None:
                return None
            states.append(kept)
            for a in kept.arrays():
                (leaf_arrays if type(a) is np.ndarray else foreign).append(a)
            continue
        if n in values:
            if live.edges[n] or live.targets[n][1] is not None:
                return None  # a value with children, or a target with a finish
            if type(obj) is not np.ndarray and type(obj) is not Variable:
                foreign.append(obj)
            continue
        if isinstance(obj, Trackable):
            how = _TRACKABLE
        elif isinstance(obj, dict):
            how = _DICT
        elif isinstance(obj, (list, tuple)):
            how = _SEQ
        elif isinstance(obj, (Variable, np.ndarray)) or unit_restorer(obj) is not None:
            return None
        else:
            proxy = node_proxy(obj)
            if proxy is None:
                return None  # a StateNode (stateful objects) or an unknown kind
            how = _SIGNED if hasattr(proxy, "_pyckpt_signature") else _LISTED
        if deferred.pending(obj):
            return None  # restore-on-create: the full walk
        if isinstance(obj, Trackable) or type(obj) is not dict and type(obj) is not list \
                and isinstance(obj, (dict, list)):
            pending.append(None if n == 0 else obj)
        # an adapter node that signs its children is made once and asked again (the
        # root's excepted: a node holds its object, and the walk must not hold the root)
        node = proxy if how == _SIGNED and n != 0 else None
        if node is not None and hasattr(type(node), "_pyckpt_signatures"):
            together.setdefault(type(node), []).append(node)  # signed with its kind
            continue
        checks.append((how, None if n == 0 else obj,
                       node._pyckpt_signature() if node is not None else _signature(how, obj),
                       node))
        if how == _DICT or how == _SEQ and type(obj) is not tuple:
            held.append(list(obj.values()) if how == _DICT else list(obj))
    groups: list[tuple[Any, list, Any]] = []
    for kind, nodes in together.items():
        sign = kind._pyckpt_signatures
        seen = sign(nodes)
        if seen is not None:
            groups.append((sign, nodes, seen))
        else:  # each alone
            checks += [(_SIGNED, x, x._pyckpt_signature(), x) for x in nodes]
    foreign_stamps = stamps(foreign) if foreign else None
    if foreign and foreign_stamps is None:
        return None
    structure = live.structure()  # (None with states)
    keys = live.value_keys()
    targets = [live.targets[n] for n in live.values]
    doc = live.to_json() if states else None  # (its states name values by live.ids)
    live.objects[0] = None  # the root is the weak key: not held by its own walk
    live.ids.clear()
    walk = Walk(live, structure, keys, targets, checks, foreign, foreign_stamps, pending)
    walk.held = held
    walk._groups = groups
    if states:
        assert doc is not None
        walk._states = states
        walk.doc, walk.graph = doc, StoredGraph.from_doc(doc)
        walk._arrays += leaf_arrays
        walk._array_meta = [list(map(_SHAPE, walk._arrays)), list(map(_DTYPE, walk._arrays))]
    return walk


def walk_of(root: Any, live: LiveGraph | None = None, skip: tuple = (), mode: str = "walk",
            states: bool = False) -> tuple[Walk | None, LiveGraph | None]:
    """(the kept walk of root when it still holds, else a new one where root's graph
    is kept (module doc), or None; the full walk made, or None when the kept one
    held). ``live``: a full walk of root just made, to keep instead of walking.
    ``skip``: objects left out of the walk (``traverse(skip=...)``), kept apart.
    ``mode``: ``"walk"`` walks root whenever no kept walk holds (for callers that
    need a full walk then); for callers that do not (a restore, which matches by
    its own walk: a walk made here in vain would be a second one), ``"try"`` walks
    unless the last walk of root was not kept (and no adapter was registered
    since), ``"kept"`` only re-checks a kept walk (never walks: (None, None)).
    ``states``: whether the caller takes a walk of a graph with state nodes (a
    snapshot does; a restore or ``copy_state``, which must load a state dict
    through its object, does not: for them such a graph is not kept, and a kept
    walk of it is left for the snapshots)."""
    key = tuple(map(id, skip))
    try:
        kept = _WALKS.get(root)
    except TypeError:  # not weakly referable (a dict): never kept
        return None, (live if live is not None else traverse(root, skip=key))
    walk = kept.get(key) if kept is not None else None
    if isinstance(walk, int):  # the generation in which it was not kept
        if mode != "walk" and live is None and walk == generation():
            return None, None
        walk = None
    if walk is not None and walk._states and not states:  # (the snapshots' walk)
        return None, (None if mode != "walk" else
                      live if live is not None else traverse(root, skip=key))
    if walk is not None and live is None and walk.holds(root):
        return walk, None
    if mode == "kept" and live is None:
        return None, None
    if live is None:
        live = traverse(root, skip=key)
    walk = _build(root, live) if states or not live.templates else None
    if kept is None:
        kept = _WALKS[root] = {}
    if walk is None:
        kept[key] = generation()
        return None, live
    walk.skipped = skip  # held: their ids stay theirs
    if len(kept) >= 4:
        kept.clear()
    kept[key] = walk
    return walk, None


def forget(root: Any) -> None:
    """Drops the kept walk of root (none kept: nothing happens)."""
    try:
        _WALKS.pop(root, None)
    except TypeError:
        pass


def forget_all() -> None:
    """Drops every kept walk (``pyckpt.device.release_staging_memory()`` calls it)."""
    _WALKS.clear()


on_release(forget_all)
