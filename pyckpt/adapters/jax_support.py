"""JAX support: ``jax.Array`` leaves (copied to host memory when saved) and
whole pytrees.

JAX arrays are immutable, so a load cannot fill them in place: use
``restore(path, target)``, which returns a new pytree shaped like ``target``
with every leaf loaded and placed like the target's leaf (same sharding).
Custom pytree nodes (flax structs, named tuples...) are handled through
``jax.tree_util``; keys are the pytree paths (``params/dense/kernel``).

Nothing on the way from a checkpoint to a new ``jax.Array`` compiles or traces
(no ``jnp`` function, whose eager call compiles one XLA program per shape and
dtype, the first time each is seen): arrays are made by ``jax.device_put``.
"""

from __future__ import annotations

import sys
from typing import Any

import numpy as np

from .. import flat as flat_api
from ..format.source import CheckpointSource
from ..registry import register_adapter
from ..device.array import DeviceArray
from .jax_device import Landing, device_array, host_array, landing, on_accelerator
from ..saving import PendingSave
from ..sources import open_source
from ..errors import CheckpointKeyError
from ..tree import not_a_tree_error, skeleton_leaves, static_values

# Python scalar leaves: restored as Python scalars, of the kind they were saved as
_PY_SCALARS: dict[str, type] = {"int": int, "float": float, "bool": bool, "complex": complex}


def _jax() -> Any:
    return sys.modules.get("jax")


def to_numpy(obj: Any) -> np.ndarray | DeviceArray | None:
    """The ``leaf`` hook: a host numpy copy of a ``jax.Array`` in host memory, a
    DeviceArray for one on an accelerator (``jax_device.py``), else None (also when
    JAX is not imported)."""
    jax = _jax()
    if jax is None or not isinstance(obj, jax.Array):
        return None
    if on_accelerator(obj):  # staged in bulk: copy_to_host_async for every array at once
        return device_array(obj)
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


def _nested(tree: Any) -> Any:
    """The pytree as plain containers: each custom node (a named tuple, a flax struct)
    a dict of its fields, sequences lists; the leaves' keys stay their pytree paths,
    and ``pyckpt.load`` gives the nesting back."""
    import jax  # optional dependency

    pairs, _ = jax.tree_util.tree_flatten_with_path(tree)
    root: dict = {}
    seqs: set[int] = set()  # ids of the dicts that stand for sequences
    for path, leaf in pairs:
        node = root
        for i, entry in enumerate(path):
            key: Any = entry.idx if isinstance(entry, jax.tree_util.SequenceKey) else _key(entry)
            if isinstance(key, int):
                seqs.add(id(node))
            if i == len(path) - 1:
                if key in node:
                    raise ValueError(f"two pytree leaves map to the same key at {key!r}")
                node[key] = leaf
            else:
                node = node.setdefault(key, {})
                if not isinstance(node, dict):
                    raise ValueError(f"two pytree leaves map to the same key at {key!r}")

    return _plain(root, seqs)


def _plain(node: Any, seqs: set[int]) -> Any:
    """Nested dicts with the sequences' integer keys made lists again (module-level: a
    closure calling itself is a reference cycle)."""
    if not isinstance(node, dict):
        return node
    out = {k: _plain(v, seqs) for k, v in node.items()}
    if id(node) in seqs and list(out) == list(range(len(out))):
        return list(out.values())
    return {str(k): v for k, v in out.items()}


def save(tree: Any, path: Any, **kwargs: Any) -> str:
    """Saves any pytree (custom nodes included) under its paths' keys; returns the path
    once committed (a ``blocking=False`` save is waited for here). ``pyckpt.load``
    gives it back as nested dicts and lists (custom nodes as dicts of their fields);
    ``restore`` rebuilds the pytree of a target."""
    flat, treedef = flatten(tree)
    if treedef.num_nodes == 1 and treedef.num_leaves == 1:  # the pytree is a single leaf
        raise not_a_tree_error(tree, "pyckpt.adapters.jax_support.save")
    out = flat_api.save(_nested(tree), path, **kwargs)
    return out.wait() if isinstance(out, PendingSave) else out


def _saved_kinds(src: CheckpointSource, select: Any, key_map: Any) -> dict[str, str]:
    """target key -> the leaf kind recorded in the checkpoint's tree skeleton ("int",
    "float", "ndarray"...; pyckpt.tree.flatten); empty when no skeleton was saved."""
    try:
        kinds = skeleton_leaves(src.tree) if src.tree is not None else {}
    except (ValueError, TypeError, AttributeError, KeyError, IndexError):
        kinds = {}  # a malformed skeleton: targets keep their own kinds
    keys = list(src.keys)
    if select is not None:
        keys = flat_api.select_keys(keys, select)
    return {t: kinds.get(c, "ndarray") for c, t in flat_api.map_keys(keys, key_map).items()}


def _is_text(v: Any) -> bool:
    return isinstance(v, (str, bytes))


