"""Matching a stored object graph against live objects, and LoadStatus.

A restore walks the stored graph from its root together with the live
objects, by edge names (never by variable names). Values of matched value
nodes are read straight into the live arrays/Variables in one batched read.
Edges without a live counterpart under a Trackable or tracked container
become pending (restore-on-create, deferred.py).

Stateful values (stateful.py) are restored by replacement: a PyValue (a Python
value in a list or dict) is rebuilt from its stored state and put back into its
container; a StateNode's state dict is rebuilt from its stored template and
loaded into its object (``load_state_dict``).
"""

from __future__ import annotations

import warnings
import weakref
from operator import attrgetter
from typing import Any, Callable

import numpy as np

from .._dtypes import describe_dtypes, finish_byte_order, same_dtype, source_order_view
from ..device.array import DeviceArray
from ..device.copies import copy_values, one_engine, unwritable
from ..tree import is_framework_kind, skeleton_leaves, unflatten
from . import deferred
from .keys import STATE_SUFFIX, escape, index_lists, path_string
from .nodes import Target, TargetMemo, remembered_target, value_target
from .object_graph import (MISSING, can_defer, child_lookup, get_child, ident, traverse,
                           unit_restorer)
from .sources import ValueSource
from .stateful import PyValue
from .walk_cache import walk_of

_SHAPE, _DTYPE = attrgetter("shape"), attrgetter("dtype")


