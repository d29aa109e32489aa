"""The copy-engine interface: how pyckpt moves bytes between device memory and
host memory, device-agnostic so that the staging pipeline can be tested without
a GPU (``pyckpt.testing.late_copies`` completes copies late and out of order).

An engine serves the ``DeviceArray``s of one device family (torch CUDA in
``adapters/torch_device.py``; ``HostCopyEngine`` below for arrays that already
live in host memory). Contract:

- ``to_host(srcs, dsts)`` issues one copy per pair, device to host, each
  ordered after every piece of work the caller has already queued on the
  device (so the values are the ones of the moment of the call), and returns a
  ``Ticket`` per copy. Copies may complete in any order. Each ticket keeps its
  source and destination alive until it is done, so a dropped tensor stays
  valid until its copy landed.
- ``to_device(srcs, dsts)``: the same, host to device. Once its ticket is
  done, later work the caller queues on the device sees the new values.
  ``to_device_batch(srcs, dsts)``: the same with one ticket for the batch (by
  default a ``TicketGroup`` of ``to_device``'s tickets).
- ``copy(srcs, dsts)``: device to device, ordered with the caller's own work
  (no host synchronisation needed before or after). ``batch(arrays)`` prepares a
  list of arrays that a caller copies from or to again and again, unchanged (a
  kept walk's values while it holds, a snapshot's own buffers), and
  ``copy_batches(srcs, dsts)`` copies between two such lists as ``copy`` does,
  without looking at each array again (torch: the tensors and whether all are
  contiguous, found once). ``clones(batch)``: new arrays holding copies of a
  batch's arrays, as a batch (``empties_like`` then ``copy_batches``; torch:
  one ``_foreach_clone``, allocations made in C++).
- ``alloc_host(nbytes)``: a 1-D uint8 host buffer the engine copies fastest
  from and to (page-locked for CUDA); ``free_host`` gives it back.
- ``empty_like(src)``: a new DeviceArray of the same shape and dtype, on the
  same device.

Device snapshots (``device/snapshot.py``: a background save copies the state
into spare device memory and drains it to storage later):

- ``device_memory(device)``: (free, total) bytes of that device's memory, as the
  driver reports them; (0, 0) for an engine that keeps no snapshots in device
  memory (the default: the snapshot route is never taken).
- ``alloc_device(nbytes, like)`` / ``free_device(buf)``: a 1-D uint8
  DeviceArray on ``like``'s device, and giving it back;
  ``carve(buf, offset, like)``: a DeviceArray of ``like``'s shape and dtype
  that is the bytes of ``buf`` from ``offset`` on.
- ``snapshot(srcs, dsts)``: device-to-device copies ordered on the caller's
  current stream after the work already queued there (later work of the caller
  cannot change what is copied), without a host synchronisation; one Ticket,
  done once every copy landed.
- ``detached()``: a context in which ``to_host`` orders its copies after nothing
  the caller queues meanwhile (for copies out of a snapshot, whose ticket was
  waited for first): by default the same as outside it.

Destination host arrays are C-contiguous, of the source's shape and dtype.
"""

from __future__ import annotations

import contextlib
from abc import ABC, abstractmethod
from typing import Any, ContextManager, Sequence

import numpy as np

from .._native import core as _core
from .array import DeviceArray

__all__ = ["CopyEngine", "Ticket", "HostCopyEngine", "DoneTicket", "TicketGroup", "wait_all",
           "carve_array", "Batch"]


class Ticket(ABC):
    """One issued copy."""

    @abstractmethod
    def done(self) -> bool:
        """Whether the copy has landed (never blocks)."""

    @abstractmethod
    def wait(self) -> None:
        """Blocks until the copy landed; raises the copy's error."""


class DoneTicket(Ticket):
    """A copy that completed when it was issued."""

    def done(self) -> bool:
        return True

    def wait(self) -> None:
        return None


def wait_all(tickets: Sequence[Ticket]) -> None:
    """Waits for every ticket (in order); raises the first error."""
    for t in tickets:
        t.wait()


