"""torch tensors in device memory (CUDA) as ``DeviceArray``s, and the copy engine
that moves their bytes (``device/engine.py`` has the contract).

``TorchCudaEngine`` (one per device):

- device-to-host copies run on a dedicated copy stream that first waits for
  the caller's current stream, so each copy sees the values of the moment it
  was issued; each copy records an event (its ticket). The ticket keeps the
  source tensor alive, so a tensor the program drops stays valid until its
  copy landed.
- host buffers are page-locked: plain memory whose pages were written on
  several threads first (``device.host_memory.touched``), then registered with
  CUDA (``cudaHostRegister``: 0.1-0.2 s for 4.25 GB, against 2.4 s for
  ``torch.empty(pin_memory=True)``, which faults the pages in on one thread);
  copies from and to them are asynchronous DMA at PCIe speed.
- device snapshots (``device/snapshot.py``): ``alloc_device`` is one uint8
  tensor per buffer (torch's caching allocator), ``carve`` views slices of it,
  ``snapshot`` copies with ``_foreach_copy_`` on the caller's current stream and
  records an event there (its ticket); ``device_memory`` is
  ``torch.cuda.mem_get_info``; ``detached()`` makes the copy stream the current
  one, so a drain's copies wait for nothing the caller queues meanwhile.
- host-to-device copies run on the same stream; once their tickets are done
  the caller's current stream is made to wait for the copy stream, so later
  kernels see the loaded values.
- device-to-device copies run on the caller's current stream (``copy_`` /
  ``_foreach_copy_``), ordered with the caller's own work; nothing crosses PCIe.

Nothing here runs without CUDA: on machines without it no tensor is a
DeviceArray (CPU tensors are numpy views, ``torch_support.py``).
"""

from __future__ import annotations

import threading
from itertools import repeat
from operator import attrgetter
from typing import Any, Callable, Sequence

import numpy as np

from ..device.array import DeviceArray
from ..device.copies import overlap
from ..device.engine import Batch, CopyEngine, Ticket
from ..device.host_memory import touched

__all__ = ["TorchCudaEngine", "device_array", "numpy_dtype", "torch_dtype", "foreach_copy",
           "copy_tensors", "tensor_batch", "copy_tensor_batches", "clone_tensor_batch",
           "ML_NAMES"]

#: torch dtypes numpy lacks that ml_dtypes has under the same name (same bits): the one
#: list for CPU views (torch_support.py) and device arrays (here)
ML_NAMES = ("bfloat16", "float8_e4m3fn", "float8_e5m2", "float8_e4m3fnuz", "float8_e5m2fnuz",
            "float8_e8m0fnu")


_NUMPY_DTYPES: dict[Any, np.dtype] = {}  # torch dtype -> numpy dtype (device_array's hot path)


def numpy_dtype(torch: Any, dtype: Any) -> np.dtype:
    """The numpy dtype with the same bytes as a torch dtype (ml_dtypes for bfloat16
    and float8); TypeError when there is none."""
    found = _NUMPY_DTYPES.get(dtype)
    if found is None:
        found = _NUMPY_DTYPES[dtype] = _numpy_dtype(torch, dtype)
    return found


def _numpy_dtype(torch: Any, dtype: Any) -> np.dtype:
    name = str(dtype).replace("torch.", "")
    if name in ML_NAMES:
        try:
            import ml_dtypes  # see _dtypes.py: imported where bf16 is met
        except ImportError:
            raise TypeError(f"torch.{name} tensors need ml_dtypes: pip install ml_dtypes") from None
        return np.dtype(getattr(ml_dtypes, name))
    if name == "bool":
        return np.dtype(np.bool_)
    try:
        return np.dtype(torch.empty((), dtype=dtype).numpy().dtype)
    except TypeError:
        raise TypeError(f"torch.{name} tensors cannot be saved (no numpy equivalent)") from None


