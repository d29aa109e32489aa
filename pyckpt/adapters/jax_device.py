"""JAX arrays on accelerators as ``DeviceArray``s: saves issue every
``copy_to_host_async`` at once (the transfers overlap each other and the disk
writes of earlier values), then copy each landed host value into its staging
buffer. JAX arrays are immutable, so a save never races with the program.

Loads make new arrays (``jax_support.restore``): each array to restore is a
``DeviceArray`` whose ``obj`` is a ``Landing`` (the sharding the new array must
have), filled like any device target through the bounce buffers of
``device/loading.py``. ``JaxEngine.to_device`` puts each filled batch on its
devices in one ``jax.device_put`` call that reads the bounce buffer in place
(an array that lives in host memory gets a copy of its own first: JAX would
share the buffer's memory), and its tickets wait until the new arrays are
ready, so a buffer is refilled only once nothing reads it.

That bounds the bytes in flight to the load's bounce buffers. XLA's GPU client
stages a copy from pageable host memory through a pool of page-locked memory
that it grows on first use and keeps (``BufferFromHostBuffer``), so putting
every array of a state at once grew that pool to the whole state inside the
first restore (pinning runs at 1-2 GB/s: issue 40 measured 1.14 s for the
first restore of 2.15 GB, 0.15 s for the next). On an accelerator the bounce
buffers (touched, kept for the next load) are also registered with the JAX
client (``dma_map``): a client that checks for mapped memory copies from them
directly, without staging. Nothing is compiled on the way (no per-shape work).

There are no device-to-device copies: a JAX array cannot be filled in place.
"""

from __future__ import annotations

import sys
import threading
from typing import Any, Sequence

import numpy as np

from ..device.array import DeviceArray
from ..device.engine import CopyEngine, Ticket
from ..device.host_memory import touched

__all__ = ["JaxEngine", "Landing", "device_array", "host_array", "in_host_memory", "landing",
           "on_accelerator"]

_ALIGN = 64  # the alignment at which JAX's CPU client shares a host array's memory


class _HostCopyTicket(Ticket):
    __slots__ = ("src", "dst", "landed")

    def __init__(self, src: Any, dst: np.ndarray) -> None:
        self.src, self.dst, self.landed = src, dst, False

    def done(self) -> bool:
        return self.landed

    def wait(self) -> None:
        if not self.landed:
            np.copyto(self.dst, np.asarray(self.src), casting="no")
            self.landed, self.src = True, None


class JaxEngine(CopyEngine):
    """Copies of JAX arrays to the host, and new JAX arrays made from host buffers
    for a restore's ``Landing`` targets (module doc)."""

    name = "jax"

    def to_host(self, srcs: Sequence[DeviceArray], dsts: Sequence[np.ndarray]) -> list[Ticket]:
        for s in srcs:
            s.obj.copy_to_host_async()
        return [_HostCopyTicket(s.obj, d) for s, d in zip(srcs, dsts)]

    def _immutable(self) -> TypeError:
        return TypeError("JAX arrays are immutable and cannot be filled in place: load "
                         "with pyckpt.adapters.jax_support.restore(path, target)")

    def to_device(self, srcs: Sequence[np.ndarray], dsts: Sequence[DeviceArray]) -> list[Ticket]:
        """Makes the new array of every ``Landing`` target from its host source, all
        in one ``jax.device_put`` (module doc); TypeError for a JAX array itself."""
        landings = [d.obj for d in dsts]
        if not all(isinstance(o, Landing) for o in landings):
            raise self._immutable()
        if not landings:
            return []
        import jax  # a Landing exists only where jax was imported

        shardings = [o.sharding for o in landings]
        # JAX shares the memory of a host array put in host memory (whatever may_alias
        # says, as of jax 0.10): those get memory of their own, not the reused buffer's
        arrays = jax.device_put([_own_copy(a) if in_host_memory(s) else a
                                 for a, s in zip(srcs, shardings)], shardings)
        for o, a in zip(landings, arrays):
            o.array = a
        return [_ReadyTicket(a) for a in arrays]

    def copy(self, srcs: Sequence[DeviceArray], dsts: Sequence[DeviceArray]) -> None:
        raise self._immutable()

    def empty_like(self, src: DeviceArray) -> DeviceArray:
        raise self._immutable()

    def alloc_host(self, nbytes: int) -> np.ndarray:
        """A host buffer whose pages were touched in parallel (``touched``), then
        registered with the JAX client of the default accelerator (``dma_map``: XLA
        then copies from it without staging) when there is one and it takes it;
        plain memory otherwise."""
        buf = touched(int(nbytes))
        client = _accelerator_client()
        if client is not None and buf.nbytes:
            try:
                client.dma_map(buf.ctypes.data, buf.nbytes)
            except Exception:  # noqa: BLE001 - a client without DMA mapping: plain memory
                client = None
        if client is not None:
            with _MAPPED_LOCK:
                _MAPPED[buf.ctypes.data] = client
        return buf

    def free_host(self, buf: np.ndarray) -> None:
        """Unregisters a buffer of ``alloc_host`` (its memory goes with its last view)."""
        with _MAPPED_LOCK:
            client = _MAPPED.pop(buf.ctypes.data, None)
        if client is not None:
            try:
                client.dma_unmap(buf.ctypes.data)
            except Exception:  # noqa: BLE001 - the client is gone: nothing is mapped
                pass


