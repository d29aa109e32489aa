"""In-memory copies of state: ``Checkpoint.snapshot()`` and ``pyckpt.copy_state``.

Values in device memory (``pyckpt.device.DeviceArray``: CUDA tensors, ...) stay
on their device: a snapshot keeps its copy of a device value in a buffer on
the same device (or, when asked, in page-locked host memory), and copies
between two values of one device run on that device, ordered with the
caller's own work (``CopyEngine.copy``), never crossing PCIe. Host values are
copied in parallel by the C++ core. The copies are made by
``pyckpt.device.copies.copy_values``, the one routine that moves a batch of
values between any mix of host arrays and DeviceArrays; page-locked buffers
come from ``pyckpt.device.buffers.PinnedPool``.
"""

from __future__ import annotations

import weakref
from itertools import repeat
from operator import attrgetter
from typing import Any, Callable, cast

import numpy as np

from .._dtypes import describe_dtypes, refuse_objects, same_dtype
from ..device.array import DeviceArray
from ..device.buffers import PinnedPool
from ..device.copies import Value, copy_values, host_copy, one_engine, unwritable
from ..device.engine import Batch, CopyEngine
from ..format.json_scan import no_cyclic_gc
from ..load_into import collect_targets
from ..registry import copy_leaves, node_proxy
from ..tree import (flatten, is_array_kind, paired_leaves, replacement_scalar, skeleton_leaves,
                    unflatten)
from ..variables import Variable
from .keys import SAVE_COUNTER_KEY, VALUE_SUFFIX, escape, index_lists, unescape
from .nodes import value_target
from .object_graph import LiveGraph, StoredGraph, traverse, unit_restorer
from .stateful import PyValue
from .trackable import Trackable
from .walk_cache import Walk, walk_of

__all__ = ["Snapshot", "take_snapshot", "copy_state", "copy_values"]


# ---------------------------------------------------------------------------
# Snapshots
# ---------------------------------------------------------------------------

class Snapshot:
    """An in-memory copy of every tracked value of an object graph, with the graph.

    ``Checkpoint.restore(snapshot)`` / ``read(snapshot)`` and
    ``pyckpt.copy_state(snapshot, obj)`` accept it wherever a path is accepted.

    Where the copies live: host values in (read-only) host arrays; device values
    (CUDA tensors, ...) in buffers on the same device, or in page-locked host
    memory for a snapshot taken with ``host=True``.

    ``snapshot[key]`` gives the copy of one value: a read-only numpy array for a
    host buffer, the framework's own object for a device buffer (the torch
    tensor, ``DeviceArray.obj``), which must not be written to (a snapshot is a
    record; restoring copies out of it). ``snapshot.arrays`` maps each key to the
    raw buffer (a numpy array or a ``pyckpt.device.DeviceArray``).
    """

    def __init__(self, graph: StoredGraph, arrays: dict[str, Value],
                 graph_doc: dict | None = None) -> None:
        self.graph = graph
        self.arrays = arrays
        self.graph_doc = graph_doc  # the manifest form of the graph, for writing it out
        self._pool = PinnedPool()  # the page-locked buffers we own (``host=True``)
        self._structure: tuple | None = None  # LiveGraph.structure() of the walk taken
        self._walk: Callable[[], Walk | None] = _no_walk  # the kept walk it was taken from
        self._host = False  # taken with host=True
        self._kept = False  # taken from a kept walk (walk_cache)
        self._batch: tuple[CopyEngine, Batch] | None = None  # its buffers as one engine's
        #: the buffers of a walk's Split: (the device part's Batch, the host buffers)
        self._parts: tuple[Batch, list[np.ndarray]] | None = None

    def _batch_of(self, eng: CopyEngine) -> Batch:
        """Its buffers (every one a DeviceArray of ``eng``) as ``eng``'s Batch, made
        once: a snapshot's buffers are its own, never changed but by copies into them."""
        if self._batch is None or self._batch[0] is not eng:
            self._batch = (eng, eng.batch(cast(list[DeviceArray], list(self.arrays.values()))))
        return self._batch[1]

    def keys(self) -> list[str]:
        """The keys of the copied values."""
        return list(self.arrays)

    def __getitem__(self, key: str) -> Any:
        a = self.arrays[key]
        return a.obj if isinstance(a, DeviceArray) else a

    def __len__(self) -> int:
        return len(self.arrays)

    @property
    def nbytes(self) -> int:
        """Bytes of every copied value."""
        return sum(a.nbytes for a in self.arrays.values())

    @property
    def device_nbytes(self) -> int:
        """Bytes of the copies held in device memory."""
        return sum(a.nbytes for a in self.arrays.values() if isinstance(a, DeviceArray))

    @property
    def _pinned(self) -> dict[CopyEngine, np.ndarray]:
        """Our page-locked buffers, by engine."""
        return self._pool.slabs

    def __repr__(self) -> str:
        dev = self.device_nbytes
        where = f", {dev / 1e6:.1f} MB on device" if dev else ""
        return f"<Snapshot: {len(self.arrays)} values, {self.nbytes / 1e6:.1f} MB{where}>"


