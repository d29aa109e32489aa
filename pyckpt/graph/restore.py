"""Matching a stored object graph against live objects, and LoadStatus.

A restore walks the stored graph from its root together with the live
objects, by edge names (never by variable names). Values of matched value
nodes are read straight into the live arrays/Variables in one batched read.
Edges without a live counterpart under a Trackable or tracked container
become pending (restore-on-create, deferred.py).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .._dtypes import describe_dtypes, finish_byte_order, same_dtype, source_order_view
from ..device.array import DeviceArray
from . import deferred
from .keys import path_string
from .object_graph import (MISSING, can_defer, get_child, traverse, unit_restorer,
                           value_array, value_target)
from .sources import ValueSource


class RestoreSession:
    """One restore: what was matched, what was restored, what is pending."""

    def __init__(self, source: ValueSource, root: Any, exclude_objects: tuple = (),
                 exclude_keys: tuple = ()) -> None:
        self.source = source
        self.graph = source.graph
        self.root = root
        self.matched: dict[int, Any] = {}      # stored node -> live object
        self.node_of: dict[int, int] = {}      # id(live object) -> stored node
        self.consumed: set[int] = set()        # stored value nodes restored
        self.exclude_objects = {id(o) for o in exclude_objects}
        self.exclude_keys = set(exclude_keys)
        self._with_values: set[int] | None = None
        self.units: set[int] = set()  # ids of objects restored as a whole

    # -- matching --------------------------------------------------------------------
    def restore_subtree(self, obj: Any, node: int, parent: Any = None, name: str | None = None) -> None:
        """Matches obj with stored node (and everything below), then restores the values."""
        g = self.graph
        queue = [(obj, node)]  # breadth-first, so the first path to a node wins
        assign: list[tuple[int, Any]] = []
        head = 0
        while head < len(queue):
            o, n = queue[head]
            head += 1
            if n in self.matched or id(o) in self.exclude_objects:
                continue
            self.matched[n] = o
            self.node_of.setdefault(id(o), n)
            unit = unit_restorer(o)
            if unit is not None:  # e.g. a torch optimizer: rebuilt from its whole subtree
                self._restore_unit(unit, o, n)
                continue
            key = g.value[n]
            if key is not None and key not in self.exclude_keys and value_array(o) is not None:
                assign.append((n, o))
            for edge, child in g.edges[n]:
                if child in self.matched:
                    continue
                c = get_child(o, edge)
                if c is MISSING:
                    if can_defer(o) and self._has_values_below(child):
                        deferred.add(o, edge, self, child)
                else:
                    queue.append((c, child))
        self._assign(assign)

    def _restore_unit(self, unit: Any, obj: Any, node: int) -> None:
        g = self.graph
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
        unit._pyckpt_restore(_lists(values))
        self.consumed.update(c for c, _, _ in nodes)
        self.units.add(id(obj))

    def _has_values_below(self, node: int) -> bool:
        """Whether a stored node or anything below it holds a (non-excluded) value."""
        if self._with_values is None:
            g = self.graph
            parents: list[list[int]] = [[] for _ in range(len(g.value))]
            for n, es in enumerate(g.edges):
                for _, c in es:
                    parents[c].append(n)
            marked = {n for n, k in enumerate(g.value)
                      if k is not None and k not in self.exclude_keys}
            stack = list(marked)
            while stack:
                for p in parents[stack.pop()]:
                    if p not in marked:
                        marked.add(p)
                        stack.append(p)
            self._with_values = marked
        return node in self._with_values

    def _assign(self, assign: list[tuple[int, Any]]) -> None:
        if not assign:
            return
        keys, dsts, problems, finish = [], [], [], []
        swap: list[np.ndarray] = []
        for n, obj in assign:
            key = self.graph.value[n]
            target = value_target(obj)
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
            elif not dst.flags.writeable:
                problems.append(f"{key!r}: the object's array is read-only")
            else:  # a target in the other byte order is filled through a view, then swapped
                view, swapped = source_order_view(dst, dtype)
                if swapped:
                    swap.append(dst)
                dst = view
            keys.append(key)
            dsts.append(dst)
        if problems:
            for n, _ in assign:  # nothing was restored: forget these matches
                self.matched.pop(n, None)
            raise ValueError(f"cannot restore from {self.source.describe()}:\n  "
                             + "\n  ".join(problems))
        self.source.read(keys, dsts)
        finish_byte_order(swap)
        for after in finish:
            after()
        self.consumed.update(n for n, _ in assign)

    # -- reports -----------------------------------------------------------------------
    def unmatched_checkpoint_keys(self) -> list[str]:
        """Checkpoint keys not restored so far (pending ones included), sorted; excluded
        keys left out."""
        g = self.graph
        return sorted(k for n, k in enumerate(g.value)
                      if k is not None and n not in self.consumed and k not in self.exclude_keys)

    def unmatched_objects(self) -> list[str]:
        """Paths of live values (reachable from the root now) that received no value."""
        live = traverse(self.root, skip=self.exclude_objects, stop=self.units)
        out = []
        for v in live.values:
            n = self.node_of.get(id(live.objects[v]))
            if n is None or n not in self.consumed:
                out.append(path_string(live.paths[v]))
        return out

    def pending_count(self) -> int:
        """How many checkpoint values are not restored yet (``unmatched_checkpoint_keys``)."""
        return len(self.unmatched_checkpoint_keys())


def _lists(tree: Any) -> Any:
    """Nested dicts whose keys are all 0..n-1 become lists (stored list indices)."""
    if not isinstance(tree, dict):
        return tree
    out = {k: _lists(v) for k, v in tree.items()}
    if out and all(k.isdigit() for k in out) and sorted(map(int, out)) == list(range(len(out))):
        return [out[str(i)] for i in range(len(out))]
    return out


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
        # (every consumed node holds a value: k is never None)
        if not [k for k in restored if k is not None and not k.startswith("save_counter/")]:
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