def _saved_texts(src: CheckpointSource, key_map: Any, wanted: list[str]) -> dict[str, Any]:
    """target key -> the str / bytes value the checkpoint's tree skeleton keeps for each
    of ``wanted``; CheckpointKeyError naming those it lacks."""
    if not wanted:
        return {}
    stored = static_values(src.tree) if src.tree is not None else {}
    found = {t: stored[c] for c, t in flat_api.map_keys(list(stored), key_map).items()}
    missing = [k for k in wanted if k not in found]
    if missing:
        raise CheckpointKeyError(
            f"{len(missing)} text leaf(s) of the target are not in checkpoint {src.url}: "
            + ", ".join(map(repr, missing))
            + (" (it holds arrays there, not text)" if set(missing) & set(src.keys) else ""))
    return found


def through_bounce_buffers(leaf: Any) -> bool:
    """Whether ``restore`` makes the new array of the target leaf ``leaf`` (a
    jax.Array) from the bounce buffers of a device load (``device/loading.py``, a
    batch at a time: a leaf on an accelerator), rather than from a new host array of
    its own, which the new array may then share (a leaf in host memory)."""
    return on_accelerator(leaf)


def restore(path: Any, target: Any, **kwargs: Any) -> Any:
    """A new pytree like ``target`` with every leaf read from ``path`` and placed like
    the target's (shape and dtype must match). A target leaf that is a Python scalar
    (int, float, bool, complex) comes back as a Python scalar: of the kind it was
    saved as (an int saved as ``7`` is ``7``, not ``array(7)``), or of the target's
    kind when the checkpoint stored an array there (its shape must be ``()``).

    Leaves on an accelerator are read into reused bounce buffers and put on their
    devices a buffer at a time (``jax_device`` module doc); the others are read into
    new host arrays (``jax_device.host_array``), all placed by one ``jax.device_put``,
    which a CPU device does without a copy."""
    import jax  # optional dependency

    flat, treedef = flatten(target)
    src = open_source(path, kwargs.get("storage_options"))
    saved = _saved_kinds(src, kwargs.get("select"), kwargs.get("key_map"))
    texts = _saved_texts(src, kwargs.get("key_map"), [k for k, v in flat.items() if _is_text(v)])
    holders: dict[str, Any] = {}
    on_host: list[str] = []  # jax.Array leaves read into host arrays of their own
    for k, v in flat.items():
        if _is_text(v):  # str / bytes leaves: kept in the tree skeleton, not read
            continue
        if type(v) in _PY_SCALARS.values():  # replaced in `holders` by a scalar of that kind
            holders[k] = _PY_SCALARS[saved[k]](0) if saved.get(k) in _PY_SCALARS else v
        elif isinstance(v, jax.Array) and through_bounce_buffers(v):
            holders[k] = landing(v)
        elif isinstance(v, jax.Array):  # placed afterwards, sharing the host array's memory
            holders[k] = host_array(tuple(v.shape), v.dtype)
            on_host.append(k)
        else:
            holders[k] = np.empty(np.shape(v), dtype=np.asarray(v).dtype if not hasattr(v, "dtype") else v.dtype)
    flat_api.load(src, into=holders, **kwargs)
    if on_host:  # fresh arrays nobody else holds: the new ones may share their memory
        holders.update(zip(on_host, jax.device_put([holders[k] for k in on_host],
                                                   [flat[k].sharding for k in on_host])))
    leaves = []
    for k in flat:
        if k in texts:
            leaves.append(texts[k])
            continue
        v = holders[k]
        leaves.append(v.obj.array if isinstance(v, DeviceArray) else v)
    return jax.tree_util.tree_unflatten(treedef, leaves)


def _landing_target(obj: Any) -> DeviceArray | None:
    """The ``target`` hook: a restore's landing (``jax_device.landing``) is filled as it
    is; None for anything else (a JAX array cannot be filled in place)."""
    return obj if isinstance(obj, DeviceArray) and isinstance(obj.obj, Landing) else None


def from_host(arr: np.ndarray) -> Any:
    """The ``from_host`` hook: a ``jax.Array`` (on the default device, uncommitted)
    holding ``arr``'s values, for JAX arrays restored by replacement (a raw PRNG key in
    a dict...) and for ``load`` of leaves saved from JAX; ``arr`` itself without JAX
    installed. ``jax.device_put``, not ``jnp.array``: nothing is compiled, and the new
    array may take over ``arr``'s memory (its callers hand over arrays nobody else
    holds)."""
    try:
        import jax  # optional dependency: the checkpoint holds a JAX array
    except ImportError:
        return arr
    return jax.device_put(arr)


def place(arr: np.ndarray, like: Any) -> Any:
    """The ``place`` hook: a ``jax.Array`` holding ``arr``'s values with the sharding
    (devices) of the ``jax.Array`` ``like``, which it replaces in ``load(into=)``'s
    tree (a JAX array cannot be filled in place); None for anything else."""
    import jax  # optional dependency: ``like`` is a JAX array

    return jax.device_put(arr, like.sharding) if isinstance(like, jax.Array) else None


def register() -> None:
    """Registers the JAX ``leaf``, ``target`` (a restore's landings), ``from_host`` and
    ``place`` hooks with pyckpt.registry under the name "jax"."""
    register_adapter("jax", leaf=to_numpy, target=_landing_target, from_host=from_host,
                     place=place)