def _same_buffer(old: Any, src: Value) -> bool:
    if isinstance(src, DeviceArray):
        return (isinstance(old, DeviceArray) and old.engine is src.engine
                and old.device == src.device and old.shape == src.shape
                and old.dtype == src.dtype)
    return isinstance(old, np.ndarray) and old.shape == src.shape and old.dtype == src.dtype


def _no_walk() -> None:
    return None


def take_snapshot(root: Any, into: Snapshot | None = None, threads: int = 0, *,
                  host: bool = False) -> Snapshot:
    """Copies every value reachable from ``root`` (a Trackable, an ``nn.Module``, any
    graph node): host values in parallel (C++ core, GIL released), device values
    on their device into buffers of the same device (``engine.empties_like``,
    ``engine.copy``: queued in order with the caller's work, nothing crosses PCIe).

    ``host=True`` puts the copies of device values in page-locked host memory
    instead (one buffer per device from ``engine.alloc_host``, given back when the
    snapshot is garbage-collected), copied asynchronously and waited for.

    With ``into`` (an earlier snapshot of the same structure) its buffers are
    reused instead of allocating new ones (device buffers, host arrays, and the
    page-locked buffer, which then belongs to the new snapshot), and so is its
    stored graph where the walk found the same graph (``LiveGraph.structure``:
    edges, value nodes and type names, no states).

    The walk of root is kept and re-checked at the next call instead of walked
    again where it can be (``walk_cache``); an ``into`` taken from the kept walk
    that still holds gives its buffers key for key without a look at each."""
    walk, live = walk_of(root, states=True)
    structure: tuple | None
    if walk is not None:
        keys, srcs, structure = walk.keys, walk.srcs, walk.structure
    else:
        assert live is not None
        keys = live.value_keys()
        srcs = [live.array_of(n) for n in live.values]
        structure = live.structure()
    snap = Snapshot(StoredGraph([], []), {})
    eng = walk.engine if walk is not None and not host else None
    split = walk.split if walk is not None and eng is None and not host else None
    batch: Batch | None = None
    parts: tuple[Batch, list[np.ndarray]] | None = None  # (split's buffers)
    if walk is not None and into is not None and into._walk() is walk and not host \
            and not into._host and len(into.arrays) == len(srcs):
        final = list(into.arrays.values())  # taken from this walk: each fits its key
        if eng is not None:  # the same buffers: their batch, made at an earlier call
            batch = into._batch_of(eng)
        else:
            for d in final:
                if isinstance(d, np.ndarray):
                    d.flags.writeable = True  # our own buffer, read-only when handed out
            if split is not None and into._parts is not None:
                parts = into._parts
                split.engine.copy_batches(split.batch, parts[0])
    elif eng is not None and into is None:  # new buffers holding copies, in one batch
        assert walk is not None
        with no_cyclic_gc():  # a buffer object per value, none in a cycle: no collections
            batch = eng.clones(walk.batch())
        final = cast(list[Value], batch.arrays)
    elif split is not None and into is None:  # device copies in one batch, host ones apart
        with no_cyclic_gc():
            made = split.engine.clones(split.batch)
            bufs = [np.empty(a.shape, a.dtype) for a in split.host_arrays]
        parts = (made, bufs)
        final = _placed(len(srcs), (split.device, made.arrays), (split.host, bufs))
    else:
        with no_cyclic_gc():
            final = _snapshot_buffers(keys, srcs, into, host, snap._pool)
        if eng is not None:  # buffers made like the walk's values: all of its engine
            batch = eng.batch(final)
    if eng is not None:
        assert walk is not None and batch is not None
        if final is not batch.arrays:  # (clones: copied when made)
            eng.copy_batches(walk.batch(), batch)
        snap._batch = (eng, batch)
    elif parts is not None:
        assert split is not None
        host_copy(split.host_arrays, parts[1], threads)  # (the device part: issued above)
        snap._parts = parts
    else:
        copy_values(srcs, final, threads)
    if into is not None and structure is not None and (into._structure is structure or
                                                       into._structure == structure):
        snap.graph, snap.graph_doc = into.graph, into.graph_doc  # the same document
    elif walk is not None:
        snap.graph, snap.graph_doc = walk.stored(root)
    else:
        assert live is not None
        doc = live.to_json()
        snap.graph = StoredGraph.from_doc(doc)
        snap.graph_doc = doc
    snap._structure = structure
    snap._host = host
    if walk is not None:
        snap._walk = weakref.ref(walk)
        snap._kept = True
    if eng is None:  # (the engine's buffers are DeviceArrays)
        for d in final:
            if isinstance(d, np.ndarray):
                d.flags.writeable = False  # a snapshot is a record; restoring copies out of it
    snap.arrays = dict(zip(keys, final))
    return snap