class RestoreSession:
    """One restore: what was matched, what was restored, what is pending."""

    def __init__(self, source: ValueSource, root: Any, exclude_objects: tuple = (),
                 exclude_keys: tuple = ()) -> None:
        self.source = source
        self.graph = source.graph
        self.root = root
        self.matched: dict[int, Any] = {}      # stored node -> live object
        self.node_of: dict[Any, int] = {}      # ident(live object) -> stored node
        self.consumed: set[int] = set()        # stored value (and state) nodes restored
        self.exclude_objects = {id(o) for o in exclude_objects}
        self.skipped = tuple(exclude_objects)
        self.exclude_keys = set(exclude_keys)
        self._with_values: set[int] | None = None
        self.units: set[int] = set()  # ids of objects restored as a whole
        self._key_nodes: dict[str, int] | None = None

    # -- matching --------------------------------------------------------------------
    def restore_kept(self) -> bool:
        """Restores a snapshot of a graph without states through the kept walk of the
        root (``walk_cache``), when nothing was matched or excluded yet, the walk
        still holds and has the snapshot's structure, and every value has the
        snapshot's shape and dtype (host targets writable): then the full match
        would pair node for node, so the values are copied in one batch and the
        session records what that match records. Returns whether it restored; False
        having done nothing."""
        snap = getattr(self.source, "snapshot", None)
        structure = getattr(snap, "_structure", None)
        if snap is None or structure is None or self.matched or self.exclude_keys:
            return False
        walk, _ = walk_of(self.root, skip=self.skipped,  # (a snapshot of a kept walk:
                          mode="try" if snap._kept else "kept")  # a kept one likely here)
        if walk is None or not walk.same_as(self.graph, structure):
            return False
        srcs, dsts = list(snap.arrays.values()), walk.srcs
        fit = walk.fit
        held = snap._batch[1] if snap._batch is not None else None
        if fit is not None and held is not None and fit[0]() is held:
            fit[1].copy_batches(held, walk.batch())  # these buffers, checked before
        else:
            if list(map(_SHAPE, srcs)) != list(map(_SHAPE, dsts)) or \
                    list(map(_DTYPE, srcs)) != list(map(_DTYPE, dsts)) or \
                    any(unwritable(d) is not None for d in dsts if type(d) is np.ndarray):
                return False  # the full match reports it, naming the key
            eng = one_engine(srcs, dsts)
            if eng is not None:  # (then walk.engine is eng)
                held = snap._batch_of(eng)
                walk.fit = (weakref.ref(held), eng)
                eng.copy_batches(held, walk.batch())
            else:
                copy_values(srcs, dsts)
        # what the full match records, made when first asked for (__getattr__)
        self._kept_match = (walk.objects(self.root), walk.live.values)
        del self.matched, self.node_of, self.consumed
        return True

    def __getattr__(self, name: str) -> Any:
        """``matched``, ``node_of`` and ``consumed`` of a restore through a kept walk
        (``restore_kept``), made at the first look (a training loop restoring a
        snapshot at every step never looks)."""
        kept = self.__dict__.get("_kept_match")
        if kept is None or name not in ("matched", "node_of", "consumed"):
            raise AttributeError(name)
        objects, values = kept
        self.matched = dict(enumerate(objects))
        self.node_of = dict(zip(map(id, objects), range(len(objects))))
        self.consumed = set(values)
        del self._kept_match
        return getattr(self, name)

    def restore_subtree(self, obj: Any, node: int, parent: Any = None, name: str | None = None) -> None:
        """Matches obj with stored node (and everything below), then restores the values.
        ``parent`` / ``name``: where obj was just assigned (restore-on-create), so that a
        Python value there can be replaced."""
        g = self.graph
        if parent is not None and name is not None and isinstance(parent, (list, dict)):
            obj = get_child(parent, name)  # a Python value there becomes its PyValue
            if obj is MISSING:
                return
        queue = [(obj, node)]  # breadth-first, so the first path to a node wins
        assign: list[tuple[int, Any, Target]] = []
        replace: list[tuple[int, PyValue]] = []
        memo: TargetMemo = {}  # value targets found by get_child, asked of adapters once
        units: list[tuple[Any, Any, int]] = []  # objects restored as a whole, run last
        added: list[tuple[Any, str, Any]] = []  # pending entries, taken back on failure
        walked: list[int] = []  # nodes matched here, and the objects they were matched to,
        idents: list[Any] = []  # forgotten on failure: a later, fitting value is restored
        head = 0
        while head < len(queue):
            o, n = queue[head]
            head += 1
            if n in self.matched or id(o) in self.exclude_objects:
                continue
            self.matched[n] = o
            walked.append(n)
            first = self.node_of.setdefault(ident(o), n)
            if first == n:
                idents.append(ident(o))
            elif g.value[n] is not None and g.value[first] is not None:
                self._shared(first, n)  # one object, two stored values: the first kept
                continue
            if isinstance(o, PyValue):
                if g.value[n] is not None or g.state[n] is not None:
                    replace.append((n, o))
                continue
            # A value is filled, never restored as a whole (as traverse(whole_units=True)
            # and so unmatched_objects see it): no unit is looked for where a value is.
            target = remembered_target(o, memo)
            unit = unit_restorer(o) if target is None else None
            if unit is not None:  # e.g. a torch optimizer: rebuilt from its whole subtree
                units.append((unit, o, n))
                continue
            key = g.value[n]
            if key is not None and key not in self.exclude_keys and target is not None:
                assign.append((n, o, target))
            edges = g.edges[n]
            if not edges:
                continue
            lookup = child_lookup(o, memo)  # o's children, found once for all its edges
            for edge, child in edges:
                if child in self.matched:
                    continue
                c = lookup(edge)
                if c is MISSING:
                    if can_defer(o) and self._has_values_below(child):
                        entry = deferred.add(o, edge, self, child)
                        if entry is not None:
                            added.append(entry)
                else:
                    queue.append((c, child))
        try:
            if units:  # every value checked before any object's own code runs
                self._targets(assign, True)
                for unit, o, n in units:
                    self._restore_unit(unit, o, n)
            # A unit's restore runs the object's own code (load_state_dict), which may
            # give a tensor met earlier new storage: then every target is asked again.
            self._assign(assign, fresh=not units)
        except BaseException:
            deferred.undo(added)
            for n in walked:
                self.matched.pop(n, None)
            for i in idents:
                self.node_of.pop(i, None)
            raise
        self._replace(replace)

    def _shared(self, first: int, again: int) -> None:
        """Warns that an object already restored from node ``first`` is reached again
        under node ``again``, which holds another value: the checkpoint held two
        objects where the program shares one (tied weights saved untied...). The
        first path's value is kept; the other is not restored (``assert_consumed``
        names it)."""
        keys = self.graph.value
        warnings.warn(f"restore from {self.source.describe()}: one object is reached under "
                      f"{keys[first]!r} and {keys[again]!r}, two values of the checkpoint: "
                      f"it keeps the first; {keys[again]!r} is not restored",
                      RuntimeWarning, stacklevel=4)

    # -- stateful values (stateful.py) ---------------------------------------------------
    def _keys(self) -> dict[str, int]:
        """The checkpoint's keys held by graph nodes, with their node."""
        if self._key_nodes is None:
            self._key_nodes = {k: n for n, k in enumerate(self.graph.value) if k is not None}
        return self._key_nodes

    def _rebuild(self, wanted: list[tuple[int, str | None]]) -> list[tuple[Any, list[int]]]:
        """Per ``(stored node, fallback kind)``: (the Python value of the node, the value
        nodes it was read from), reading every value they name in one batch. A node's
        value is its ``state`` tree with the values it names; a node without one (a
        checkpoint written before states existed) gives its array, rebuilt as the
        fallback kind."""
        g = self.graph
        held = self._keys()
        trees, keys, framework = [], [], []
        for node, fallback in wanted:
            tree = g.state[node]
            if tree is None:
                tree = g.value[node] if fallback in (None, "ndarray") else \
                    {"s": g.value[node], "as": fallback}
            try:
                kinds = skeleton_leaves(tree)
            except (ValueError, TypeError, AttributeError, KeyError, IndexError) as e:
                raise ValueError(f"cannot restore from {self.source.describe()}: malformed "
                                 f"state of graph node {node}: {e}") from None
            names = list(kinds)
            for k in names:
                if k not in held:
                    raise ValueError(f"cannot restore from {self.source.describe()}: the state "
                                     f"of graph node {node} names {k!r}, which the checkpoint "
                                     "lacks")
                keys.append(k)
                if is_framework_kind(kinds[k]):
                    framework.append(k)
            trees.append((node, tree, names))
        # a snapshot's framework arrays in device memory: new arrays on their device
        # (an optimizer's state: no round trip through host memory)
        copies = getattr(self.source, "device_copies", None)
        values: dict[str, Any] = copies(framework) if copies is not None and framework else {}
        keys = [k for k in dict.fromkeys(keys) if k not in values]
        arrays = [np.empty(*self.source.shape_dtype(k)) for k in keys]
        self.source.read(keys, arrays)
        values.update(zip(keys, arrays))
        out = []
        for node, tree, names in trees:
            try:
                out.append((unflatten(tree, values), [held[k] for k in names]))
            except (ValueError, TypeError, AttributeError, KeyError, IndexError) as e:
                raise ValueError(f"cannot restore from {self.source.describe()}: malformed "
                                 f"state of graph node {node}: {e}") from None
        return out

    def _replace(self, replace: list[tuple[int, PyValue]]) -> None:
        """Rebuilds each stored Python value and puts it in place of the live one."""
        if not replace:
            return
        scalar = ("int", "float", "bool", "complex", "numpy_scalar")
        built = self._rebuild([(n, pv.kind if pv.kind in scalar else None) for n, pv in replace])
        for (n, pv), (value, read) in zip(replace, built):
            pv.put(value)
            self.node_of.setdefault(id(value), n)  # a value that is a node itself (an array)
            self.consumed.update(read)
            self.consumed.add(n)

    def _restore_unit(self, unit: Any, obj: Any, node: int) -> None:
        g = self.graph
        if g.state[node] is not None and hasattr(unit, "_pyckpt_load"):
            [(state, read)] = self._rebuild([(node, None)])
            unit._pyckpt_load(state)
            self.consumed.update(read)
            self.consumed.add(node)
            self.units.add(id(obj))
            return
        nodes: list[tuple[int, str, dict[str, Any]]] = []
        keys: list[str] = []
        values: dict[str, Any] = {}
        stack = [(node, values)]
        seen = {node}
        while stack:
            n, out = stack.pop()
            for edge, c in g.edges[n]:
                if c in seen:
                    continue
                seen.add(c)
                key = g.value[c]
                if key is not None and key not in self.exclude_keys:
                    nodes.append((c, edge, out))
                    keys.append(key)
                elif g.edges[c]:
                    out[edge] = {}
                    stack.append((c, out[edge]))
        arrays = []
        for k in keys:
            shape, dtype = self.source.shape_dtype(k)
            arrays.append(np.empty(shape, dtype=dtype))
        self.source.read(keys, arrays)
        for (c, edge, out), arr in zip(nodes, arrays):
            out[edge] = arr
        unit._pyckpt_restore(index_lists(values))
        self.consumed.update(c for c, _, _ in nodes)
        self.units.add(id(obj))

    def _has_values_below(self, node: int) -> bool:
        """Whether a stored node or anything below it holds a (non-excluded) value or a
        state."""
        if self._with_values is None:
            g = self.graph
            parents: list[list[int]] = [[] for _ in range(len(g.value))]
            for n, es in enumerate(g.edges):
                for _, c in es:
                    parents[c].append(n)
            marked = {n for n, k in enumerate(g.value)
                      if k is not None and k not in self.exclude_keys}
            marked.update(n for n, t in enumerate(g.state) if t is not None)
            stack = list(marked)
            while stack:
                for p in parents[stack.pop()]:
                    if p not in marked:
                        marked.add(p)
                        stack.append(p)
            self._with_values = marked
        return node in self._with_values

    def _assign(self, assign: list[tuple[int, Any, Target]], fresh: bool) -> None:
        """Reads the values of matched value nodes ``(node, object, its target as the
        walk found it)`` into their objects in one batch; with ``fresh`` False, the
        targets are asked of the objects again."""
        if not assign:
            return
        keys, dsts, finish, swap = self._targets(assign, fresh)
        self.source.read(keys, dsts)
        finish_byte_order(swap)
        for after in finish:
            after()
        self.consumed.update(n for n, _, _ in assign)

    def _targets(self, assign: list[tuple[int, Any, Target]], fresh: bool
                 ) -> tuple[list[str], list[Any], list[Callable[[], None]], list[np.ndarray]]:
        """(keys, destinations, finishes, targets to byte-swap) of ``_assign``, or one
        ValueError listing every value that does not fit (nothing was restored:
        ``restore_subtree`` then forgets the matches of its walk)."""
        keys, dsts, problems, finish = [], [], [], []
        swap: list[np.ndarray] = []
        for n, obj, found in assign:
            key = self.graph.value[n]
            target = found if fresh else value_target(obj)
            # restore_subtree queues only value nodes matched with objects holding a value
            assert key is not None and target is not None
            dst, after = target
            if after is not None:
                finish.append(after)
            shape, dtype = self.source.shape_dtype(key)
            if tuple(dst.shape) != tuple(shape) or not same_dtype(dst.dtype, dtype):
                ours, theirs = describe_dtypes(dtype, dst.dtype)
                problems.append(f"{key!r}: checkpoint has shape {tuple(shape)} dtype "
                                f"{ours}, the object has shape {tuple(dst.shape)} "
                                f"dtype {theirs}")
            elif isinstance(dst, DeviceArray):
                pass  # filled on its device (SnapshotSource / CheckpointSource.fill)
            elif (why := unwritable(dst)) is not None:
                problems.append(f"{key!r}: the object's array is {why}")
            else:  # a target in the other byte order is filled through a view, then swapped
                view, swapped = source_order_view(dst, dtype)
                if swapped:
                    swap.append(dst)
                dst = view
            keys.append(key)
            dsts.append(dst)
        if problems:  # nothing was restored (restore_subtree forgets these matches)
            raise ValueError(f"cannot restore from {self.source.describe()}:\n  "
                             + "\n  ".join(problems))
        return keys, dsts, finish, swap

    # -- reports -----------------------------------------------------------------------
    def unmatched_checkpoint_keys(self) -> list[str]:
        """Checkpoint keys not restored so far (pending ones included), sorted; excluded
        keys left out. A state held by no key (a string in a dict, a state dict of
        strings only) is named by its path and ``STATE_SUFFIX``."""
        return unrestored_keys(self.graph, self.consumed, self.exclude_keys)

    def unmatched_objects(self) -> list[str]:
        """Paths of live values (reachable from the root now) that received no value:
        arrays, Variables, Python values in lists and dicts, and objects restored as
        a whole (torch optimizers, objects with ``state_dict()``)."""
        live = traverse(self.root, skip=self.exclude_objects, whole_units=True,
                        with_targets=False)
        out = []
        for v in sorted(live_values(live)):
            obj = live.objects[v]
            if v in live.units:
                if id(obj) not in self.units:
                    out.append(path_string(live.paths[v]))
                continue
            n = self.node_of.get(ident(obj))
            if n is None or n not in self.consumed:
                out.append(path_string(live.paths[v]))
        return out

    def pending_count(self) -> int:
        """How many checkpoint values are not restored yet (``unmatched_checkpoint_keys``)."""
        return len(self.unmatched_checkpoint_keys())


