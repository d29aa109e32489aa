"""The one registry of foreign value types (docs/API.md, "Adapters").

torch and JAX support (``pyckpt/adapters/``) and any user type plug in here,
with up to seven hooks, each returning None for objects that are not theirs:

- ``leaf(obj) -> np.ndarray | DeviceArray``: the host array to save for a leaf
  of a tree or a value of the object graph (a zero-copy view where possible),
  or a ``pyckpt.device.DeviceArray`` for a value in device memory (its bytes are
  then moved in bulk by its copy engine);
- ``target(obj) -> np.ndarray | (np.ndarray, finish) | DeviceArray``: a writable
  array that fills the object in place when loaded into; ``finish()`` (or None)
  runs once it is filled, e.g. to copy a host buffer back to device memory; a
  DeviceArray is filled on its device. A walk of the object graph asks it at
  most twice per object (once for a value held in a list, tuple or dict);
- ``node(obj) -> proxy``: an object-graph node standing for obj (its named
  children and how to restore it), like a ``Trackable``;
- ``empty(device, shape, dtype) -> obj``: a new, uninitialised array of the
  framework on ``device`` (a string such as ``"cuda:0"``), or None when the
  device name is not the framework's (``load(path, device=...)``);
- ``from_host(array) -> obj``: the framework's host array holding a loaded
  numpy array's values, for values rebuilt rather than filled in place (the
  tensors of a ``state_dict()``, docs/API.md section 11; ``load`` of a leaf saved
  from that framework). Callers hand over arrays nobody else holds, so the hook
  may take over the array's memory instead of copying it;
- ``copy(srcs, dsts) -> bool``: copies every source into the destination of the
  same position, in place, and returns True, when the hook takes all of them
  (``copy_state`` of two trees of the framework's arrays: one batched copy
  instead of the per-value path); False, having copied nothing, otherwise;
- ``place(array, like) -> obj``: the framework's array holding a loaded numpy
  array's values, placed like ``like`` (same device, same sharding): for leaves of
  ``load(path, into=...)`` that cannot be filled in place (JAX arrays are
  immutable), which are replaced in their container. Without it, ``from_host``;
- ``stamp(objs) -> list | None``: for a batch of objects its ``target`` hook takes, a
  list of values, one per object, that compare equal between two calls as long as
  the target the hook gave for each object is still the one it would give now
  (torch: each tensor's data pointer, shape, strides, dtype and device); None when
  it cannot promise that for some object. A walk of the object graph is re-checked
  with it instead of being walked again (``graph/walk_cache.py``). Without it, the
  graph is walked each time.

Example::

    pyckpt.registry.register_adapter("mytensor", leaf=lambda o: o.numpy()
                                     if isinstance(o, MyTensor) else None)

Hooks are asked in registration order; a name registered again replaces its hooks.
Every registration counts up ``generation()``: what was worked out with the hooks of
an earlier generation (a kept walk) is worked out again.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable, NamedTuple, TypeAlias

import numpy as np

if TYPE_CHECKING:  # for signatures only
    from .device.array import DeviceArray

__all__ = ["Adapter", "register_adapter", "leaf_array", "leaf_adapter", "target_view",
           "node_proxy", "empty_on", "from_host", "place_like", "copy_leaves", "stamps",
           "generation"]

#: What a ``target`` hook returns.
View: TypeAlias = "np.ndarray | DeviceArray | tuple[np.ndarray, Callable[[], None] | None]"


class Adapter(NamedTuple):
    """The hooks registered under one name (module doc); None for a hook not given."""

    name: str
    leaf: Callable[[Any], "np.ndarray | DeviceArray | None"] | None = None
    target: Callable[[Any], "View | None"] | None = None
    node: Callable[[Any], Any] | None = None
    empty: Callable[[Any, tuple, np.dtype], Any] | None = None
    from_host: Callable[[np.ndarray], Any] | None = None
    copy: Callable[[list, list], bool] | None = None
    place: Callable[[np.ndarray, Any], Any] | None = None
    stamp: Callable[[list], "list | None"] | None = None


_ADAPTERS: list[Adapter] = []
_GENERATION = [0]  # counted up by every registration


def generation() -> int:
    """How many registrations (``register_adapter``, ``touch``) were made so far."""
    return _GENERATION[0]


def touch() -> None:
    """Counts up ``generation()``: for code changing ``_ADAPTERS`` itself."""
    _GENERATION[0] += 1


def register_adapter(name: str, *, leaf: Callable[[Any], "np.ndarray | DeviceArray | None"] | None = None,
                     target: Callable[[Any], "View | None"] | None = None,
                     node: Callable[[Any], Any] | None = None,
                     empty: Callable[[Any, tuple, np.dtype], Any] | None = None,
                     from_host: Callable[[np.ndarray], Any] | None = None,
                     copy: Callable[[list, list], bool] | None = None,
                     place: Callable[[np.ndarray, Any], Any] | None = None,
                     stamp: Callable[[list], "list | None"] | None = None) -> None:
    """Registers (or replaces) the hooks of one foreign type family."""
    _ADAPTERS[:] = [a for a in _ADAPTERS if a.name != name]
    _ADAPTERS.append(Adapter(name, leaf, target, node, empty, from_host, copy, place, stamp))
    touch()


def leaf_array(obj: Any) -> "np.ndarray | DeviceArray | None":
    """The host array of obj from the first ``leaf`` hook that takes it, else None."""
    for a in _ADAPTERS:
        if a.leaf is not None:
            arr = a.leaf(obj)
            if arr is not None:
                return arr
    return None


def leaf_adapter(obj: Any) -> "tuple[str, np.ndarray | DeviceArray] | None":
    """``(adapter name, array)`` from the first ``leaf`` hook that takes obj, else None."""
    for a in _ADAPTERS:
        if a.leaf is not None:
            arr = a.leaf(obj)
            if arr is not None:
                return a.name, arr
    return None


def from_host(name: str, array: np.ndarray) -> Any:
    """The object of adapter ``name`` holding a copy of ``array`` (its ``from_host``
    hook); ``array`` itself when that adapter is not registered or has no such hook."""
    for a in _ADAPTERS:
        if a.name == name and a.from_host is not None:
            return a.from_host(array)
    return array


def place_like(name: str, array: np.ndarray, like: Any) -> Any:
    """The object of adapter ``name`` holding ``array``'s values, placed like ``like``
    (its ``place`` hook; else ``from_host``)."""
    for a in _ADAPTERS:
        if a.name == name and a.place is not None:
            return a.place(array, like)
    return from_host(name, array)


def target_view(obj: Any) -> "tuple[np.ndarray | DeviceArray, Callable[[], None] | None] | None":
    """``(array, finish)`` from the first ``target`` hook that takes obj (``finish``
    None when the hook gave a bare array), else None."""
    for a in _ADAPTERS:
        if a.target is not None:
            out = a.target(obj)
            if out is not None:
                return out if isinstance(out, tuple) else (out, None)
    return None


def node_proxy(obj: Any) -> Any:
    """The graph node standing for obj from the first ``node`` hook that takes it, else
    None."""
    for a in _ADAPTERS:
        if a.node is not None:
            proxy = a.node(obj)
            if proxy is not None:
                return proxy
    return None


def empty_on(device: Any, shape: tuple, dtype: np.dtype) -> Any:
    """A new array on ``device`` from the first ``empty`` hook that takes the device
    name; ValueError naming the device when none does."""
    for a in _ADAPTERS:
        if a.empty is not None:
            out = a.empty(device, tuple(shape), np.dtype(dtype))
            if out is not None:
                return out
    raise ValueError(f"device={device!r}: no adapter places arrays there (torch takes "
                     "'cpu', 'cuda' and 'cuda:N'; install and import the framework first)")


def copy_leaves(srcs: list, dsts: list) -> bool:
    """True once the first ``copy`` hook that takes every pair has copied them all; False
    (nothing copied) when no hook takes them."""
    for a in _ADAPTERS:
        if a.copy is not None and a.copy(srcs, dsts):
            return True
    return False


def stamps(objs: list) -> list | None:
    """The ``stamp`` of a batch of objects from the first ``stamp`` hook that takes all of
    them, else None."""
    for a in _ADAPTERS:
        if a.stamp is not None:
            out = a.stamp(objs)
            if out is not None:
                return out
    return None
