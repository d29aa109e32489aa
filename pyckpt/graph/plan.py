"""``Checkpoint.restore_plan``: a dry run of a restore, touching no value."""

from __future__ import annotations

import dataclasses
from collections import Counter
from typing import Any


from .._dtypes import describe_dtypes, same_dtype
from ..tree import skeleton_leaves
from .keys import STATE_SUFFIX, escape, path_string
from .nodes import value_array
from .object_graph import MISSING, can_defer, child_lookup, ident, traverse, unit_restorer
from .restore import live_values, unrestored_keys
from .sources import ValueSource
from .stateful import PyValue


@dataclasses.dataclass(frozen=True)
class Conflict:
    """A checkpoint value and a live value matched by path whose shape or dtype differ."""

    key: str
    checkpoint_shape: tuple[int, ...]
    checkpoint_dtype: str
    object_shape: tuple[int, ...]
    object_dtype: str

    def __str__(self) -> str:
        return (f"{self.key}: checkpoint {self.checkpoint_shape} {self.checkpoint_dtype}, "
                f"object {self.object_shape} {self.object_dtype}")


@dataclasses.dataclass(frozen=True)
class RestorePlan:
    """What ``restore(path)`` would do now.

    - ``restore``: (checkpoint key, object path) pairs restored right away;
    - ``pending``: keys whose objects do not exist yet but would be restored
      when created (restore-on-create);
    - ``unmatched_checkpoint_keys``: keys that would not be restored now
      (includes ``pending``);
    - ``unmatched_objects``: paths of existing values the checkpoint has no value for;
    - ``conflicts``: matched pairs whose shape or dtype differ (restore would raise);
    - ``suggested_prefix_map``: ``{checkpoint key prefix: object key prefix}`` when
      the two structures match much better after swapping one prefix, else None.
    """

    restore: list[tuple[str, str]]
    pending: list[str]
    unmatched_checkpoint_keys: list[str]
    unmatched_objects: list[str]
    conflicts: list[Conflict]
    suggested_prefix_map: dict[str, str] | None

    @property
    def ok(self) -> bool:
        """True when a restore would consume everything with no conflict."""
        return not (self.unmatched_checkpoint_keys or self.unmatched_objects or self.conflicts)

    def __str__(self) -> str:
        lines = [f"restore plan: {len(self.restore)} value(s) restored now, "
                 f"{len(self.pending)} pending until their objects exist, "
                 f"{len(self.unmatched_checkpoint_keys) - len(self.pending)} checkpoint value(s) "
                 f"with no object, {len(self.unmatched_objects)} object(s) with no value, "
                 f"{len(self.conflicts)} shape/dtype conflict(s)"]
        for c in self.conflicts:
            lines.append(f"  conflict  {c}")
        for k in self.unmatched_checkpoint_keys[:20]:
            lines.append(f"  {'pending' if k in self.pending else 'unused':8s}  {k}")
        for p in self.unmatched_objects[:20]:
            lines.append(f"  no value  {p}")
        if self.suggested_prefix_map:
            lines.append(f"  suggestion: map checkpoint prefixes {self.suggested_prefix_map}")
        return "\n".join(lines)


def make_plan(source: ValueSource, root: Any, exclude_objects: tuple = (),
              exclude_keys: tuple = ()) -> RestorePlan:
    """The RestorePlan of restoring ``source`` into ``root`` now, reading no value;
    ``exclude_objects`` and ``exclude_keys`` are left out as the restore would."""
    g = source.graph
    excl_keys = set(exclude_keys)
    walk = _DryRun(source, root, {id(o) for o in exclude_objects}, excl_keys)
    unmatched_keys = unrestored_keys(g, walk.consumed, excl_keys)
    pending = sorted(_keys_below(g, walk.pending_nodes, excl_keys) & set(unmatched_keys))
    live = walk.live
    unmatched_objects = [path_string(live.paths[v]) for v in live_values(live)
                         if ident(live.objects[v]) not in walk.matched_live]
    suggestion = None
    if unmatched_keys and unmatched_objects:
        suggestion = _suggest_prefix(g, live, excl_keys)
    return RestorePlan(walk.restore, pending, unmatched_keys, unmatched_objects, walk.conflicts,
                       suggestion)


