"""``pyckpt.load(path, into=...)``: filling an existing tree of arrays in place.

The layout of ``into`` decides what is read. Every problem (a key missing from
the checkpoint, a shape or dtype mismatch, a read-only target) is found and
reported, all at once, before any byte is read.
"""

from __future__ import annotations

from typing import Any, Callable

import numpy as np

from ._dtypes import describe_dtypes, finish_byte_order, same_dtype, source_order_view
from .device.array import DeviceArray
from .workers.perworker import per_worker_read, place_of
from .errors import CheckpointKeyError
from .format.source import CheckpointSource
from .tree import _join, as_array_leaf, rebuild_leaf
from .registry import target_view
from .sharded import ShardedArray
from .sharded.perworker import PerWorker, per_worker_keys
from .variables import Variable

class Target:
    """One leaf of ``into`` to fill: its key, the array filled in place (or ``setter``,
    which replaces an immutable leaf in its container), its leaf kind, a ShardedArray
    target, and ``after``, run once the array is filled."""

    __slots__ = ("key", "array", "setter", "kind", "sharded", "after")

    def __init__(self, key: str, array: np.ndarray | DeviceArray | None,
                 setter: Callable | None, kind: str,
                 sharded: Any = None, after: Callable[[], None] | None = None) -> None:
        self.key = key
        self.array = array      # filled in place, or None
        self.setter = setter    # replaces an immutable leaf in its container
        self.kind = kind
        self.sharded = sharded  # a ShardedArray target
        self.after = after      # run once array is filled (e.g. copy back to a GPU tensor)


def _writable_view(obj: Any) -> tuple[np.ndarray | DeviceArray, Callable[[], None] | None] | None:
    if isinstance(obj, np.ndarray):
        return obj, None
    if isinstance(obj, Variable):
        return obj._value, None
    return target_view(obj)  # torch, JAX, user types (pyckpt.registry)


def collect_targets(into: Any) -> list[Target]:
    """Every leaf of ``into`` (a tree of dicts, lists and tuples) as a Target, keyed as
    a save of that tree is; None, str and bytes leaves are skipped. TypeError for
    what cannot be filled: a bare array, a scalar inside a tuple, an unknown type."""
    out: list[Target] = []

    def walk(node: Any, key: Any, setter: Callable | None) -> None:
        if isinstance(node, dict):
            for k, v in node.items():
                walk(v, _join(key, k), lambda val, c=node, k=k: c.__setitem__(k, val))
            return
        if isinstance(node, (list, tuple)):
            mutable = isinstance(node, list)
            for i, v in enumerate(node):
                walk(v, _join(key, i),
                     (lambda val, c=node, i=i: c.__setitem__(i, val)) if mutable else None)
            return
        if isinstance(node, (ShardedArray, PerWorker)):  # a block, or one worker's copy
            out.append(Target(key, None, None, "ndarray", sharded=node))
            return
        if key is None:
            raise TypeError("`into` must be a dict, list or tuple of arrays (a tree), "
                            f"not a single {type(node).__name__}")
        view = _writable_view(node)
        if view is not None:
            out.append(Target(key, view[0], None, "ndarray", after=view[1]))
            return
        leaf = as_array_leaf(node)
        if leaf is not None:  # an immutable scalar: replaced in its container
            if setter is None:
                raise TypeError(f"cannot restore {key!r} in place: a {type(node).__name__} "
                                "inside a tuple (use a list or an array)")
            out.append(Target(key, None, setter, leaf[1]))
            return
        if node is None or isinstance(node, (str, bytes)):
            return  # static values are not read from the checkpoint
        raise TypeError(f"cannot load into a {type(node).__name__} at {key!r}")

    walk(into, None, None)
    return out


_GRAPH_SUFFIX = "/.ATTRIBUTES/VARIABLE_VALUE"


def _graph_hint(src: CheckpointSource, mapping: dict[str, str]) -> str:
    """What to call instead when a flat load meets an object-graph checkpoint (keys
    like ``net/w/.ATTRIBUTES/VARIABLE_VALUE``), else ""."""
    if not any(k.endswith(_GRAPH_SUFFIX) for k in mapping):
        return ""
    example = next(k for k in mapping if k.endswith(_GRAPH_SUFFIX))
    return (f". It is an object-graph checkpoint (Checkpoint.write/save, or TensorFlow's): "
            f"its keys are like {example!r}. Restore it with "
            "pyckpt.Checkpoint(**objects).restore(path) (or .read(path)), or map its keys: "
            "load(path, into=..., key_map=lambda k: k.removesuffix("
            f"{_GRAPH_SUFFIX!r}))")