def torch_dtype(torch: Any, dtype: np.dtype) -> Any:
    """The torch dtype with the same bytes as a numpy dtype."""
    name = np.dtype(dtype).name
    if name in ML_NAMES or name == "bool":
        return getattr(torch, name)
    try:
        return torch.from_numpy(np.empty(0, dtype=dtype)).dtype
    except TypeError:
        raise TypeError(f"torch has no dtype for numpy's {np.dtype(dtype)}") from None


class _EventTicket(Ticket):
    __slots__ = ("event", "keep")

    def __init__(self, event: Any, keep: tuple) -> None:
        self.event = event
        self.keep = keep  # source and destination, alive until the copy landed

    def done(self) -> bool:
        if self.event.query():
            self.keep = ()
            return True
        return False

    def wait(self) -> None:
        self.event.synchronize()
        self.keep = ()


class TorchCudaEngine(CopyEngine):
    """The copy engine of one CUDA device (module doc)."""

    name = "torch-cuda"

    def __init__(self, torch: Any, device: Any) -> None:
        self.torch = torch
        self.device = torch.device(device)
        self.stream = torch.cuda.Stream(device=self.device)
        self._pinned: dict[int, tuple[str, Any]] = {}  # id(buffer) -> (kind, its owner)

    # -- host buffers --------------------------------------------------------------------
    def alloc_host(self, nbytes: int) -> np.ndarray:
        """Page-locked host memory of exactly ``nbytes``: a plain buffer whose pages
        were touched in parallel (``touched``), registered with CUDA
        (``cudaHostRegister``). torch's pinned allocator is the fallback; it rounds
        every block up to a power of two, which would pin up to twice the state."""
        n = int(nbytes)
        if n == 0:
            return np.empty(0, dtype=np.uint8)
        arr = touched(n)
        try:
            cudart = self.torch.cuda.cudart()
            err = cudart.cudaHostRegister(arr.ctypes.data, n, 0)
            ok = int(getattr(err, "value", err)) == 0
        except (AttributeError, RuntimeError, TypeError):
            ok = False
        if ok:
            self._pinned[id(arr)] = ("registered", arr)
            return arr
        t = self.torch.empty(n, dtype=self.torch.uint8, pin_memory=True)
        arr = t.numpy()
        self._pinned[id(arr)] = ("torch", t)
        return arr

    def free_host(self, buf: np.ndarray) -> None:
        kind, owner = self._pinned.pop(id(buf), ("", None))
        if kind == "registered" and owner is not None:
            self.synchronize()  # no copy may still use it
            self.torch.cuda.cudart().cudaHostUnregister(owner.ctypes.data)

    def _host_tensor(self, arr: np.ndarray) -> Any:
        """A torch view of a host array (pinned when it lies in one of our buffers)."""
        raw = self.torch.from_numpy(arr.reshape(-1).view(np.uint8))
        return raw.view(torch_dtype(self.torch, arr.dtype)).view(arr.shape)

    # -- copies ----------------------------------------------------------------------------
    def _ticket(self, keep: tuple) -> Ticket:
        ev = self.torch.cuda.Event()
        ev.record(self.stream)
        return _EventTicket(ev, keep)

    def to_host(self, srcs: Sequence[DeviceArray], dsts: Sequence[np.ndarray]) -> list[Ticket]:
        torch = self.torch
        self.stream.wait_stream(torch.cuda.current_stream(self.device))
        out = []
        with torch.cuda.stream(self.stream):
            for s, d in zip(srcs, dsts):
                dst = self._host_tensor(d)
                if s.nbytes:
                    dst.copy_(s.obj, non_blocking=True)
                out.append(self._ticket((s.obj, dst)))
        return out

    def to_device(self, srcs: Sequence[np.ndarray], dsts: Sequence[DeviceArray]) -> list[Ticket]:
        torch = self.torch
        current = torch.cuda.current_stream(self.device)
        self.stream.wait_stream(current)  # the targets are not in use by queued work
        out = []
        with torch.cuda.stream(self.stream):
            for s, d in zip(srcs, dsts):
                src = self._host_tensor(s)
                if d.nbytes:
                    d.obj.copy_(src, non_blocking=True)
                out.append(self._ticket((src, d.obj)))
        current.wait_stream(self.stream)  # later work of the caller sees the new values
        return out

    def to_device_batch(self, srcs: Sequence[np.ndarray], dsts: Sequence[DeviceArray]) -> Ticket:
        """``to_device`` of one batch of a load (``device/loading.py``), on the same
        stream with the same ordering, but one event for the whole batch instead of
        one per copy, and each dtype's torch dtype looked up once per batch."""
        torch = self.torch
        current = torch.cuda.current_stream(self.device)
        self.stream.wait_stream(current)  # the targets are not in use by queued work
        dtypes: dict[np.dtype, Any] = {}
        keep: list = []  # sources and destinations, alive until the batch landed
        with torch.cuda.stream(self.stream):
            for s, d in zip(srcs, dsts):
                if not d.nbytes:
                    continue
                dt = dtypes.get(s.dtype)
                if dt is None:
                    dt = dtypes[s.dtype] = torch_dtype(torch, s.dtype)
                src = torch.from_numpy(s.reshape(-1).view(np.uint8)).view(dt).view(s.shape)
                d.obj.copy_(src, non_blocking=True)
                keep += (src, d.obj)
            ticket = self._ticket(tuple(keep))
        current.wait_stream(self.stream)  # later work of the caller sees the new values
        return ticket

    def copy(self, srcs: Sequence[DeviceArray], dsts: Sequence[DeviceArray]) -> None:
        foreach_copy(self.torch, [x.obj for x in dsts], [x.obj for x in srcs])

    def batch(self, arrays: Sequence[DeviceArray]) -> Batch:
        return tensor_batch(self.torch, arrays)

    def copy_batches(self, srcs: Batch, dsts: Batch) -> None:
        copy_tensor_batches(self.torch, srcs, dsts)

    def clones(self, srcs: Batch) -> Batch:
        with self.torch.cuda.device(self.device):
            return clone_tensor_batch(self.torch, srcs, self) or super().clones(srcs)

    def empty_like(self, src: DeviceArray) -> DeviceArray:
        t = self.torch.empty_like(src.obj, memory_format=self.torch.contiguous_format)
        return DeviceArray.trusted(t, src.shape, src.dtype, src.device, self)  # (src's: checked)

    def synchronize(self) -> None:
        self.stream.synchronize()

    # -- device snapshots ------------------------------------------------------------------
    def device_memory(self, device: str) -> tuple[int, int]:
        free, total = self.torch.cuda.mem_get_info(self.device)
        return int(free), int(total)

    def alloc_device(self, nbytes: int, like: DeviceArray) -> DeviceArray:
        t = self.torch.empty(int(nbytes), dtype=self.torch.uint8, device=self.device)
        return DeviceArray.trusted(t, (int(nbytes),), np.dtype(np.uint8), str(self.device), self)

    def free_device(self, buf: DeviceArray) -> None:
        self.synchronize()  # no copy out of it may still run

    def carve(self, buf: DeviceArray, offset: int, like: DeviceArray) -> DeviceArray:
        src = like.obj
        view = buf.obj[offset:offset + like.nbytes].view(src.dtype).view(src.shape)
        return DeviceArray.trusted(view, like.shape, like.dtype, like.device, self)

    def snapshot(self, srcs: Sequence[DeviceArray], dsts: Sequence[DeviceArray]) -> Ticket:
        torch = self.torch
        current = torch.cuda.current_stream(self.device)
        with torch.cuda.device(self.device):
            foreach_copy(torch, [d.obj for d in dsts], [s.obj for s in srcs])
        ev = torch.cuda.Event()
        ev.record(current)
        return _EventTicket(ev, ())  # the sources may go: later work on this stream is later

    def detached(self) -> Any:
        return self.torch.cuda.stream(self.stream)


