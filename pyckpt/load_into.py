"""``pyckpt.load(path, into=...)``: filling an existing tree of arrays in place.

The layout of ``into`` decides what is read. Every problem (a key missing from
the checkpoint, a shape or dtype mismatch, a read-only target) is found and
reported, all at once, before any byte is read.
"""

from __future__ import annotations

from typing import Any, Callable

import numpy as np

from ._dtypes import (describe_dtypes, finish_byte_order, refuse_masked, same_dtype,
                      source_order_view)
from .device.array import DeviceArray
from .device.copies import unwritable
from .workers.per_worker_read import per_worker_read, place_of
from .errors import CheckpointKeyError
from .format.read_plan import ReadPlan
from .format.source import CheckpointSource
from .tree import (_join, as_array_leaf, is_array_kind, keyed_error, replacement_scalar,
                   skeleton_leaves)
from .registry import place_like, target_view
from .sharded import ShardedArray
from .sharded.perworker import PerWorker, per_worker_keys
from .variables import Variable

class Target:
    """One leaf of ``into`` to fill: its key, the array filled in place (or ``setter``,
    which replaces an immutable leaf in its container), its leaf kind, a ShardedArray
    target, ``after``, run once the array is filled, and ``like``: for an immutable
    array of a framework (a JAX array), the leaf and its array view (the shape and
    dtype it must have; its replacement is placed like it)."""

    __slots__ = ("key", "array", "setter", "kind", "sharded", "after", "like")

    def __init__(self, key: str, array: np.ndarray | DeviceArray | None,
                 setter: Callable | None, kind: str,
                 sharded: Any = None, after: Callable[[], None] | None = None,
                 like: tuple[Any, Any] | None = None) -> None:
        self.key = key
        self.array = array      # filled in place, or None
        self.setter = setter    # replaces an immutable leaf in its container
        self.kind = kind
        self.sharded = sharded  # a ShardedArray target
        self.after = after      # run once array is filled (e.g. copy back to a GPU tensor)
        self.like = like        # (leaf, its array) of an immutable framework array


def _writable_view(obj: Any) -> tuple[np.ndarray | DeviceArray, Callable[[], None] | None] | None:
    if isinstance(obj, np.ndarray):
        if type(obj) is not np.ndarray:
            refuse_masked(obj)
        return obj, None
    if isinstance(obj, Variable):
        return obj._value, None
    return target_view(obj)  # torch, JAX, user types (pyckpt.registry)


def collect_targets(into: Any) -> list[Target]:
    """Every leaf of ``into`` (a tree of dicts, lists and tuples) as a Target, keyed as
    a save of that tree is; None, str and bytes leaves are skipped. TypeError for
    what cannot be filled: a bare array, a scalar inside a tuple, an unknown type."""
    out: list[Target] = []
    _collect(into, None, None, out)
    return out


def _collect(node: Any, key: Any, setter: Callable | None, out: list[Target]) -> None:
    """``collect_targets`` of one node of ``into`` (a module-level function, not a
    closure: a closure calling itself is a reference cycle through what it captures)."""
    if isinstance(node, dict):
        for k, v in node.items():
            _collect(v, _join(key, k), lambda val, c=node, k=k: c.__setitem__(k, val), out)
        return
    if isinstance(node, (list, tuple)):
        mutable = isinstance(node, list)
        for i, v in enumerate(node):
            _collect(v, _join(key, i),
                     (lambda val, c=node, i=i: c.__setitem__(i, val)) if mutable else None, out)
        return
    if isinstance(node, (ShardedArray, PerWorker)):  # a block, or one worker's copy
        out.append(Target(key, None, None, "ndarray", sharded=node))
        return
    if key is None:
        raise TypeError("`into` must be a dict, list or tuple of arrays (a tree), "
                        f"not a single {type(node).__name__}")
    try:
        view = _writable_view(node)
    except (TypeError, ValueError, RuntimeError) as e:  # an adapter's refusal
        raise keyed_error(e, key) from e
    if view is not None:
        out.append(Target(key, view[0], None, "ndarray", after=view[1]))
        return
    leaf = as_array_leaf(node)
    if leaf is not None:  # an immutable scalar or framework array: replaced in its container
        array = is_array_kind(leaf[1])
        if setter is None:
            raise TypeError(
                f"cannot restore {key!r} in place: a {type(node).__name__} inside a tuple "
                + ("(it is immutable: hold it in a list or dict, which load replaces it in, "
                   "or restore a new tree with pyckpt.adapters.jax_support.restore)"
                   if array else "(use a list or an array)"))
        out.append(Target(key, None, setter, leaf[1], like=(node, leaf[0]) if array else None))
        return
    if node is None or isinstance(node, (str, bytes)):
        return  # static values are not read from the checkpoint
    raise TypeError(f"cannot load into a {type(node).__name__} at {key!r}")


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


