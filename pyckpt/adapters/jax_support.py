"""JAX support: ``jax.Array`` leaves (copied to host memory when saved) and
whole pytrees.

JAX arrays are immutable, so a load cannot fill them in place: use
``restore(path, target)``, which returns a new pytree shaped like ``target``
with every leaf loaded and placed like the target's leaf (same sharding).
Custom pytree nodes (flax structs, named tuples...) are handled through
``jax.tree_util``; keys are the pytree paths (``params/dense/kernel``).
"""

from __future__ import annotations

import sys
from typing import Any

import numpy as np

from .. import flat as flat_api
from ..registry import register_adapter
from ..saving import PendingSave


def _jax() -> Any:
    return sys.modules.get("jax")


def to_numpy(obj: Any) -> np.ndarray | None:
    """The ``leaf`` hook: a host numpy copy of a ``jax.Array``, else None (also when JAX
    is not imported)."""
    jax = _jax()
    if jax is None or not isinstance(obj, jax.Array):
        return None
    return np.asarray(obj)


def _key(entry: Any) -> str:
    for attr in ("key", "name", "idx"):
        if hasattr(entry, attr):
            return str(getattr(entry, attr))
    return str(entry)


def flatten(tree: Any) -> tuple[dict[str, Any], Any]:
    """(flat {key: leaf}, treedef) with '/'-joined pytree paths as keys."""
    import jax  # optional dependency

    pairs, treedef = jax.tree_util.tree_flatten_with_path(tree)
    flat = {"/".join(_key(e) for e in path): leaf for path, leaf in pairs}
    if len(flat) != len(pairs):
        raise ValueError("two pytree leaves map to the same key")
    return flat, treedef


def save(tree: Any, path: Any, **kwargs: Any) -> str:
    """Saves any pytree (custom nodes included) as a flat checkpoint of its paths; returns
    the path once committed (a ``blocking=False`` save is waited for here)."""
    flat, _ = flatten(tree)
    out = flat_api.save(flat, path, **kwargs)
    return out.wait() if isinstance(out, PendingSave) else out


def restore(path: Any, target: Any, **kwargs: Any) -> Any:
    """A new pytree like ``target`` with every leaf read from ``path`` and placed like
    the target's (shape and dtype must match)."""
    import jax  # optional dependency

    flat, treedef = flatten(target)
    holders = {k: np.empty(np.shape(v), dtype=np.asarray(v).dtype if not hasattr(v, "dtype") else v.dtype)
               for k, v in flat.items()}
    flat_api.load(path, into=holders, **kwargs)
    leaves = []
    for k, v in flat.items():
        arr = holders[k]
        if isinstance(v, jax.Array):
            leaves.append(jax.device_put(arr, v.sharding))
        else:
            leaves.append(arr)
    return jax.tree_util.tree_unflatten(treedef, leaves)


def register() -> None:
    """Registers the JAX ``leaf`` hook with pyckpt.registry under the name "jax"."""
    register_adapter("jax", leaf=to_numpy)