def foreach_copy(torch: Any, dsts: list, srcs: list, contiguous: bool | None = None) -> None:
    """``dsts[i].copy_(srcs[i])`` for every i, outside autograd, on the current stream:
    one batched ``_foreach_copy_`` when every tensor is contiguous (``contiguous``:
    whether they all are, when the caller knows; None: checked here)."""
    if not srcs:
        return
    foreach = getattr(torch, "_foreach_copy_", None)
    if contiguous is None:
        is_contiguous = torch.Tensor.is_contiguous
        contiguous = all(map(is_contiguous, srcs)) and all(map(is_contiguous, dsts))
    with torch.no_grad():
        if foreach is not None and contiguous:
            foreach(dsts, srcs)
        else:
            for a, b in zip(dsts, srcs):
                a.copy_(b)


def tensor_batch(torch: Any, arrays: Sequence[DeviceArray]) -> Batch:
    """A torch engine's ``batch``: the tensors, and whether all are contiguous."""
    objs = [a.obj for a in arrays]
    return Batch(list(arrays), objs, all(map(torch.Tensor.is_contiguous, objs)))


def copy_tensor_batches(torch: Any, srcs: Batch, dsts: Batch) -> None:
    """A torch engine's ``copy_batches``: one ``foreach_copy`` of the prepared tensors
    (contiguity looked at again only where one side was not dense)."""
    foreach_copy(torch, dsts.native, srcs.native, (srcs.dense and dsts.dense) or None)