class TicketGroup(Ticket):
    """Several copies as one ticket: done once all are; ``wait`` waits for every
    one (also after an error) and raises the first error (``to_device_batch``; a
    save's device snapshot, ``saving``)."""

    __slots__ = ("tickets",)

    def __init__(self, tickets: Sequence[Ticket]) -> None:
        self.tickets = list(tickets)

    def done(self) -> bool:
        return all(t.done() for t in self.tickets)

    def wait(self) -> None:
        first: BaseException | None = None
        for t in self.tickets:
            try:
                t.wait()
            except BaseException as e:  # noqa: BLE001 - the first one is raised below
                first = first or e
        if first is not None:
            raise first


class Batch:
    """A list of one engine's DeviceArrays prepared for ``copy_batches``: the arrays,
    the engine's own objects for them (``native``) and whether every one is dense
    (C-contiguous: their one batched copy needs no look at each). Valid while the
    arrays are unchanged: the maker keeps it only as long as it knows they are."""

    __slots__ = ("arrays", "native", "dense", "__weakref__")

    def __init__(self, arrays: list[DeviceArray], native: list[Any], dense: bool) -> None:
        self.arrays = arrays
        self.native = native
        self.dense = dense


class CopyEngine(ABC):
    """Moves the bytes of one family of DeviceArrays (module doc)."""

    name = "engine"

    @abstractmethod
    def to_host(self, srcs: Sequence[DeviceArray], dsts: Sequence[np.ndarray]) -> list[Ticket]:
        """Device-to-host copies (module doc)."""

    @abstractmethod
    def to_device(self, srcs: Sequence[np.ndarray], dsts: Sequence[DeviceArray]) -> list[Ticket]:
        """Host-to-device copies (module doc)."""

    def to_device_batch(self, srcs: Sequence[np.ndarray], dsts: Sequence[DeviceArray]) -> Ticket:
        """``to_device`` of one batch of a load (``device/loading.py``) with one ticket
        for all its copies, done once every one landed (its ``wait`` raises the first
        error). An engine may override it to record one completion per batch instead
        of one per copy."""
        return TicketGroup(self.to_device(srcs, dsts))

    @abstractmethod
    def copy(self, srcs: Sequence[DeviceArray], dsts: Sequence[DeviceArray]) -> None:
        """Device-to-device copies, ordered with the caller's own device work."""

    def batch(self, arrays: Sequence[DeviceArray]) -> Batch:
        """``arrays`` (all of this engine) prepared for ``copy_batches`` (module doc);
        an engine finds here once what its ``copy`` would look up at every call."""
        return Batch(list(arrays), list(arrays), False)

    def copy_batches(self, srcs: Batch, dsts: Batch) -> None:
        """``copy(srcs.arrays, dsts.arrays)``: pairs of one shape and dtype."""
        self.copy(srcs.arrays, dsts.arrays)

    def clones(self, srcs: Batch) -> Batch:
        """New arrays (each new memory, C-contiguous) holding copies of ``srcs``'
        arrays, copied as ``copy`` copies, as a Batch (a snapshot's buffers)."""
        out = self.batch(self.empties_like(srcs.arrays))
        self.copy_batches(srcs, out)
        return out

    @abstractmethod
    def empty_like(self, src: DeviceArray) -> DeviceArray:
        """A new, uninitialised DeviceArray like ``src`` on its device."""

    def empties_like(self, srcs: Sequence[DeviceArray]) -> list[DeviceArray]:
        """``empty_like`` of each of ``srcs`` (all of this engine), in order. An engine
        may make them views of fewer allocations (one per dtype); each is new memory,
        shared with no other array."""
        return [self.empty_like(s) for s in srcs]

    def alloc_host(self, nbytes: int) -> np.ndarray:
        """A 1-D uint8 host buffer of ``nbytes`` (plain memory unless overridden)."""
        return np.empty(int(nbytes), dtype=np.uint8)

    def free_host(self, buf: np.ndarray) -> None:
        """Gives back a buffer of ``alloc_host`` (nothing to do for plain memory)."""
        return None

    def synchronize(self) -> None:
        """Waits until every copy issued so far has landed."""
        return None

    # -- device snapshots (module doc) -------------------------------------------------
    def device_memory(self, device: str) -> tuple[int, int]:
        """(free, total) bytes of ``device``'s memory; (0, 0): no snapshots there."""
        return (0, 0)

    def alloc_device(self, nbytes: int, like: DeviceArray) -> DeviceArray:
        """A 1-D uint8 DeviceArray of ``nbytes`` on ``like``'s device."""
        raise NotImplementedError(f"the {self.name} engine keeps no buffers in device memory")

    def free_device(self, buf: DeviceArray) -> None:
        """Gives back a buffer of ``alloc_device`` (once no copy uses it)."""
        return None

    def carve(self, buf: DeviceArray, offset: int, like: DeviceArray) -> DeviceArray:
        """The bytes of ``buf`` from ``offset`` on as a DeviceArray like ``like``."""
        raise NotImplementedError(f"the {self.name} engine keeps no buffers in device memory")

    def snapshot(self, srcs: Sequence[DeviceArray], dsts: Sequence[DeviceArray]) -> Ticket:
        """Device-to-device copies on the caller's stream, one ticket (module doc)."""
        self.copy(srcs, dsts)
        return DoneTicket()

    def detached(self) -> ContextManager[Any]:
        """A context for copies out of a snapshot (module doc)."""
        return contextlib.nullcontext()