def _listing(keys: list[str]) -> str:
    return ", ".join(map(repr, keys[:20])) + (f" and {len(keys) - 20} more" if len(keys) > 20
                                              else "")


def _check_keys(src: CheckpointSource, targets: list[Any], mapping: dict[str, str],
                source: dict[str, str], strict: bool) -> None:
    """Every target has a checkpoint key; with ``strict``, every mapped key a target."""
    missing = [t.key for t in targets if t.key not in source]
    if missing:
        absent = [k for k in missing if k not in src.index]
        left_out = [k for k in missing if k in src.index]
        parts = []
        if absent:
            parts.append(f"{len(absent)} key(s) of `into` are not in checkpoint {src.url}: "
                         + _listing(absent) + _graph_hint(src, mapping))
        if left_out:
            parts.append(f"{len(left_out)} key(s) of `into` are in checkpoint {src.url} but "
                         "select= or key_map= left them out: " + _listing(left_out))
        raise CheckpointKeyError("; ".join(parts))
    if strict:
        have = {t.key for t in targets}
        unused = [k for k, t in mapping.items() if t not in have]
        if unused:
            raise CheckpointKeyError(
                f"{len(unused)} key(s) of checkpoint {src.url} have no place in `into` "
                f"(strict=True): {_listing(unused)}"
                "; pass strict=False to load only what `into` holds, or select= them")


