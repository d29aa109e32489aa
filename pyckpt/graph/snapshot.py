"""In-memory copies of state: ``Checkpoint.snapshot()`` and ``pyckpt.copy_state``."""

from __future__ import annotations

from typing import Any

import numpy as np

from .._native import core as _core
from .._dtypes import describe_dtypes, finish_byte_order, same_dtype, source_order_view
from ..load_into import collect_targets
from ..tree import flatten, rebuild_leaf
from .object_graph import StoredGraph, traverse
from .trackable import Trackable


class Snapshot:
    """An in-memory copy of every tracked value of an object graph, with the graph.

    ``Checkpoint.restore(snapshot)`` / ``read(snapshot)`` accept it wherever a
    path is accepted; ``snapshot[key]`` gives one copied array.
    """

    def __init__(self, graph: StoredGraph, arrays: dict[str, np.ndarray],
                 graph_doc: dict | None = None) -> None:
        self.graph = graph
        self.arrays = arrays
        self.graph_doc = graph_doc  # the manifest form of the graph, for writing it out

    def keys(self) -> list[str]:
        """The keys of the copied values."""
        return list(self.arrays)

    def __getitem__(self, key: str) -> np.ndarray:
        return self.arrays[key]

    def __len__(self) -> int:
        return len(self.arrays)

    @property
    def nbytes(self) -> int:
        """Bytes of every copied array."""
        return sum(a.nbytes for a in self.arrays.values())

    def __repr__(self) -> str:
        return f"<Snapshot: {len(self.arrays)} values, {self.nbytes / 1e6:.1f} MB>"


def take_snapshot(root: Any, into: Snapshot | None = None, threads: int = 0) -> Snapshot:
    """Copies every value reachable from root, in parallel (C++ core, GIL released).

    With ``into`` (an earlier snapshot of the same structure) its arrays are
    reused instead of allocating new ones."""
    live = traverse(root)
    keys = live.value_keys()
    srcs = [live.array_of(n) for n in live.values]
    reuse = into.arrays if into is not None else {}
    dsts = []
    for key, src in zip(keys, srcs):
        old = reuse.get(key)
        if old is not None and old.shape == src.shape and old.dtype == src.dtype:
            old.flags.writeable = True  # our own buffer, made read-only when handed out
            dsts.append(old)
        else:
            dsts.append(np.empty(src.shape, dtype=src.dtype))
    _core.copy_arrays(srcs, dsts, threads)
    doc = live.to_json()
    graph = StoredGraph([[(name, c) for name, c in e] for e in doc["children"]], doc["value"])
    for d in dsts:
        d.flags.writeable = False  # a snapshot is a record; restoring copies out of it
    return Snapshot(graph, dict(zip(keys, dsts)), doc)


# ---------------------------------------------------------------------------
# copy_state
# ---------------------------------------------------------------------------

def _sources(x: Any) -> dict[str, np.ndarray]:
    if isinstance(x, Snapshot):
        return dict(x.arrays)
    if isinstance(x, Trackable):
        live = traverse(x)
        return {k: live.array_of(n) for k, n in zip(live.value_keys(), live.values)}
    leaves, _ = flatten(x)
    return {lf.key: lf.array for lf in leaves}


def _targets(x: Any) -> dict[str, tuple[np.ndarray | None, Any]]:
    """key -> (array filled in place, or None and a setter for an immutable leaf)."""
    if isinstance(x, Trackable):
        live = traverse(x)
        return {k: (live.array_of(n), None)
                for k, n in zip(live.value_keys(), live.values)}  # CPU values (views)
    if isinstance(x, Snapshot):
        raise TypeError("copy_state cannot write into a Snapshot; restore it instead")
    out: dict[str, tuple[np.ndarray | None, Any]] = {}
    for t in collect_targets(x):
        if t.sharded is not None:
            raise TypeError(f"copy_state does not copy into ShardedArray {t.key!r}")
        out[t.key] = (t.array, (t.setter, t.kind) if t.array is None else None)
    return out


def copy_state(src: Any, dst: Any, *, strict: bool = True, threads: int = 0) -> Any:
    """Copies every value of ``src`` into the matching value of ``dst`` in parallel.

    Both are Trackables (matched by object-graph keys) or trees (matched by
    flat keys); ``src`` may also be a Snapshot. With ``strict`` (default), keys
    present on one side only and shape/dtype mismatches raise one ValueError
    listing all of them, before anything is copied; without it they are skipped.
    Returns ``dst``.
    """
    s = _sources(src)
    d = _targets(dst)
    problems = []
    if strict:
        missing = [k for k in s if k not in d]
        extra = [k for k in d if k not in s]
        if missing:
            problems.append(f"{len(missing)} key(s) of the source missing in the destination: "
                            + ", ".join(map(repr, missing[:20])))
        if extra:
            problems.append(f"{len(extra)} key(s) of the destination missing in the source: "
                            + ", ".join(map(repr, extra[:20])))
    pairs_src, pairs_dst, setters = [], [], []
    swap: list[np.ndarray] = []
    for key, arr in s.items():
        if key not in d:
            continue
        target, setter = d[key]
        if target is None:
            setters.append((setter, arr))
            continue
        if target.shape != arr.shape or not same_dtype(target.dtype, arr.dtype):
            if strict:
                ours, theirs = describe_dtypes(arr.dtype, target.dtype)
                problems.append(f"{key!r}: source shape {arr.shape} dtype {ours}, "
                                f"destination shape {target.shape} dtype {theirs}")
            continue
        if not target.flags.writeable:
            problems.append(f"{key!r}: destination array is read-only")
            continue
        view, swapped = source_order_view(target, arr.dtype)  # the copy is of raw bytes
        if swapped:
            swap.append(target)
        pairs_src.append(arr)
        pairs_dst.append(view)
    if problems:
        raise ValueError("copy_state: source and destination differ:\n  " + "\n  ".join(problems))
    _core.copy_arrays(pairs_src, pairs_dst, threads)
    finish_byte_order(swap)
    for (setter, kind), arr in setters:
        setter(rebuild_leaf(kind, np.array(arr)))
    return dst