def _placed(n: int, *parts: tuple[list[int], list[Any]]) -> list[Value]:
    """A list of ``n`` values with each part's values at its positions."""
    out: list[Any] = [None] * n
    for where, values in parts:
        for i, v in zip(where, values):
            out[i] = v
    return out


def _snapshot_buffers(keys: list[str], srcs: list[Value], into: Snapshot | None, host: bool,
                      pool: PinnedPool) -> list[Value]:
    """A buffer for the copy of each source: ``into``'s buffer of the key where it
    fits, else a new one (on the source's device: ``engine.empties_like`` of the
    engine's sources, in one call per engine; in ``pool``'s page-locked memory for a
    device value with ``host``)."""
    if into is None and not host and srcs and \
            all(map(isinstance, srcs, repeat(DeviceArray))):
        engines = set(map(_ENGINE, srcs))
        if len(engines) == 1:
            return list(engines.pop().empties_like(srcs))
    reuse: dict[str, Value] = into.arrays if into is not None else {}
    dsts: list[Value | None] = [None] * len(srcs)
    pinned: list[tuple[int, DeviceArray]] = []
    fresh: dict[CopyEngine, list[int]] = {}
    for i, (key, src) in enumerate(zip(keys, srcs)):
        old = reuse.get(key)
        if isinstance(src, DeviceArray) and host:
            pinned.append((i, src))
        elif old is not None and _same_buffer(old, src):
            if isinstance(old, np.ndarray):
                old.flags.writeable = True  # our own buffer, made read-only when handed out
            dsts[i] = old
        elif isinstance(src, DeviceArray):
            fresh.setdefault(src.engine, []).append(i)
        else:
            dsts[i] = np.empty(src.shape, dtype=src.dtype)
    for eng, pick in fresh.items():
        made = eng.empties_like([cast(DeviceArray, srcs[i]) for i in pick])
        for i, new in zip(pick, made):
            dsts[i] = new
    placed = pool.place([src for _, src in pinned], into._pool if into is not None else None)
    for (i, _), buf in zip(pinned, placed):
        dsts[i] = buf
    final: list[Value] = [d for d in dsts if d is not None]
    assert len(final) == len(srcs)
    return final


# ---------------------------------------------------------------------------
# copy_state
# ---------------------------------------------------------------------------

def _is_graph(x: Any) -> bool:
    """Whether x is matched by object-graph keys: a Trackable, or a foreign object an
    adapter stands for (a torch ``nn.Module`` or optimizer, ...)."""
    if isinstance(x, Trackable):
        return True
    if isinstance(x, (dict, list, tuple, np.ndarray, Variable, Snapshot, DeviceArray)):
        return False
    return node_proxy(x) is not None


