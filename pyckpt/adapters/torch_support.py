"""torch support: tensors as leaves and in-place targets, ``nn.Module`` and
optimizers as object-graph nodes.

- A CPU tensor is saved straight from its memory (a numpy view, no copy).
- A CUDA tensor is a ``DeviceArray`` (``torch_device.py``): saves stage it
  through pinned buffers on a copy stream, loads fill it in place through
  pinned bounce buffers, ``copy_state`` and snapshots copy it on the device.
- Tensors on other devices are copied to host memory first (saves), and
  filled from a host copy (loads).
- bfloat16 and float8 tensors map to ml_dtypes arrays of the same bits.
- An ``nn.Module`` is a node whose edges are its parameters, buffers and
  submodules (the names of its state_dict, split at the dots), restored in place.
- An optimizer, like any object with ``state_dict()`` / ``load_state_dict()`` (LR
  schedulers, samplers...), is saved as its state dict and restored with
  ``load_state_dict`` (``pyckpt.graph.stateful.StateNode``), so a fresh optimizer
  whose state does not exist yet is restored too; checkpoints written before
  state templates existed restore through the optimizer's current state dict.
- A ``torch.Generator`` (CPU or CUDA, ``torch.default_generator`` included) is
  saved as its ``get_state()`` and restored with ``set_state``; the part "torch"
  of ``pyckpt.GlobalRNG`` is torch's CPU generator and every CUDA device's.
"""

from __future__ import annotations

import sys
import threading
import warnings
import weakref
from itertools import chain, repeat
from operator import attrgetter
from typing import Any, Callable

import numpy as np

from ..device.array import DeviceArray
from ..device.copies import copy_values
from ..graph.object_graph import MISSING
from ..graph.stateful import StateNode
from ..registry import register_adapter
from ..rng import register_global
from .torch_device import ML_NAMES, copy_tensors, device_array, torch_dtype


def _torch() -> Any:
    return sys.modules.get("torch")


_VIEW_DTYPES: dict[Any, str] | None = None  # torch dtype -> its name, for those of ML_NAMES


def _ml_view(torch: Any, t: Any) -> np.ndarray | None:
    """numpy view of a CPU tensor whose dtype numpy lacks (bfloat16, float8)."""
    global _VIEW_DTYPES
    if _VIEW_DTYPES is None:  # made whole, then published: threads see all of it or none
        _VIEW_DTYPES = {getattr(torch, n): n for n in ML_NAMES if hasattr(torch, n)}
    name = _VIEW_DTYPES.get(t.dtype)
    if name is None:
        return None
    try:
        import ml_dtypes  # see _dtypes.py: imported where bf16 is met
    except ImportError:
        raise TypeError(f"saving torch.{name} tensors needs ml_dtypes: pip install ml_dtypes") from None
    raw = t.view(torch.int16 if name == "bfloat16" else torch.uint8)
    return raw.numpy().view(getattr(ml_dtypes, name))


def _view_name(dtype: np.dtype) -> str | None:
    """The name of an ml_dtypes dtype of ``ML_NAMES`` (bfloat16, float8), else None
    (``dtype.name`` costs microseconds: numpy's own dtypes are told apart first)."""
    if dtype.isbuiltin == 1:
        return None
    name = dtype.name
    return name if name in ML_NAMES else None


def _plain(obj: Any) -> Any:
    """The tensor without autograd history (itself when it has none: no new object)."""
    return obj.detach() if obj.requires_grad else obj


def _not_strided(t: Any) -> TypeError:
    return TypeError(f"a {str(t.layout).replace('torch.', '')} tensor: pyckpt stores dense "
                     "(strided) tensors; save t.to_dense(), or its parts (indices and values)")