def live_values(live: Any) -> list[int]:
    """The live nodes a restore must reach: value nodes, Python values kept as text
    in lists and dicts, and objects restored as a whole (when traversed with
    ``whole_units``)."""
    out = set(live.values) | set(live.units)
    out.update(n for n, o in enumerate(live.objects)
               if isinstance(o, PyValue) and o.parent is not None)
    return sorted(out)


def unrestored_keys(g: Any, consumed: set[int], exclude_keys: set[str]) -> list[str]:
    """``unmatched_checkpoint_keys`` of stored graph g given the nodes consumed."""
    out = [k for n, k in enumerate(g.value)
           if k is not None and n not in consumed and k not in exclude_keys]
    paths = None
    for n, t in enumerate(g.state):
        if t is None or n in consumed or g.value[n] is not None:
            continue
        try:
            if skeleton_leaves(t):
                continue  # reported through its keys
        except (ValueError, TypeError, AttributeError, KeyError, IndexError):
            pass
        paths = paths if paths is not None else g.paths()
        p = paths[n]
        if p is not None:
            out.append("/".join(escape(x) for x in p) + STATE_SUFFIX)
    return sorted(out)


def _listing(items: list[str], limit: int = 50) -> str:
    shown = "\n  ".join(items[:limit])
    more = f"\n  ... and {len(items) - limit} more" if len(items) > limit else ""
    return f"\n  {shown}{more}"