class _DryRun:
    """The matching walk of a restore (restore.py), reading no value: breadth-first
    from the root, so the first path to a node wins; what it would restore, the
    conflicts, the nodes left pending and what it consumed."""

    def __init__(self, source: ValueSource, root: Any, excl_obj: set[int],
                 excl_keys: set[str]) -> None:
        self.source = source
        self.g = source.graph
        self.excl_keys = excl_keys
        self.live = traverse(root, skip=excl_obj, whole_units=True, with_targets=False)
        self.live_index = {ident(o): i for i, o in enumerate(self.live.objects)}
        self.matched: dict[int, Any] = {}
        self.restore: list[tuple[str, str]] = []
        self.conflicts: list[Conflict] = []
        self.pending_nodes: list[int] = []
        self.matched_live: set[Any] = set()
        self.consumed: set[int] = set()
        self._node_of: dict[Any, int] = {}  # the first node each object was matched to
        self._walk(root)

    def _walk(self, root: Any) -> None:
        queue = [(root, 0)]
        head = 0
        while head < len(queue):
            o, n = queue[head]
            head += 1
            if n in self.matched:
                continue
            self.matched[n] = o
            first = self._node_of.setdefault(ident(o), n)
            if first != n and self.g.value[n] is not None and self.g.value[first] is not None:
                continue  # one object, two stored values: restore keeps the first only
            if isinstance(o, PyValue) or unit_restorer(o) is not None:
                self._whole(o, n)  # restored by replacement / as a whole: not descended into
                continue
            self._value(o, n)
            edges = self.g.edges[n]
            if not edges:
                continue
            lookup = child_lookup(o)  # o's children, found once for all its edges
            for edge, child in edges:
                if child in self.matched:
                    continue
                c = lookup(edge)
                if c is MISSING:
                    if can_defer(o):
                        self.pending_nodes.append(child)
                else:
                    queue.append((c, child))

    def _where(self, i: int | None) -> str:
        return path_string(self.live.paths[i]) if i is not None else "?"

    def _whole(self, o: Any, n: int) -> None:
        """An object restored by replacement or as a whole: from its state, or the keys
        below it."""
        g = self.g
        if isinstance(o, PyValue) and g.value[n] is None and g.state[n] is None:
            return
        where = self._where(self.live_index.get(ident(o)))
        below = _nodes_below(g, [n]) if not isinstance(o, PyValue) else {n}
        if g.state[n] is not None:
            below |= _state_nodes(g, n)
        keys: list[str] = sorted(k for k in (g.value[m] for m in below)
                                 if k is not None and k not in self.excl_keys)
        if not keys and g.state[n] is None:
            return
        paths = g.paths()
        self.restore.extend((k, where) for k in keys or
                            ["/".join(escape(x) for x in paths[n] or []) + STATE_SUFFIX])
        self.consumed |= below | {n}
        self.matched_live.add(ident(o))

    def _value(self, o: Any, n: int) -> None:
        """A value node matched with ``o``: restored, or a conflict."""
        key = self.g.value[n]
        arr = value_array(o)
        if key is None or key in self.excl_keys or arr is None:
            return
        shape, dtype = self.source.shape_dtype(key)
        where = self._where(self.live_index.get(id(o)))
        if tuple(arr.shape) != tuple(shape) or not same_dtype(arr.dtype, dtype):
            stored_name, live_name = describe_dtypes(dtype, arr.dtype)
            self.conflicts.append(Conflict(key, tuple(shape), stored_name, tuple(arr.shape),
                                           live_name))
        else:
            self.restore.append((key, where))
            self.matched_live.add(id(o))
            self.consumed.add(n)


def _nodes_below(g: Any, nodes: list[int]) -> set[int]:
    """The stored nodes reachable from ``nodes`` (themselves included)."""
    seen = set(nodes)
    stack = list(nodes)
    while stack:
        n = stack.pop()
        for _, c in g.edges[n]:
            if c not in seen:
                seen.add(c)
                stack.append(c)
    return seen


def _state_nodes(g: Any, n: int) -> set[int]:
    """The value nodes the state of stored node n names."""
    try:
        keys = set(skeleton_leaves(g.state[n]))
    except (ValueError, TypeError, AttributeError, KeyError, IndexError):
        return set()
    return {m for m, k in enumerate(g.value) if k in keys}


def _keys_below(g: Any, nodes: list[int], excl: set[str]) -> set[str]:
    """The keys (and names of keyless states) held at or below ``nodes``."""
    below = _nodes_below(g, nodes)
    out = {g.value[n] for n in below if g.value[n] is not None and g.value[n] not in excl}
    paths = g.paths()
    out.update("/".join(escape(x) for x in paths[n] or []) + STATE_SUFFIX
               for n in below if g.state[n] is not None and g.value[n] is None)
    return out


def _suggest_prefix(g: Any, live: Any, excl: set[str]) -> dict[str, str] | None:
    """The (checkpoint prefix, object prefix) swap that lines up the most values."""
    stored_paths = g.paths()
    ck = [tuple(stored_paths[n]) for n, k in enumerate(g.value)
          if k is not None and k not in excl and stored_paths[n] is not None]
    ob = [tuple(live.paths[v]) for v in live.values]
    by_suffix: dict[tuple, list[tuple]] = {}
    for p in ob:
        for k in range(1, len(p) + 1):
            by_suffix.setdefault(p[-k:], []).append(p[:-k])
    votes: Counter = Counter()
    for p in ck:
        for k in range(len(p), 0, -1):
            prefixes = by_suffix.get(p[-k:])
            if prefixes:
                for q in set(prefixes):
                    votes[(p[:-k], q)] += 1
                break
    votes.pop(((), ()), None)
    if not votes:
        return None
    (cp, op), count = votes.most_common(1)[0]
    if count < max(1, min(len(ck), len(ob)) // 2):
        return None
    fmt = lambda parts: "".join(escape(x) + "/" for x in parts)  # noqa: E731
    return {fmt(cp): fmt(op)}
