"""Name-based (flat / pytree) checkpoints: ``pyckpt.save`` and ``pyckpt.load``
(API.md section 5)."""

from __future__ import annotations

import fnmatch
from typing import TYPE_CHECKING, Any, Callable, Iterable, Mapping

from . import progress as _progress
from . import saving
from .errors import CheckpointKeyError, CorruptCheckpointError
from .format.source import CheckpointSource
from .load_into import load_into
from .sources import open_source
from .tree import flatten, nest_flat, rebuild_leaf, skeleton_leaves, unflatten, validate_key

if TYPE_CHECKING:  # for signatures only
    from .dist.comm import Communicator

__all__ = ["save", "load"]


def save(tree: Any, path: Any, *, metadata: dict | None = None,
         storage_options: dict | None = None, comm: Communicator | None = None,
         progress: Callable[[int, int], Any] | None = None,
         blocking: bool = True) -> str | saving.PendingSave:
    """Saves a nested dict/list/tuple of arrays as a committed checkpoint at ``path``.

    Keys are the ``/``-joined container path (``layers/0/w``). Returns the
    path (as given, with its scheme). Returns only after data and index are
    durable. Saving over an existing checkpoint replaces it atomically.
    ``progress(bytes_done, bytes_total)`` is called from a monitor thread while
    this worker writes.

    With ``blocking=False`` it returns a ``PendingSave`` as soon as every value is
    copied aside (the caller may change them at once; values changed afterwards
    never reach this checkpoint): ``wait()`` returns the path or raises the save's
    error, ``done()`` says whether it finished. Multi-worker saves stay blocking.
    """
    leaves, skeleton = flatten(tree)
    if not blocking:
        return saving.start([saving.Item(lf.key, lf.array, lf.obj) for lf in leaves], path,
                            storage_options=storage_options, comm=comm, progress=progress,
                            tree=skeleton, metadata=metadata)
    saving.write([saving.Item(lf.key, lf.array, lf.obj) for lf in leaves], path,
                 storage_options=storage_options, comm=comm, progress=progress, tree=skeleton,
                 metadata=metadata)
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
         mmap: bool = False, storage_options: dict | None = None, comm: Communicator | None = None,
         progress: Callable[[int, int], Any] | None = None) -> Any:
    """Loads a checkpoint (see docs/API.md, "load", for every mode).

    ``path`` is anything ``open_source`` opens: a pyckpt checkpoint (a directory
    resolves to its latest), or a ``.safetensors`` file. ``progress(bytes_done,
    bytes_total)`` is called from a monitor thread while tensors are read
    (``total`` counts the bytes of the selected tensors)."""
    src = open_source(path, storage_options)
    keys = list(src.keys)
    if select is not None:
        keys = select_keys(keys, select)
    mapping = map_keys(keys, key_map)
    total = src.nbytes([src.index[k] for k in mapping]) if progress is not None else 0
    with _progress.reporting(progress, total):
        if into is not None:
            return load_into(src, into, mapping)
        return _load_new(src, select, key_map, mapping, mmap)


def _load_new(src: CheckpointSource, select: Any, key_map: Any, mapping: dict[str, str],
              mmap: bool) -> Any:
    tree = src.tree
    kinds = skeleton_leaves(tree) if tree is not None else {}
    if select is None and key_map is None and tree is not None:
        keys = list(kinds)
        values = dict(zip(keys, src.read_new([src.index_of(k) for k in keys], mmap)))
        try:
            return unflatten(tree, values)
        except (KeyError, ValueError, TypeError) as e:
            raise CorruptCheckpointError(f"checkpoint {src.url}: malformed tree: {e}") from None
    keys = list(mapping)
    arrays = src.read_new([src.index[k] for k in keys], mmap)
    flat = {mapping[k]: rebuild_leaf(kinds.get(k, "ndarray"), v) for k, v in zip(keys, arrays)}
    return nest_flat(flat)