def clone_tensor_batch(torch: Any, srcs: Batch, engine: CopyEngine) -> Batch | None:
    """A torch engine's ``clones`` of a dense batch: one ``_foreach_clone`` (torch
    2.1 and later: each tensor allocated and copied in C++, the copies batched on
    the current stream), new tensors of the sources' contiguous layout; None where
    torch has no ``_foreach_clone``, a source is not contiguous or the clone raised
    (then ``empties_like`` and ``copy_batches``, whose errors are reported)."""
    clone = getattr(torch, "_foreach_clone", None)
    if clone is None or not srcs.dense or not srcs.native:
        return None
    try:
        with torch.no_grad():
            made = clone(srcs.native)
    except (RuntimeError, NotImplementedError):  # a dtype its kernel lacks: nothing made
        return None
    trusted = DeviceArray.trusted
    arrays = [trusted(t, a.shape, a.dtype, a.device, engine) for t, a in zip(made, srcs.arrays)]
    return Batch(arrays, made, True)


#: CPU tensors below this size are copied by torch in one batch; larger ones by the
#: C++ core, in parallel (faster than torch's copy for large tensors).
SMALL_HOST_BYTES = 1 << 20
_SMALL_HOST, _LARGE_HOST = ("cpu", "small"), ("cpu", "large")  # group keys of CPU pairs
_LAYOUT, _DTYPE, _SHAPE = attrgetter("layout"), attrgetter("dtype"), attrgetter("shape")
_DEVICE, _NBYTES = attrgetter("device"), attrgetter("nbytes")


def copy_tensors(torch: Any, srcs: list, dsts: list,
                 host_copy: Callable[[list, list], None]) -> bool:
    """The ``copy`` hook (``copy_state`` of two trees of tensors): when every pair is
    two strided tensors of one CUDA device, or two CPU tensors, of one shape and
    dtype (none a conjugate or negative view, no inference tensor or expanded tensor
    to write: the per-value path reports those), copies
    them in place and returns True; else False, nothing copied. CUDA pairs: one
    batched copy per device, on its current stream. CPU pairs: those under
    ``SMALL_HOST_BYTES`` in one batch, the others by ``host_copy(srcs, dsts)``.

    Each condition is checked for all tensors at once (``map`` over torch's own
    accessors, no Python loop per pair), each accessor once per tensor (the
    conjugate bit only where a dtype is complex: no other tensor carries it):
    about 1 us of Python per pair, against 20-40 us on the per-value path."""
    T = torch.Tensor
    if len(srcs) != len(dsts) or not all(map(isinstance, srcs, repeat(T))) \
            or not all(map(isinstance, dsts, repeat(T))):
        return False
    if not srcs:
        return True
    both = [*srcs, *dsts]
    dtypes = list(map(_DTYPE, srcs))
    devices = list(map(_DEVICE, srcs))
    if set(map(_LAYOUT, both)) != {torch.strided} or dtypes != list(map(_DTYPE, dsts)) \
            or list(map(_SHAPE, srcs)) != list(map(_SHAPE, dsts)) \
            or devices != list(map(_DEVICE, dsts)) \
            or (any(dt.is_complex for dt in set(dtypes)) and any(map(T.is_conj, both))) \
            or any(map(T.is_neg, both)) or any(map(T.is_inference, dsts)):
        return False
    first = devices[0]  # (one device: no hashing of each device object)
    places = {first} if devices.count(first) == len(devices) else set(devices)
    if any(dev.type not in ("cuda", "cpu") for dev in places):
        return False
    contiguous = all(map(T.is_contiguous, both))
    if not contiguous and any(shares_memory(d) for d in dsts if not d.is_contiguous()):
        return False
    for key, pick in _groups(srcs, devices, places).items():
        whole = len(pick) == len(srcs)
        group_s = srcs if whole else [srcs[i] for i in pick]
        group_d = dsts if whole else [dsts[i] for i in pick]
        if key == _LARGE_HOST:
            host_copy(group_s, group_d)
        else:
            foreach_copy(torch, group_d, group_s, contiguous or None)
    return True