def _sources(x: Any, live: LiveGraph | None = None
             ) -> tuple[dict[str, Value], dict[str, Any], dict[str, str]]:
    """(key -> value, key prefix of a stateful object -> its stored state tree, key ->
    leaf kind of the Python and numpy scalars among the values where it is known).
    ``live``: a full walk of x just made."""
    if isinstance(x, Snapshot):
        kinds = {k: kind for tree in x.graph.state if tree is not None
                 for k, kind in skeleton_leaves(tree).items() if not is_array_kind(kind)}
        return dict(x.arrays), _states(x.graph), kinds
    if _is_graph(x):
        live = live if live is not None else traverse(x)
        keys = live.value_keys()
        values = {k: live.array_of(n) for k, n in zip(keys, live.values)}
        kinds = {k: o.kind for k, o in ((k, live.objects[n]) for k, n in zip(keys, live.values))
                 if isinstance(o, PyValue) and o.kind is not None and not is_array_kind(o.kind)}
        return values, {live.prefixes[n]: t for n, t in live.states().items()}, kinds
    leaves, _ = flatten(x)
    return ({lf.key: lf.array for lf in leaves}, {},
            {lf.key: lf.kind for lf in leaves if not is_array_kind(lf.kind)})


def _states(g: StoredGraph) -> dict[str, Any]:
    paths = g.paths()
    return {"/".join(escape(p) for p in paths[n] or []): t for n, t in enumerate(g.state)
            if t is not None and paths[n] is not None}


class _Targets:
    """The destinations of a copy_state, by key."""

    def __init__(self) -> None:
        #: key -> (value filled in place, finish to run once it is filled, or None)
        self.arrays: dict[str, tuple[Value, Callable[[], None] | None]] = {}
        #: key -> the graph object whose target is in ``arrays`` (to ask it again)
        self.objects: dict[str, Any] = {}
        #: key -> (setter replacing an immutable leaf in its container, its leaf kind)
        self.setters: dict[str, tuple[Callable[[Any], None], str]] = {}
        #: (key prefix, restorer) of objects restored as a whole (a torch optimizer)
        self.units: list[tuple[str, Any]] = []
        #: (key prefix, value) of Python values stored as text (str, None in a dict)
        self.texts: list[tuple[str, PyValue]] = []


def _targets(x: Any) -> _Targets:
    out = _Targets()
    if isinstance(x, Snapshot):
        raise TypeError("copy_state cannot write into a Snapshot; restore it instead")
    if _is_graph(x):
        live = traverse(x, whole_units=True)  # objects restored as a whole: not below
        out.units = [(live.prefixes[n], unit_restorer(live.objects[n])) for n in live.units]
        out.texts = [(live.prefixes[n], o) for n, o in enumerate(live.objects)
                     if isinstance(o, PyValue) and o.parent is not None and o.array is None]
        for k, n in zip(live.value_keys(), live.values):
            obj = live.objects[n]
            if isinstance(obj, PyValue) and obj.parent is not None:  # replaced, not filled
                out.setters[k] = (obj.put, obj.kind or "ndarray")
            else:
                out.arrays[k] = live.target_of(n)
                out.objects[k] = obj
        return out
    for t in collect_targets(x):
        if t.sharded is not None:
            raise TypeError(f"copy_state does not copy into ShardedArray {t.key!r}")
        if t.array is None:
            assert t.setter is not None  # a target without an array is a leaf with a setter
            out.setters[t.key] = (t.setter, t.kind)
        else:
            out.arrays[t.key] = (t.array, t.after)
    return out


def _nested(paths: list[list[str]], values: list[np.ndarray]) -> Any:
    """A tree of dicts from each value's edge names below a unit; dicts keyed 0..n-1
    become lists (as a restore from a checkpoint builds it)."""
    tree: dict[str, Any] = {}
    for parts, v in zip(paths, values):
        node = tree
        for p in parts[:-1]:
            node = node.setdefault(p, {})
        node[parts[-1]] = v
    return index_lists(tree)


