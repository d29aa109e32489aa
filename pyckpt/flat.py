"""Name-based (flat / pytree) checkpoints: ``pyckpt.save`` and ``pyckpt.load``
(API.md section 5)."""

from __future__ import annotations

import fnmatch
import os
from typing import Any, Callable, Iterable, Mapping

import numpy as np

from . import progress as _progress
from .errors import CheckpointKeyError
from .engine.reader import OpenCheckpoint, open_checkpoint
from .engine.writer import save_tensors
from .storage import resolve
from .tree import flatten, nest_flat, rebuild_leaf, skeleton_leaves, unflatten, validate_key
from .variables import Variable

__all__ = ["save", "load"]


def save(tree: Any, path: Any, *, metadata: dict | None = None,
         storage_options: dict | None = None, comm: Any = None,
         progress: Callable[[int, int], Any] | None = None) -> str:
    """Saves a nested dict/list/tuple of arrays as a committed checkpoint at ``path``.

    Keys are the ``/``-joined container path (``layers/0/w``). Returns the
    path (as given, with its scheme). Returns only after data and index are
    durable. Saving over an existing checkpoint replaces it atomically.
    ``progress(bytes_done, bytes_total)`` is called from a monitor thread while
    this worker writes.
    """
    from .dist.comm import resolve_comm

    from .sharded import ShardedArray

    comm = resolve_comm(comm)
    leaves, skeleton = flatten(tree)
    store, p = resolve(path, storage_options)
    sharded = any(isinstance(lf.obj, ShardedArray) for lf in leaves)
    if comm is None and sharded:
        from .dist import SingleComm

        comm = SingleComm()  # blocks must be checked and assembled like a multi-worker save
    with _progress.reporting(progress, sum(lf.array.nbytes for lf in leaves)):
        if comm is not None and (comm.world_size > 1 or sharded):
            from .dist.save import distributed_save

            distributed_save(comm, store, p, [(lf.key, lf.obj) for lf in leaves], tree=skeleton,
                             metadata=metadata)
        else:
            save_tensors(store, p, [(lf.key, lf.array) for lf in leaves], tree=skeleton,
                         metadata=metadata, keys_checked=True)
    return str(path) if not hasattr(path, "__fspath__") else str(path.__fspath__())


# ---------------------------------------------------------------------------
# load
# ---------------------------------------------------------------------------

def _is_pattern(s: str) -> bool:
    return any(c in s for c in "*?[")


def select_keys(keys: list[str], select: Any) -> list[str]:
    """Keys matching ``select``: exact keys, subtree prefixes or glob patterns."""
    if isinstance(select, str):
        select = [select]
    wanted: set[str] = set()
    missing = []
    for s in select:
        if not isinstance(s, str):
            raise TypeError(f"select entries must be strings, got {s!r}")
        if _is_pattern(s):
            hits = [k for k in keys if fnmatch.fnmatchcase(k, s)]
        elif s in keys:
            hits = [s]
        else:
            prefix = s.rstrip("/") + "/"
            hits = [k for k in keys if k.startswith(prefix)]
        if not hits:
            missing.append(s)
        wanted.update(hits)
    if missing:
        raise CheckpointKeyError(f"select matched no key for: {', '.join(map(repr, missing))}")
    return [k for k in keys if k in wanted]


def map_keys(keys: Iterable[str], key_map: Any) -> dict[str, str]:
    """checkpoint key -> target key (keys mapped to None are dropped)."""
    out: dict[str, str] = {}
    if key_map is None:
        return {k: k for k in keys}
    fn: Callable[[str], Any]
    if isinstance(key_map, Mapping):
        fn = lambda k: key_map.get(k, k)  # noqa: E731
    elif callable(key_map):
        fn = key_map
    else:
        raise TypeError("key_map must be a dict or a callable")
    targets: dict[str, str] = {}
    for k in keys:
        t = fn(k)
        if t is None:
            continue
        validate_key(t)
        if t in targets:
            raise ValueError(f"key_map maps both {targets[t]!r} and {k!r} to {t!r}")
        targets[t] = k
        out[k] = t
    return out


def load(path: Any, into: Any = None, *, select: Any = None, key_map: Any = None,
         mmap: bool = False, storage_options: dict | None = None, comm: Any = None,
         progress: Callable[[int, int], Any] | None = None) -> Any:
    """Loads a checkpoint (see API.md section 5 for every mode).

    ``progress(bytes_done, bytes_total)`` is called from a monitor thread while
    tensors are read (``total`` counts the bytes of the selected tensors).
    A path ending in ``.safetensors`` reads that safetensors file the same ways."""
    from .interop import safetensors as _st

    plain = os.fspath(path) if isinstance(path, os.PathLike) else path
    if _st.is_safetensors_path(plain):
        return _st.load(plain, into, select, key_map, mmap, storage_options)
    ck = open_checkpoint(path, storage_options)
    keys = list(ck.manifest.tensors)
    if select is not None:
        keys = select_keys(keys, select)
    mapping = map_keys(keys, key_map)
    if progress is not None:
        m = ck.manifest
        total = sum(int(m.blocks.nbytes[m.blocks.tensor_begin[m.index[k]]:
                                        m.blocks.tensor_begin[m.index[k] + 1]].sum())
                    for k in mapping)
        with _progress.reporting(progress, total):
            return _load(ck, into, select, key_map, mapping, mmap)
    return _load(ck, into, select, key_map, mapping, mmap)


def _load(ck: OpenCheckpoint, into: Any, select: Any, key_map: Any, mapping: dict[str, str],
          mmap: bool) -> Any:
    if into is not None:
        from .load_into import load_into

        return load_into(ck, into, mapping)

    tree = ck.manifest.tree
    kinds = skeleton_leaves(tree) if tree is not None else {}
    if select is None and key_map is None and tree is not None:
        values = read_values(ck, list(kinds), mmap)
        try:
            return unflatten(tree, values)
        except (KeyError, ValueError, TypeError) as e:
            from .errors import CorruptCheckpointError

            raise CorruptCheckpointError(f"checkpoint {ck.url}: malformed tree: {e}") from None
    values = read_values(ck, list(mapping), mmap)
    flat = {mapping[k]: rebuild_leaf(kinds.get(k, "ndarray"), v) for k, v in values.items()}
    return nest_flat(flat)


def read_values(ck: OpenCheckpoint, keys: list[str], mmap: bool = False) -> dict[str, np.ndarray]:
    """New arrays (or read-only mmap views) for the given keys, plain or sharded."""
    m = ck.manifest
    index = m.index
    try:
        idx = [index[k] for k in keys]
    except KeyError:
        idx = [ck.index_of(k) for k in keys]  # raises, naming the key
    out: dict[str, np.ndarray] = {}
    plain = idx if m.all_plain else [i for i in idx if m.is_plain(i)]
    if plain:
        arrays = ck.mmap(plain) if mmap else ck.read_new(plain)
        out.update(zip((m.keys[i] for i in plain), arrays))
    if len(plain) != len(idx):
        from .engine.sharded_read import read_whole

        out.update(read_whole(ck, [i for i in idx if not m.is_plain(i)]))
    return {k: out[k] for k in keys}