class HostCopyEngine(CopyEngine):
    """The engine of DeviceArrays whose ``obj`` is a host numpy array: every copy
    completes when issued (parallel, in the C++ core). Used for CPU values routed
    through the device paths, and as the reference the test doubles follow."""

    name = "host"

    @staticmethod
    def wrap(arr: np.ndarray, device: str = "host") -> DeviceArray:
        return DeviceArray(arr, arr.shape, arr.dtype, device, _HOST)

    def to_host(self, srcs: Sequence[DeviceArray], dsts: Sequence[np.ndarray]) -> list[Ticket]:
        _core.copy_arrays([s.obj for s in srcs], list(dsts), 0)
        return [DoneTicket() for _ in srcs]

    def to_device(self, srcs: Sequence[np.ndarray], dsts: Sequence[DeviceArray]) -> list[Ticket]:
        _core.copy_arrays(list(srcs), [d.obj for d in dsts], 0)
        return [DoneTicket() for _ in srcs]

    def copy(self, srcs: Sequence[DeviceArray], dsts: Sequence[DeviceArray]) -> None:
        _core.copy_arrays([s.obj for s in srcs], [d.obj for d in dsts], 0)

    def empty_like(self, src: DeviceArray) -> DeviceArray:
        return DeviceArray(np.empty(src.shape, dtype=src.dtype), src.shape, src.dtype,
                           src.device, self)

    def alloc_device(self, nbytes: int, like: DeviceArray) -> DeviceArray:
        buf = np.empty(int(nbytes), dtype=np.uint8)
        return DeviceArray(buf, buf.shape, buf.dtype, like.device, self)

    def carve(self, buf: DeviceArray, offset: int, like: DeviceArray) -> DeviceArray:
        return DeviceArray(carve_array(buf.obj, offset, like), like.shape, like.dtype,
                           like.device, self)


def carve_array(buf: np.ndarray, offset: int, like: Any) -> np.ndarray:
    """The bytes of the 1-D uint8 array ``buf`` from ``offset`` on, as an array of
    ``like``'s shape and dtype (the host engines' ``carve``)."""
    n = int(np.prod(like.shape, dtype=np.int64)) * np.dtype(like.dtype).itemsize
    return buf[offset:offset + n].view(like.dtype).reshape(like.shape)


_HOST = HostCopyEngine()


def host_engine() -> HostCopyEngine:
    """The process's HostCopyEngine."""
    return _HOST


def group_by_engine(values: Sequence[Any]) -> dict[CopyEngine, list[int]]:
    """Indices of the DeviceArrays among ``values``, per engine (in order)."""
    out: dict[CopyEngine, list[int]] = {}
    for i, v in enumerate(values):
        if isinstance(v, DeviceArray):
            out.setdefault(v.engine, []).append(i)
    return out
