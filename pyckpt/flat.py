"""Name-based (flat / pytree) checkpoints: ``pyckpt.save`` and ``pyckpt.load``
(docs/API.md section 5)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable

import numpy as np

from . import progress as _progress
from . import saving
from .errors import CorruptCheckpointError
from .format.read_plan import ReadPlan
from .format.source import CheckpointSource
from .load_into import load_into
from .registry import empty_on, from_host, target_view
from .sources import open_source
from .selection import map_keys, select_keys
from .tree import (_join, flatten, is_array_kind, nest_flat, rebuild_leaf, skeleton_leaves,
                   static_values, unflatten)

if TYPE_CHECKING:  # for signatures only
    from .workers.comm import Communicator

__all__ = ["save", "load"]


def save(tree: Any, path: Any, *, metadata: dict | None = None,
         storage_options: dict | None = None, comm: Communicator | None = None,
         progress: Callable[[int, int], Any] | None = None,
         blocking: bool = True, max_pinned_bytes: int | None = None,
         max_device_snapshot_bytes: int | None = None) -> str | saving.PendingSave:
    """Saves a nested dict/list/tuple of arrays as a committed checkpoint at ``path``.

    Keys are the ``/``-joined container path (``layers/0/w``). Returns the
    path (as given, with its scheme). Returns only after data and index are
    durable. Saving over an existing checkpoint replaces it atomically.
    ``progress(bytes_done, bytes_total)`` is called from a monitor thread while
    this worker writes.

    With ``blocking=False`` it returns a ``PendingSave`` as soon as every value is
    copied aside (the caller may change them at once; values changed afterwards
    never reach this checkpoint): ``wait()`` returns the path or raises the save's
    error, ``done()`` says whether it finished. With several workers every worker
    calls it at the same point: the collectives that plan the save run in the call,
    the writing and the commit in the background (docs/PROTOCOL.md section 6b).

    ``max_pinned_bytes`` bounds the pinned host memory that stages values from
    device memory: a ring of that size, reused while the writers go, instead of a
    pinned copy of the whole state (single-process saves to local files; the call
    then returns once the last value left the device). docs/API.md, "Device memory".

    ``max_device_snapshot_bytes`` (``blocking=False``, one process): the device
    memory the call may copy the device values into (device-to-device, ordered
    on the current stream; the call returns after it) before they drain to storage
    in the background; None (automatic): when they fit the device's free memory
    less max(2 GiB, 10%); 0: never. The buffers are kept for the next save
    (``pyckpt.device.release_staging_memory()`` frees them). The handle's
    ``staging`` says what the save used (``saving.StagingReport``).
    """
    leaves, skeleton = flatten(tree)
    plan = saving.SavePlan.build([saving.Item(lf.key, lf.array, lf.obj) for lf in leaves], path,
                                 storage_options=storage_options, comm=comm, progress=progress,
                                 tree=skeleton, metadata=metadata,
                                 max_pinned_bytes=max_pinned_bytes,
                                 max_device_snapshot_bytes=max_device_snapshot_bytes)
    if not blocking:
        return saving.start(plan)
    saving.write(plan)
    return plan.shown


# ---------------------------------------------------------------------------
# load
# ---------------------------------------------------------------------------

def load(path: Any, into: Any = None, *, select: Any = None, key_map: Any = None,
         mmap: bool = False, storage_options: dict | None = None, comm: Communicator | None = None,
         progress: Callable[[int, int], Any] | None = None, strict: bool = False,
         device: Any = None, as_numpy: bool = False) -> Any:
    """Loads a checkpoint (see docs/API.md, "load", for every mode).

    ``path`` is anything ``open_source`` opens: a pyckpt checkpoint (a directory
    resolves to its latest), or a ``.safetensors`` file. ``progress(bytes_done,
    bytes_total)`` is called from a monitor thread while tensors are read
    (``total`` counts the bytes of the selected tensors).

    ``strict`` (with ``into``, as torch's ``load_state_dict(strict=)``): with
    ``strict=True``, checkpoint keys (after ``select`` and ``key_map``) that
    ``into`` lacks raise ``CheckpointKeyError`` before anything is read. The
    default, False, keeps the rule that the layout of ``into`` decides what is
    read (partial loads, resharding). Keys of ``into`` missing from the
    checkpoint always raise.
    ``device`` (without ``into``): arrays come back as tensors of the framework
    that owns that device name (torch: ``"cuda:0"``, ``"cpu"``), read through
    pinned bounce buffers straight into device memory.

    Without ``into``, each array comes back as the framework's array it was saved
    from: torch tensors for tensors (on the CPU, or on ``device``), ``jax.Array``
    for JAX arrays, numpy arrays for numpy arrays, and Python values for Python
    values. A framework that is not installed gives numpy arrays instead, as do
    ``as_numpy=True`` and ``mmap=True`` (file-backed, read-only arrays), and
    checkpoints written before pyckpt recorded frameworks (0.x, issue 22)."""
    if mmap and into is not None:
        raise ValueError("mmap=True cannot be combined with into=: mmap returns new read-only "
                         "arrays backed by the file, into= fills existing arrays")
    if device is not None and (into is not None or mmap):
        raise ValueError("device= places new arrays: it cannot be combined with into= (whose "
                         "arrays stay where they are) or mmap=True")
    src = open_source(path, storage_options)
    keys = list(src.keys)
    # values the tree keeps itself (str, bytes, None, empty containers): selected and
    # renamed as keys are, without bytes to read
    statics = static_values(src.tree, empty=True) if into is None and src.tree is not None \
        and (select is not None or key_map is not None) else {}  # else: the skeleton has them
    if select is not None:
        chosen = set(select_keys(keys + [k for k in statics if k not in src.index], select))
        keys = [k for k in keys if k in chosen]
        statics = {k: v for k, v in statics.items() if k in chosen}
    mapping = map_keys(keys, key_map)
    total = src.nbytes([src.index[k] for k in mapping]) if progress is not None else 0
    with _progress.reporting(progress, total):
        if into is not None:
            return load_into(src, into, mapping, strict=strict, comm=comm)
        return _load_new(src, select, key_map, mapping, statics, mmap, device,
                         as_numpy or mmap)


def _reader(src: CheckpointSource, mmap: bool, device: Any,
            placed: Callable[[str], bool] = is_array_kind) -> Callable[[list[str], dict], list]:
    """reads(keys, kinds) -> values: new host arrays, or (``device``) tensors on that
    device for the leaves whose kind ``placed`` takes (default: array leaves; the
    others, scalar leaves at least, are read to the host). The bytes land through
    ``ReadPlan``s (``format.read_plan.ReadPlan.execute``)."""
    def reads(keys: list[str], kinds: dict) -> list:
        idx = [src.index_of(k) for k in keys]
        if device is None:
            return ReadPlan(src, idx, mmap=mmap).execute()
        out: list = [None] * len(keys)
        array = [placed(kinds.get(k, "ndarray")) for k in keys]
        scalar = [p for p, a in enumerate(array) if not a]
        for p, v in zip(scalar, ReadPlan(src, [idx[p] for p in scalar]).execute()):
            out[p] = v
        arrays = [p for p, a in enumerate(array) if a]
        dsts, after = [], []
        for p in arrays:
            try:
                out[p] = empty_on(device, src.shape(idx[p]), src.dtype(idx[p]))
            except TypeError as e:
                raise TypeError(f"{keys[p]!r}: cannot be loaded with device={device!r}: {e}; "
                                "load it without device= (as a numpy array), or select= "
                                "the others") from None
            view = target_view(out[p])
            if view is None:
                raise TypeError(f"cannot fill the {type(out[p]).__name__} made for device="
                                f"{device!r}: no adapter takes it as a target")
            dsts.append(view[0])
            after.append(view[1])
        ReadPlan(src, [idx[p] for p in arrays], dsts).execute()
        for fn in after:
            if fn is not None:
                fn()
        return out
    return reads


def _prune(node: Any, wanted: set[str], key: str | None = None) -> Any:
    """The skeleton with only the leaves in ``wanted`` (tensor keys, and the paths of
    the values and empty containers the tree keeps itself): dict entries without
    any are dropped; lists and tuples keep their length and container type, with
    None where an element was not selected; None when nothing below is wanted."""
    if isinstance(node, str):
        return node if node in wanted else None
    if not isinstance(node, dict):
        return None
    if "s" in node:
        return node if node["s"] in wanted else None
    if "v" in node or "b" in node:
        return node if key in wanted else None
    if "d" in node:
        if not node["d"]:
            return node if key in wanted else None
        kept = [[k, c] for k, c in ((k, _prune(v, wanted, _join(key, k))) for k, v in node["d"])
                if c is not None]
        return {"d": kept} if kept else None
    for tag in ("l", "u"):
        if tag in node:
            if not node[tag]:
                return node if key in wanted else None
            kids = [_prune(v, wanted, _join(key, i)) for i, v in enumerate(node[tag])]
            if all(c is None for c in kids):
                return None
            return {tag: [c if c is not None else {"v": None} for c in kids]}
    return None


def _leaf_maker(as_numpy: bool) -> Callable[[str, Any], Any]:
    """leaf(kind, value) -> the loaded leaf: scalars rebuilt, a host array saved from a
    framework handed to that framework (``registry.from_host``, taking the fresh
    array over), unless ``as_numpy``; arrays already placed on a device kept."""
    def leaf(kind: str, value: Any) -> Any:
        if not is_array_kind(kind):
            return rebuild_leaf(kind, value)
        if kind == "ndarray" or as_numpy or not isinstance(value, np.ndarray):
            return value
        return from_host(kind, value)
    return leaf


def _load_new(src: CheckpointSource, select: Any, key_map: Any, mapping: dict[str, str],
              statics: dict[str, Any], mmap: bool, device: Any = None,
              as_numpy: bool = False, placed: Callable[[str], bool] = is_array_kind) -> Any:
    tree = src.tree
    kinds = skeleton_leaves(tree) if tree is not None else {}
    reads = _reader(src, mmap, device, placed)
    leaf = _leaf_maker(as_numpy)
    if key_map is None and tree is not None:
        skeleton = tree if select is None else _prune(tree, set(mapping) | set(statics))
        keys = [k for k in skeleton_leaves(skeleton)] if skeleton is not None else []
        values = dict(zip(keys, reads(keys, kinds)))
        try:
            return unflatten(skeleton, values, leaf) if skeleton is not None else {}
        except (KeyError, ValueError, TypeError) as e:
            raise CorruptCheckpointError(f"checkpoint {src.url}: malformed tree: {e}") from None
    keys = list(mapping)
    arrays = reads(keys, kinds)
    flat = {mapping[k]: leaf(kinds.get(k, "ndarray"), v) for k, v in zip(keys, arrays)}
    for k, name in map_keys(list(statics), key_map).items():
        if name in flat:
            other = next(a for a, t in mapping.items() if t == name)
            raise ValueError(f"key_map maps two keys to {name!r}: {other!r} and {k!r}")
        flat[name] = statics[k]
    return nest_flat(flat)


def load_placed(src: CheckpointSource, device: Any, kinds: frozenset[str]) -> Any:
    """``load(src, device=device)`` that places only the leaves of ``kinds`` (e.g.
    ``{"torch"}``) on ``device``, through the same pinned bounce buffers; every other
    leaf comes back as ``load(src)`` gives it (numpy arrays stay numpy arrays).
    pyckpt.lightning's ``map_location``; not part of the public API."""
    return _load_new(src, None, None, map_keys(list(src.keys), None), {}, False, device,
                     placed=kinds.__contains__)