def load_into(src: CheckpointSource, into: Any, mapping: dict[str, str], *,
              strict: bool = False, comm: Any = None) -> Any:
    """Fills the targets of ``into`` from ``src`` (``mapping``: checkpoint key ->
    target key). Every problem is reported, all at once, before any byte is read;
    with ``strict``, checkpoint keys of ``mapping`` that ``into`` lacks are one.
    Targets in device memory (DeviceArrays) are filled on their device. A
    ``PerWorker`` target takes this worker's copy (``comm``'s rank) or the one its
    ``worker`` names."""
    targets = collect_targets(into)
    source = {t: k for k, t in mapping.items()}
    missing = [t.key for t in targets if t.key not in source]
    if missing:
        raise CheckpointKeyError(
            f"{len(missing)} key(s) of `into` are not in checkpoint {src.url}: "
            + ", ".join(map(repr, missing[:20]))
            + (f" and {len(missing) - 20} more" if len(missing) > 20 else "")
            + _graph_hint(src, mapping))
    if strict:
        have = {t.key for t in targets}
        unused = [k for k, t in mapping.items() if t not in have]
        if unused:
            raise CheckpointKeyError(
                f"{len(unused)} key(s) of checkpoint {src.url} have no place in `into` "
                f"(strict=True): {', '.join(map(repr, unused[:20]))}"
                + (f" and {len(unused) - 20} more" if len(unused) > 20 else "")
                + "; pass strict=False to load only what `into` holds, or select= them")
    problems = []
    idx, dsts, fresh = [], [], []
    swap: list[np.ndarray] = []  # targets in the other byte order, swapped once filled
    place: tuple[int, int] | None = None
    rows: frozenset[str] = frozenset()
    for t in targets:
        i = src.index_of(source[t.key])
        shape, dtype = src.shape(i), src.dtype(i)
        if isinstance(t.sharded, PerWorker):
            if place is None:
                place, rows = place_of(comm), per_worker_keys(src.info)
            try:
                dst, t.after = per_worker_read(repr(t.key), t.sharded, shape, dtype,
                                               source[t.key] in rows, *place)
            except ValueError as e:
                problems.append(str(e))
                continue
            idx.append(i)
            dsts.append(dst)
            continue
        if t.sharded is not None:
            block = t.sharded
            if same_dtype(block.local.dtype, dtype) and block.local.dtype != dtype:
                view, swapped = source_order_view(block.local, dtype)
                block = ShardedArray(view, block.global_shape, block.offsets)
                if swapped:
                    swap.append(t.sharded.local)
            problems.extend(t.sharded.check_against(shape, dtype, t.key))
            idx.append(i)
            dsts.append(block)
            continue
        if t.array is None:
            if shape != ():
                problems.append(f"{t.key!r}: checkpoint holds shape {shape}, target is a scalar")
            fresh.append((t, i))
            continue
        if tuple(t.array.shape) != shape or not same_dtype(t.array.dtype, dtype):
            ours, theirs = describe_dtypes(dtype, t.array.dtype)
            problems.append(f"{t.key!r}: checkpoint has shape {shape} dtype {ours}, "
                            f"target has shape {tuple(t.array.shape)} dtype {theirs}"
                            + (" (it holds one value per worker: load it into "
                               "pyckpt.PerWorker(target))"
                               if source[t.key] in per_worker_keys(src.info) else ""))
            continue
        if isinstance(t.array, DeviceArray):  # filled on its device, in native order
            idx.append(i)
            dsts.append(t.array)
            continue
        if not t.array.flags.writeable:
            problems.append(f"{t.key!r}: target array is read-only")
            continue
        dst, swapped = source_order_view(t.array, dtype)
        if swapped:
            swap.append(t.array)
        idx.append(i)
        dsts.append(dst)
    if problems:
        raise ValueError("cannot load into the given tree:\n  " + "\n  ".join(problems))
    scalars = src.read_new([i for _, i in fresh])
    src.fill(idx, dsts)
    finish_byte_order(swap)
    for (t, _), value in zip(fresh, scalars):
        assert t.setter is not None  # a target without an array is a leaf with a setter
        t.setter(rebuild_leaf(t.kind, value))
    for t in targets:
        if t.after is not None:
            t.after()
    return into