def _is_below(prefix: str, key: str) -> bool:
    """Whether ``key`` names a value below the node at ``prefix``."""
    if not key.endswith(VALUE_SUFFIX):
        return False
    return not prefix or (len(key) - len(VALUE_SUFFIX) > len(prefix)
                          and key.startswith(prefix + "/"))


def _below(prefix: str, key: str) -> list[str] | None:
    """The edge names from the node at ``prefix`` to the value under ``key``, or None
    when ``key`` is not below it."""
    if not _is_below(prefix, key):
        return None
    rel = key[len(prefix) + 1 if prefix else 0: -len(VALUE_SUFFIX)]
    return [unescape(p) for p in rel.split("/")]


def copy_state(src: Any, dst: Any, *, strict: bool = True, threads: int = 0) -> Any:
    """Copies every value of ``src`` into the matching value of ``dst``, in place.

    Both are graph objects (Trackables, torch ``nn.Module``s and optimizers: matched
    by object-graph keys) or trees (matched by flat keys); ``src`` may also be a
    Snapshot. With ``strict`` (default), keys present on one side only and
    shape/dtype mismatches raise one ValueError listing all of them, before
    anything is copied; without it they are skipped. Returns ``dst``.

    Device values are copied on their device: pairs of one device in one batch
    queued with the caller's work (torch: ``_foreach_copy_`` on the current
    stream), host/device pairs through the device's copy engine (waited for).
    A destination is always written in place (a tensor keeps its storage). An
    object restored as a whole (a torch optimizer) gets the source's values
    below it through its restore hook, as ``Checkpoint.restore`` does. So is a
    Checkpoint's ``save_counter``: copied (and created) when the source has one,
    left alone when it has none.

    Two trees of one structure whose leaves are all writable numpy arrays, or all
    taken by an adapter's ``copy`` hook (torch tensors; unless ``threads`` is
    given), are copied in one batch without the per-value path: they match key for
    key, shape for shape and dtype for dtype, so nothing can differ that strict
    checking would report.
    """
    leaves = paired_leaves(src, dst)
    if leaves is not None and leaves[0] and (_copy_host_arrays(*leaves, threads) or
                                             (not threads and copy_leaves(*leaves))):
        return dst
    done, live = _copy_kept(src, dst, threads)
    if done:
        return dst
    s, states, kinds = _sources(src, live)
    counter = _save_counter(dst)
    if counter is not None and SAVE_COUNTER_KEY in s:
        counter()  # created to be copied into, as restore creates it
    d = _targets(dst)
    if counter is not None and SAVE_COUNTER_KEY not in s:
        d.arrays.pop(SAVE_COUNTER_KEY, None)  # left alone, as restore leaves it
        d.objects.pop(SAVE_COUNTER_KEY, None)
    unit_keys = [[k for k in s if k not in d.arrays and k not in d.setters
                  and _is_below(prefix, k)] for prefix, _ in d.units]
    problems = _key_problems(s, d, states, unit_keys) if strict else []
    pairs = _Pairs.match(s, d, strict, problems)
    if problems:
        raise ValueError("copy_state: source and destination differ:\n  " + "\n  ".join(problems))
    _restore_units(s, d, states, unit_keys, threads)
    if d.units:  # their own code (load_state_dict) may have given a value new storage
        pairs.ask_again(d.objects)
    copy_values(pairs.srcs, pairs.dsts, threads)
    for f in pairs.finish:
        if f is not None:
            f()
    for prefix, pv in d.texts:  # strings, None...: from the source's stored state
        if prefix in states and not skeleton_leaves(states[prefix]):
            pv.put(unflatten(states[prefix], {}))
    scalars = [np.empty(arr.shape, dtype=arr.dtype) for _, _, arr, _ in pairs.setters]
    copy_values([arr for _, _, arr, _ in pairs.setters], scalars, threads)
    for (setter, kind, _, key), value in zip(pairs.setters, scalars):
        setter(replacement_scalar(kinds.get(key), value, kind))
    return dst


_SHAPE, _DTYPE, _ENGINE = attrgetter("shape"), attrgetter("dtype"), attrgetter("engine")