def to_numpy(obj: Any) -> np.ndarray | DeviceArray | None:
    """The ``leaf`` hook: a numpy view of a CPU tensor, a DeviceArray for a CUDA
    tensor, a host copy for other devices; None for what is not a tensor."""
    torch = _torch()
    if torch is None or not isinstance(obj, torch.Tensor):
        return None
    if obj.layout is not torch.strided:
        raise _not_strided(obj)
    if obj.is_cuda:
        return device_array(torch, obj)  # detached there (once: no _plain first)
    t = _plain(obj)
    if not t.is_cpu:
        t = t.cpu()
    if t.is_conj():
        t = t.resolve_conj()
    if t.is_neg():
        t = t.resolve_neg()
    view = _ml_view(torch, t)
    return view if view is not None else t.numpy()


def writable(obj: Any) -> tuple[np.ndarray, Callable[[], None] | None] | DeviceArray | None:
    """The ``target`` hook: (array to fill, finish) for an in-place target tensor: CPU
    tensors through a view (finish None); CUDA tensors as a DeviceArray (filled on the
    device); others, and conjugate or negative views, through a host copy of their
    values copied back in finish (torch writes through the view)."""
    torch = _torch()
    if torch is None or not isinstance(obj, torch.Tensor):
        return None
    if obj.layout is not torch.strided:
        raise _not_strided(obj)
    lazy = obj.is_conj() or obj.is_neg()  # a view whose values torch computes on reading
    if obj.is_cuda and not lazy:
        return device_array(torch, obj)  # detached there (once: no _plain first)
    t = _plain(obj)
    if t.is_cpu and not lazy:
        view = _ml_view(torch, t)
        return (view if view is not None else t.numpy()), None
    host = t.cpu().resolve_conj().resolve_neg()  # its values, in memory of their own
    arr = _ml_view(torch, host)
    arr = arr if arr is not None else host.numpy()

    def finish() -> None:
        t.copy_(host)

    return arr, finish


def stamp(objs: list) -> list | None:
    """The ``stamp`` hook: for a batch of strided, non-complex tensors, their data
    pointers, shapes, strides and dtypes (four lists, each read by one C-level pass):
    what ``writable``'s target of a tensor depends on (a view or detached tensor of
    that memory, laid out so). ``t.data = ...``, ``set_``, ``resize_``,
    ``as_strided_`` change one of them; a copy into the tensor changes none. None
    when torch is not imported or some object is not such a tensor (complex tensors:
    their conjugate bit is not stamped)."""
    torch = _torch()
    if torch is None or not all(map(isinstance, objs, repeat(torch.Tensor, len(objs)))):
        return None
    T = torch.Tensor
    dtypes = list(map(_DTYPE, objs))
    if any(d.is_complex for d in set(dtypes)):  # (a tensor keeps its layout: not stamped)
        return None
    return [list(map(T.data_ptr, objs)), list(map(T.size, objs)), list(map(T.stride, objs)),
            dtypes]


_DTYPE = attrgetter("dtype")


def to_torch(tree: Any) -> Any:
    """The same tree with numpy arrays turned into torch tensors (bfloat16 kept)."""
    import torch  # optional dependency

    return _torch_tree(tree, torch)