class _Plan:
    """Where each target's bytes go: (index, destination) pairs (``reads``: the
    ReadPlan of the targets filled in place), scalars to build (``scalar_reads``:
    the ReadPlan of their new arrays), targets to byte-swap once filled, and every
    problem found."""

    def __init__(self, src: CheckpointSource, comm: Any) -> None:
        self.src, self.comm = src, comm
        self.problems: list[str] = []
        self.idx: list[int] = []
        self.dsts: list[Any] = []
        self.fresh: list[tuple[Any, int, str]] = []  # (target, index, checkpoint key)
        self.swap: list[np.ndarray] = []  # targets in the other byte order
        self._place: tuple[int, int] | None = None
        self._rows: frozenset[str] = frozenset()

    def _to(self, i: int, dst: Any) -> None:
        self.idx.append(i)
        self.dsts.append(dst)

    def reads(self) -> ReadPlan:
        """The reads into the targets filled in place, in the order of ``into``."""
        return ReadPlan(self.src, self.idx, self.dsts)

    def scalar_reads(self) -> ReadPlan:
        """The reads of the stored values that replace Python scalars: new arrays."""
        return ReadPlan(self.src, [i for _, i, _ in self.fresh])

    def add(self, t: Any, key: str) -> None:
        src = self.src
        i = src.index_of(key)
        shape, dtype = src.shape(i), src.dtype(i)
        if isinstance(t.sharded, PerWorker):
            if self._place is None:
                self._place, self._rows = place_of(self.comm), per_worker_keys(src.info)
            try:
                dst, t.after = per_worker_read(repr(t.key), t.sharded, shape, dtype,
                                               key in self._rows, *self._place)
            except ValueError as e:
                self.problems.append(str(e))
                return
            self._to(i, dst)
        elif t.sharded is not None:
            self._add_block(t, i, shape, dtype)
        elif t.like is not None:  # an immutable array: a new one replaces it
            like = t.like[1]
            if tuple(like.shape) != shape or not same_dtype(like.dtype, dtype):
                ours, theirs = describe_dtypes(dtype, like.dtype)
                self.problems.append(f"{t.key!r}: checkpoint has shape {shape} dtype {ours}, "
                                     f"target has shape {tuple(like.shape)} dtype {theirs}")
            self.fresh.append((t, i, key))
        elif t.array is None:
            if shape != ():
                self.problems.append(f"{t.key!r}: checkpoint holds shape {shape}, target is "
                                     "a scalar")
            self.fresh.append((t, i, key))
        else:
            self._add_array(t, i, key, shape, dtype)

    def _add_block(self, t: Any, i: int, shape: tuple, dtype: np.dtype) -> None:
        block = t.sharded
        if same_dtype(block.local.dtype, dtype) and block.local.dtype != dtype:
            view, swapped = source_order_view(block.local, dtype)
            block = ShardedArray(view, block.global_shape, block.offsets)
            if swapped:
                self.swap.append(t.sharded.local)
        self.problems.extend(t.sharded.check_against(shape, dtype, t.key))
        self._to(i, block)

    def _add_array(self, t: Any, i: int, key: str, shape: tuple, dtype: np.dtype) -> None:
        if tuple(t.array.shape) != shape or not same_dtype(t.array.dtype, dtype):
            ours, theirs = describe_dtypes(dtype, t.array.dtype)
            self.problems.append(
                f"{t.key!r}: checkpoint has shape {shape} dtype {ours}, "
                f"target has shape {tuple(t.array.shape)} dtype {theirs}"
                + (" (it holds one value per worker: load it into pyckpt.PerWorker(target))"
                   if key in per_worker_keys(self.src.info) else ""))
        elif isinstance(t.array, DeviceArray):  # filled on its device, in native order
            self._to(i, t.array)
        elif (why := unwritable(t.array)) is not None:
            self.problems.append(f"{t.key!r}: target array is {why}")
        else:
            dst, swapped = source_order_view(t.array, dtype)
            if swapped:
                self.swap.append(t.array)
            self._to(i, dst)


def _stored_scalars(plan: _Plan) -> list[Any]:
    """The stored values that replace Python scalars of ``into``
    (``tree.replacement_scalar``: as they were saved, whatever the target's type) and
    its immutable framework arrays (the framework's new array, placed like the old
    one: ``registry.place_like``)."""
    if not plan.fresh:
        return []
    src = plan.src
    kinds = skeleton_leaves(src.tree) if src.tree is not None else {}
    return [place_like(t.kind, arr.astype(t.like[1].dtype, copy=False), t.like[0])
            if t.like is not None else replacement_scalar(kinds.get(key), arr, t.kind)
            for (t, _, key), arr in zip(plan.fresh, plan.scalar_reads().execute())]


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
    _check_keys(src, targets, mapping, source, strict)
    plan = _Plan(src, comm)
    for t in targets:
        plan.add(t, source[t.key])
    if plan.problems:
        raise ValueError("cannot load into the given tree:\n  " + "\n  ".join(plan.problems))
    scalars = _stored_scalars(plan)  # made before any target is filled
    plan.reads().execute()
    finish_byte_order(plan.swap)
    for (t, _, _), value in zip(plan.fresh, scalars):
        assert t.setter is not None  # a target without an array is a leaf with a setter
        t.setter(value)
    for t in targets:
        if t.after is not None:
            t.after()
    return into