def _copy_kept(src: Any, dst: Any, threads: int) -> tuple[bool, LiveGraph | None]:
    """copy_state through kept walks (``walk_cache``): when ``src`` (a Snapshot of a
    graph without states, or a graph whose walk is kept) and ``dst`` (a graph whose
    walk is kept) have one structure, every value of the same shape and dtype and
    every host destination writable, their values are copied in one batch, key for
    key, as the full path would pair them. Returns (whether it copied, the full walk
    of ``src`` made on the way, for the full path)."""
    if not _is_graph(dst):
        return False, None
    if isinstance(src, Snapshot):
        if src._structure is None:
            return False, None
        kept: Any = src.graph
        structure: tuple | None = src._structure
        srcs = list(src.arrays.values())
        has_counter = SAVE_COUNTER_KEY in src.arrays
        mode = "try" if src._kept else "kept"
    elif _is_graph(src):
        sw, live = walk_of(src)
        if sw is None:
            return False, live
        kept, structure, srcs = sw, sw.structure, sw.srcs
        has_counter = SAVE_COUNTER_KEY in sw.keys
        mode = "try"
    else:
        return False, None
    counter = _save_counter(dst)
    if counter is not None and has_counter:
        counter()  # created to be copied into, as the full path creates it
    # a destination's counter the source lacks is left alone, as the full path leaves it
    left = dst.__dict__.get("_save_counter") if counter is not None and not has_counter \
        else None
    dw, _ = walk_of(dst, skip=() if left is None else (left,), mode=mode)
    if dw is None or not dw.same_as(kept, structure):
        return False, None
    dsts = dw.srcs
    if list(map(_SHAPE, srcs)) != list(map(_SHAPE, dsts)) or \
            list(map(_DTYPE, srcs)) != list(map(_DTYPE, dsts)) or \
            any(t.hasobject for t in set(map(_DTYPE, dsts))) or \
            any(unwritable(d) is not None for d in dsts if type(d) is np.ndarray):
        return False, None
    eng: CopyEngine | None = dw.engine
    if eng is None:
        copy_values(srcs, dsts, threads)
    elif isinstance(src, Snapshot) and one_engine(srcs, dsts) is eng:
        eng.copy_batches(src._batch_of(eng), dw.batch())  # (their dtypes: compared)
    elif isinstance(kept, Walk) and kept.engine is eng:
        eng.copy_batches(kept.batch(), dw.batch())
    else:
        copy_values(srcs, dsts, threads)
    return True, None


def _save_counter(dst: Any) -> Callable[[], Any] | None:
    """For a Checkpoint destination, the function creating its save counter (a
    Checkpoint's counter is lazily created: copy_state treats it as restore does);
    None for any other destination."""
    if not isinstance(dst, Trackable):
        return None
    return getattr(dst, "_maybe_create_save_counter", None)


def _copy_host_arrays(srcs: list, dsts: list, threads: int) -> bool:
    """Copies every pair in one parallel batch and returns True when all are numpy
    arrays of one shape and dtype (no Python objects) with a writable destination;
    else False, nothing copied."""
    for a, b in zip(srcs, dsts):
        if not isinstance(a, np.ndarray) or not isinstance(b, np.ndarray) or \
                a.dtype != b.dtype or a.shape != b.shape or unwritable(b) is not None or \
                a.dtype.hasobject:
            return False
    copy_values(srcs, dsts, threads)
    return True


def _key_problems(s: dict[str, Value], d: _Targets, states: dict[str, Any],
                  unit_keys: list[list[str]]) -> list[str]:
    """The keys of one side that the other lacks, as copy_state reports them."""
    claimed = {k for ks in unit_keys for k in ks}
    missing = [k for k in s if k not in d.arrays and k not in d.setters and k not in claimed]
    extra = [k for k in list(d.arrays) + list(d.setters) if k not in s]
    extra += [f"{prefix or '<root>'} (restored as a whole)"
              for (prefix, _), ks in zip(d.units, unit_keys) if not ks and prefix not in states]
    extra += [f"{prefix} (a {type(pv.value).__name__})" for prefix, pv in d.texts
              if prefix not in states]
    problems = []
    if missing:
        problems.append(f"{len(missing)} key(s) of the source missing in the destination: "
                        + ", ".join(map(repr, missing[:20])))
    if extra:
        problems.append(f"{len(extra)} key(s) of the destination missing in the source: "
                        + ", ".join(map(repr, extra[:20])))
    return problems