def _torch_tree(x: Any, torch: Any) -> Any:
    """``to_torch`` of one node (module-level: a closure calling itself is a cycle)."""
    if isinstance(x, dict):
        return {k: _torch_tree(v, torch) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return type(x)(_torch_tree(v, torch) for v in x)
    if isinstance(x, np.ndarray):
        name = _view_name(x.dtype)
        if name == "bfloat16":
            return torch.from_numpy(x.view(np.int16)).view(torch.bfloat16)
        if name is not None:
            return torch.from_numpy(x.view(np.uint8)).view(getattr(torch, name))
        return torch.from_numpy(np.ascontiguousarray(x))
    return x


# -- object graph nodes ----------------------------------------------------------------

class ModuleNode:
    """An nn.Module seen as a graph node: edges to parameters, buffers, submodules."""

    def __init__(self, module: Any) -> None:
        self.module = module
        self._by_name: dict[str, Any] | None = None  # made by the first _pyckpt_get_child

    def _pyckpt_children(self) -> list[tuple[str, Any]]:
        m = self.module
        out: list[tuple[str, Any]] = []
        out.extend((n, p) for n, p in m.named_parameters(recurse=False) if p is not None)
        out.extend((n, b) for n, b in m.named_buffers(recurse=False) if b is not None
                   and n not in getattr(m, "_non_persistent_buffers_set", set()))
        out.extend(m.named_children())
        extra = _extra_state(m)
        if extra is not None:
            out.append((EXTRA_STATE, extra))
        return out

    def _pyckpt_signature(self) -> tuple:
        """What ``_pyckpt_children`` lists, as one cheaply compared value (the names and
        object ids of the parameters, buffers and submodules, the non-persistent
        buffer names, whether it has extra state): equal while the children are the
        same objects under the same names (a kept walk is re-checked with it). A module
        class that lists its members its own way (overriding ``named_parameters``,
        ``named_buffers`` or ``named_children``): its children's names and ids."""
        m = self.module
        cls, base = type(m), _torch().nn.Module
        if cls.named_parameters is not base.named_parameters or \
                cls.named_buffers is not base.named_buffers or \
                cls.named_children is not base.named_children:
            return ("listed", tuple((n, id(c)) for n, c in self._pyckpt_children()))
        d = m.__dict__
        p, b, c = d.get("_parameters", {}), d.get("_buffers", {}), d.get("_modules", {})
        return (tuple(p), tuple(map(id, p.values())), tuple(b), tuple(map(id, b.values())),
                tuple(c), tuple(map(id, c.values())),
                frozenset(getattr(m, "_non_persistent_buffers_set", ())),
                _extra_state(m) is not None)

    @staticmethod
    def _pyckpt_signatures(nodes: list["ModuleNode"]) -> list | None:
        """``_pyckpt_signature`` of many module nodes as one value, found in C-level
        passes over all of them (a kept walk of a model re-checks every module at each
        call): the modules' classes (and, per class, whether it lists its members the
        standard way and has extra state), the names and object ids of each one's
        parameters, buffers and submodules, its non-persistent buffer names. None when
        a class lists its members its own way (then each node signs alone)."""
        mods = [n.module for n in nodes]
        types: list[Any] = list(map(type, mods))
        base = _torch().nn.Module
        flags = []
        for cls in set(types):
            if cls.named_parameters is not base.named_parameters or \
                    cls.named_buffers is not base.named_buffers or \
                    cls.named_children is not base.named_children:
                return None
            own = getattr(cls, "get_extra_state", None)
            flags.append((cls, own is not None and own is not base.get_extra_state))
        try:
            out: list = [types, frozenset(flags),
                         list(map(frozenset, map(_NON_PERSISTENT, mods)))]
            for dicts in (list(map(_PARAMS, mods)), list(map(_BUFFERS, mods)),
                          list(map(_MODULES, mods))):
                out += (list(map(len, dicts)), list(chain.from_iterable(dicts)),
                        list(map(id, chain.from_iterable(map(dict.values, dicts)))))
        except (AttributeError, TypeError):  # a module without torch's own dicts
            return None
        return out

    def _pyckpt_get_child(self, name: str) -> Any:
        """The child named ``name``. A node is made per visit of the module, so its
        children are listed once for all the lookups of one visit."""
        if self._by_name is None:
            self._by_name = {}
            for n, v in self._pyckpt_children():  # the first of a name, as a scan finds it
                self._by_name.setdefault(n, v)
        return self._by_name.get(name, MISSING)


#: the edge of a module's extra state (torch's state_dict key suffix for it)
EXTRA_STATE = "_extra_state"


class ExtraState:
    """A module's extra state (what its own ``get_extra_state()`` returns) as an object
    of the graph: one per module, so that walks find the same object again; its node
    (``node_for``) is a StateNode made per visit, restored with ``set_extra_state``,
    the state kept under the edge ``value`` (it need not be a dict)."""

    __slots__ = ("_module", "__weakref__")

    def __init__(self, module: Any) -> None:
        self._module = weakref.ref(module)

    def node(self) -> StateNode:
        module = self._module()
        if module is None:  # only while its module is alive is it in any graph
            raise ReferenceError("the module of this extra state is gone")
        return StateNode(module, lambda: {"value": module.get_extra_state()},
                         lambda state: module.set_extra_state(state["value"]))


_EXTRA: "weakref.WeakKeyDictionary[Any, ExtraState]" = weakref.WeakKeyDictionary()
_EXTRA_LOCK = threading.Lock()


_PARAMS, _BUFFERS, _MODULES = (attrgetter("_parameters"), attrgetter("_buffers"),
                               attrgetter("_modules"))
_NON_PERSISTENT = attrgetter("_non_persistent_buffers_set")


def _extra_state(module: Any) -> ExtraState | None:
    """The ExtraState of a module whose class defines ``get_extra_state`` (as torch's
    ``state_dict`` includes it), else None."""
    own = getattr(type(module), "get_extra_state", None)
    if own is None or own is getattr(_torch().nn.Module, "get_extra_state", None):
        return None
    with _EXTRA_LOCK:
        found = _EXTRA.get(module)
        if found is None:
            found = _EXTRA[module] = ExtraState(module)
        return found


class OptimizerNode(StateNode):
    """A torch optimizer seen as a graph node holding its state_dict."""

    def __init__(self, optimizer: Any) -> None:
        super().__init__(optimizer, optimizer.state_dict, optimizer.load_state_dict)
        self.optimizer = optimizer

    def _pyckpt_restore(self, values: Any) -> None:
        """Restores from a checkpoint without a state template (pyckpt before issue 14,
        whose optimizer nodes kept only arrays and numbers): the stored state slots
        and the numbers of the param groups, on top of the current state dict."""
        import torch  # optional dependency

        sd = self.optimizer.state_dict()
        stored_state = values.get("state", {})
        pairs = enumerate(stored_state) if isinstance(stored_state, list) else stored_state.items()
        state = {}
        for idx, slots in pairs:
            state[int(idx)] = {k: _tensor(torch, v) for k, v in slots.items()}
        groups = sd["param_groups"]
        for g, stored in zip(groups, values.get("param_groups", [])):
            for k, v in stored.items():
                if k == "params" or k not in g:
                    continue
                g[k] = _pythonic(g[k], v)
        sd["state"] = state
        self.optimizer.load_state_dict(sd)


def _tensor(torch: Any, v: np.ndarray, copy: bool = True) -> Any:
    """A CPU tensor holding a loaded array (bfloat16 and float8 kept): a copy, or with
    ``copy=False`` the array's own memory where torch can take it (writable, native
    byte order; a 0-d or non-contiguous array is copied)."""
    shared = (not copy and v.flags.writeable and v.flags.c_contiguous
              and v.dtype.isnative)  # ("<" on a little-endian host: a loaded array's)
    name = _view_name(v.dtype)
    if name == "bfloat16":
        raw = v.view(np.int16)
        return torch.from_numpy(raw if shared else raw.copy()).view(torch.bfloat16)
    if name is not None:
        raw = v.view(np.uint8)
        return torch.from_numpy(raw if shared else raw.copy()).view(getattr(torch, name))
    return torch.from_numpy(v if shared else np.array(v, dtype=v.dtype.newbyteorder("=")))


def from_host(arr: np.ndarray) -> Any:
    """The ``from_host`` hook: a CPU tensor holding ``arr``'s values. Callers hand over
    arrays nobody else holds (a load's fresh arrays), so the tensor takes over the
    array's memory where it can (no copy). Without torch installed: ``arr`` itself."""
    try:
        import torch  # optional dependency: the value was saved from torch
    except ImportError:
        return arr
    return _tensor(torch, arr, copy=False)


def _pythonic(template: Any, v: Any) -> Any:
    """A stored number back in the type of the optimizer's current value."""
    if isinstance(template, tuple):
        return tuple(_pythonic(t, x) for t, x in zip(template, v))
    if isinstance(template, list):
        return [_pythonic(t, x) for t, x in zip(template, v)]
    if isinstance(v, np.ndarray) and v.ndim == 0:
        return type(template)(v[()]) if isinstance(template, (bool, int, float)) else v[()].item()
    return v


def generator_node(g: Any) -> StateNode:
    """A ``torch.Generator`` as a graph node: ``{"state": g.get_state()}``."""
    return StateNode(g, lambda: {"state": g.get_state()},
                     lambda sd: g.set_state(sd["state"]))


# -- the "torch" part of pyckpt.GlobalRNG ----------------------------------------------------

def global_state() -> dict | None:
    """torch's global random state: the CPU generator's and, where CUDA is available,
    every device's (``"cuda"``, by device index); None when torch is not imported."""
    torch = _torch()
    if torch is None:
        return None
    cuda = torch.cuda.is_available()
    return {"cpu": torch.get_rng_state(),
            "cuda": [torch.cuda.get_rng_state(i) for i in range(torch.cuda.device_count())]
            if cuda else []}


def set_global_state(sd: dict) -> None:
    """Restores what ``global_state`` captured. CUDA devices this process lacks are
    skipped with a warning."""
    import torch  # optional dependency: the checkpoint holds torch's random state

    torch.set_rng_state(sd["cpu"])
    states = list(sd.get("cuda", []))
    have = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if len(states) > have:
        warnings.warn(f"pyckpt.GlobalRNG: the checkpoint holds the random state of "
                      f"{len(states)} CUDA device(s), this process has {have}: the others "
                      "are not restored", stacklevel=3)
    for i, st in enumerate(states[:have]):
        torch.cuda.set_rng_state(st, i)


def node_for(obj: Any) -> Any:
    """The ``node`` hook: a ModuleNode for an ``nn.Module``, an OptimizerNode for an
    optimizer, a StateNode for a ``torch.Generator``, else None (also when torch is
    not imported; other objects with ``state_dict()`` are StateNodes of the graph)."""
    torch = _torch()
    if torch is None or isinstance(obj, torch.Tensor):  # a tensor: the common case, first
        return None
    if isinstance(obj, torch.nn.Module):
        return ModuleNode(obj)
    if isinstance(obj, torch.optim.Optimizer):
        return OptimizerNode(obj)
    if isinstance(obj, torch.Generator):
        return generator_node(obj)
    if isinstance(obj, ExtraState):
        return obj.node()
    return None


def empty(device: Any, shape: tuple, dtype: np.dtype) -> Any:
    """The ``empty`` hook: a new torch tensor on a torch device ("cpu", "cuda",
    "cuda:N", or a ``torch.device``), else None."""
    name = str(device)
    if not (name == "cpu" or name == "cuda" or name.startswith("cuda:")):
        return None
    try:
        import torch  # optional dependency
    except ImportError:
        raise ValueError(f"device={name!r} loads into torch tensors: pip install torch") from None
    return torch.empty(shape, dtype=torch_dtype(torch, dtype), device=torch.device(name))


def _copy(srcs: list, dsts: list) -> bool:
    """The ``copy`` hook: pairs of tensors of one device copied in batches
    (``torch_device.copy_tensors``); large CPU tensors by the C++ core."""
    torch = _torch()
    return torch is not None and copy_tensors(torch, srcs, dsts, _host_copy)


def _host_copy(srcs: list, dsts: list) -> None:
    """CPU tensors copied through numpy views, in parallel by the C++ core."""
    src_views: list[Any] = [to_numpy(s) for s in srcs]
    dst_views: list[Any] = [writable(d) for d in dsts]  # (view, None) for CPU tensors
    copy_values(src_views, [v[0] for v in dst_views], 0)


def register() -> None:
    """Registers the torch hooks (leaf, target, node, empty, from_host) with
    pyckpt.registry under the name "torch", and the part "torch" of GlobalRNG."""
    register_adapter("torch", leaf=to_numpy, target=writable, node=node_for, empty=empty,
                     from_host=from_host, copy=_copy, stamp=stamp)
    register_global("torch", global_state, set_global_state)