def _groups(srcs: list, devices: list, places: set) -> dict[tuple, list[int]]:
    """The positions of ``copy_tensors``' pairs by copy: CUDA pairs by device, CPU pairs
    under ``SMALL_HOST_BYTES`` and the others (no Python loop per pair where every
    tensor is on one device)."""
    n = len(srcs)
    if len(places) == 1:
        dev = devices[0]
        if dev.type == "cuda":
            return {("cuda", dev.index): list(range(n))}
        large = [i for i, nb in enumerate(map(_NBYTES, srcs)) if nb >= SMALL_HOST_BYTES]
        if not large:
            return {_SMALL_HOST: list(range(n))}
        big = set(large)
        return {_SMALL_HOST: [i for i in range(n) if i not in big], _LARGE_HOST: large}
    groups: dict[tuple, list[int]] = {}
    for i, (dev, nb) in enumerate(zip(devices, map(_NBYTES, srcs))):
        key = ("cuda", dev.index) if dev.type == "cuda" else \
            _SMALL_HOST if nb < SMALL_HOST_BYTES else _LARGE_HOST
        groups.setdefault(key, []).append(i)
    return groups


def shares_memory(t: Any) -> bool:
    """Whether elements of a (non-contiguous) tensor may share memory (``expand``,
    ``as_strided``): ``device.copies.overlap`` of its layout."""
    size = t.element_size()
    return overlap(tuple(t.shape), tuple(st * size for st in t.stride()), size) is not None


_ENGINES: dict[str, TorchCudaEngine] = {}
_BY_INDEX: dict[int, tuple[TorchCudaEngine, str]] = {}  # device index -> (engine, "cuda:N")
_LOCK = threading.Lock()


def engine_for(torch: Any, device: Any) -> TorchCudaEngine:
    """The engine of a CUDA device (one per device and process)."""
    key = str(torch.device(device))
    with _LOCK:
        eng = _ENGINES.get(key)
        if eng is None:
            eng = _ENGINES[key] = TorchCudaEngine(torch, key)
        return eng


def _engine_of(torch: Any, t: Any) -> tuple[TorchCudaEngine, str]:
    """(engine, device name) of a CUDA tensor: one dict lookup on the hot path (a
    state holds thousands of tensors, each visited by every save and copy)."""
    index = t.get_device()
    found = _BY_INDEX.get(index)
    if found is None:
        eng = engine_for(torch, t.device)
        found = _BY_INDEX[index] = (eng, str(eng.device))
    return found


def device_array(torch: Any, t: Any) -> DeviceArray:
    """A CUDA tensor as a DeviceArray (detached; conjugation resolved)."""
    t = t.detach()
    if t.is_conj():
        t = t.resolve_conj()
    eng, name = _engine_of(torch, t)
    return DeviceArray.trusted(t, tuple(t.shape), numpy_dtype(torch, t.dtype), name, eng)