class _Pairs:
    """The values copy_state copies: (source, destination) pairs filled in place, the
    finishes to run once they are, and the leaves replaced through setters."""

    def __init__(self) -> None:
        self.keys: list[str] = []
        self.srcs: list[Value] = []
        self.dsts: list[Value] = []
        self.finish: list[Callable[[], None] | None] = []  # per pair
        #: (setter, the destination's leaf kind, source value, key)
        self.setters: list[tuple[Callable[[Any], None], str, Value, str]] = []

    @classmethod
    def match(cls, s: dict[str, Value], d: _Targets, strict: bool,
              problems: list[str]) -> "_Pairs":
        """The pairs of the keys both sides hold; what cannot be copied is appended to
        ``problems`` (shape and dtype mismatches with ``strict`` only)."""
        pairs = cls()
        for key, arr in s.items():
            if key in d.setters:
                setter, kind = d.setters[key]
                if tuple(arr.shape) == ():
                    pairs.setters.append((setter, kind, arr, key))
                elif strict:
                    problems.append(f"{key!r}: source shape {tuple(arr.shape)}, destination "
                                    f"is a scalar")
            elif key in d.arrays:
                pairs._add(key, arr, *d.arrays[key], strict, problems)
        return pairs

    def _add(self, key: str, arr: Value, target: Value, after: Callable[[], None] | None,
             strict: bool, problems: list[str]) -> None:
        refuse_objects(arr.dtype, repr(key))
        refuse_objects(target.dtype, repr(key))
        if tuple(target.shape) != tuple(arr.shape) or not same_dtype(target.dtype, arr.dtype):
            if strict:
                ours, theirs = describe_dtypes(arr.dtype, target.dtype)
                problems.append(f"{key!r}: source shape {tuple(arr.shape)} dtype {ours}, "
                                f"destination shape {tuple(target.shape)} dtype {theirs}")
            return
        why = unwritable(target) if isinstance(target, np.ndarray) else None
        if why is not None:
            problems.append(f"{key!r}: destination array is {why}")
            return
        self.keys.append(key)
        self.srcs.append(arr)
        self.dsts.append(target)
        self.finish.append(after)

    def ask_again(self, objects: dict[str, Any]) -> None:
        """Asks each destination that is a graph object for its target again (objects
        restored as a whole ran their own code since); one that no longer takes its
        source as it did raises ValueError naming its key, before any is copied."""
        for i, key in enumerate(self.keys):
            obj = objects.get(key)
            if obj is None:
                continue
            found = value_target(obj)
            src = self.srcs[i]
            if found is None or tuple(found[0].shape) != tuple(src.shape) or \
                    not same_dtype(found[0].dtype, src.dtype) or \
                    (isinstance(found[0], np.ndarray) and unwritable(found[0]) is not None):
                raise ValueError(f"copy_state: {key!r} of the destination changed while "
                                 "the objects restored as a whole (load_state_dict) were "
                                 "restored; its values and those after it were not copied")
            self.dsts[i], self.finish[i] = found


def _restore_units(s: dict[str, Value], d: _Targets, states: dict[str, Any],
                   unit_keys: list[list[str]], threads: int) -> None:
    """Restores each object of ``d`` restored as a whole from fresh host copies of the
    source's values below it (as from a file): from its exact stored state where
    it has one and can load it, else from the tree of those values."""
    unit_vals: list[list[np.ndarray]] = []
    for ks in unit_keys:
        vals = [np.empty(s[k].shape, dtype=s[k].dtype) for k in ks]
        copy_values([s[k] for k in ks], vals, threads)
        unit_vals.append(vals)
    for (prefix, unit), ks, vals in zip(d.units, unit_keys, unit_vals):
        state = states.get(prefix)
        if state is not None and hasattr(unit, "_pyckpt_load"):  # its exact state dict
            unit._pyckpt_load(unflatten(state, dict(zip(ks, vals))))
        elif ks:
            paths = [_below(prefix, k) or [] for k in ks]
            unit._pyckpt_restore(_nested(paths, vals))