class _ReadyTicket(Ticket):
    """One new array of ``to_device``: landed once the array is ready."""

    __slots__ = ("array",)

    def __init__(self, array: Any) -> None:
        self.array = array

    def done(self) -> bool:
        return bool(self.array.is_ready())

    def wait(self) -> None:
        self.array.block_until_ready()


class Landing:
    """Where a restored JAX array goes (the target of a load, module doc): the
    ``sharding`` it must have; ``array`` is the new array once it is made."""

    __slots__ = ("sharding", "array")

    def __init__(self, sharding: Any) -> None:
        self.sharding = sharding
        self.array: Any = None


# buffers of alloc_host registered with a JAX client: address -> client
_MAPPED: dict[int, Any] = {}
_MAPPED_LOCK = threading.Lock()


def _accelerator_client() -> Any:
    """The JAX client of the default backend when it is an accelerator, else None."""
    jax = sys.modules.get("jax")
    if jax is None:
        return None
    try:
        device = jax.devices()[0]
    except (RuntimeError, IndexError):
        return None
    return None if device.platform == "cpu" else getattr(device, "client", None)


def in_host_memory(sharding: Any) -> bool:
    """Whether arrays of ``sharding`` live in host memory (a CPU device, or a host
    memory kind of an accelerator): there ``device_put`` may keep using the host
    array it was given instead of copying it."""
    kind = getattr(sharding, "memory_kind", None)
    if kind is not None and kind != "device":
        return True
    return any(d.platform == "cpu" for d in sharding.device_set)


_ENGINE = JaxEngine()


def on_accelerator(arr: Any) -> bool:
    """Whether a jax.Array has a shard outside host memory (GPU, TPU)."""
    try:
        return any(d.platform != "cpu" for d in arr.devices())
    except (AttributeError, RuntimeError):
        return False


def host_array(shape: tuple[int, ...], dtype: Any) -> np.ndarray:
    """A new host array starting at a 64-byte boundary: ``jax.device_put`` to a CPU
    device takes such an array over instead of copying it (numpy's own large arrays
    start 16 bytes into a page, which JAX's CPU client copies)."""
    dt = np.dtype(dtype)
    nbytes = int(np.prod(shape, dtype=np.int64)) * dt.itemsize
    raw = np.empty(nbytes + _ALIGN, dtype=np.uint8)
    start = -raw.ctypes.data % _ALIGN
    return raw[start:start + nbytes].view(dt).reshape(shape)


def _own_copy(arr: np.ndarray) -> np.ndarray:
    out = host_array(arr.shape, arr.dtype)
    np.copyto(out, arr, casting="no")
    return out


def _device_name(arr: Any) -> str:
    return ",".join(sorted(str(d) for d in arr.devices()))


def device_array(arr: Any) -> DeviceArray:
    """A jax.Array as a DeviceArray of the JAX engine."""
    return DeviceArray(arr, tuple(arr.shape), np.dtype(arr.dtype), _device_name(arr), _ENGINE)


def landing(like: Any) -> DeviceArray:
    """A load target standing for a new array with the shape, dtype and sharding of
    the jax.Array ``like`` (its ``obj``: a ``Landing``, module doc)."""
    return DeviceArray(Landing(like.sharding), tuple(like.shape), np.dtype(like.dtype),
                       _device_name(like), _ENGINE)