class LoadStatus:
    """The result of ``Checkpoint.restore``/``read``: assertions about what matched.

    Each assertion returns the status (so calls chain) or raises AssertionError
    listing what did not match. ``unmatched_checkpoint_keys()`` and
    ``unmatched_objects()`` give the same lists without asserting.
    """

    def __init__(self, session: RestoreSession | None, reason: str = "") -> None:
        self._session = session
        self._reason = reason
        self._expect_partial = False

    def _need(self) -> RestoreSession:
        if self._session is None:
            raise AssertionError(self._reason or "nothing was restored")
        return self._session

    def unmatched_checkpoint_keys(self) -> list[str]:
        """Checkpoint values not restored into any object (yet)."""
        return [] if self._session is None else self._session.unmatched_checkpoint_keys()

    def unmatched_objects(self) -> list[str]:
        """Paths of existing values (Variables, arrays) that got no checkpoint value."""
        return [] if self._session is None else self._session.unmatched_objects()

    def assert_consumed(self) -> "LoadStatus":
        """Every checkpoint value was restored and every existing value was matched."""
        s = self._need()
        keys = s.unmatched_checkpoint_keys()
        objs = s.unmatched_objects()
        if keys or objs:
            msg = "restore did not consume the whole checkpoint"
            if keys:
                msg += f"; {len(keys)} checkpoint value(s) not restored:" + _listing(keys)
            if objs:
                msg += f"\n{len(objs)} existing object(s) not matched:" + _listing(objs)
            raise AssertionError(msg)
        return self

    def assert_existing_objects_matched(self) -> "LoadStatus":
        """Every value reachable from the root now was restored from the checkpoint."""
        s = self._need()
        objs = s.unmatched_objects()
        if objs:
            raise AssertionError(f"{len(objs)} existing object(s) not matched by the "
                                 "checkpoint:" + _listing(objs))
        return self

    def assert_nontrivial_match(self) -> "LoadStatus":
        """At least one value other than the save counter was restored."""
        s = self._need()
        restored = [s.graph.value[n] for n in s.consumed]
        # (a consumed node holds a value, or a state: k is None)
        if not [k for k in restored if k is None or not k.startswith("save_counter/")]:
            raise AssertionError("nothing besides the save counter was restored: the checkpoint "
                                 "and the objects share no structure")
        return self

    def expect_partial(self) -> "LoadStatus":
        """Marks the restore as intentionally partial (no effect on the assertions)."""
        self._expect_partial = True
        return self

    def __repr__(self) -> str:
        if self._session is None:
            return f"<LoadStatus: {self._reason}>"
        s = self._session
        return (f"<LoadStatus from {s.source.describe()}: {len(s.consumed)} restored, "
                f"{len(s.unmatched_checkpoint_keys())} pending or unmatched>")
