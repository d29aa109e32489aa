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
- ``copy(srcs, dsts)``: device to device, ordered with the caller's own work
  (no host synchronisation needed before or after).
- ``alloc_host(nbytes)``: a 1-D uint8 host buffer the engine copies fastest
  from and to (page-locked for CUDA); ``free_host`` gives it back.
- ``empty_like(src)``: a new DeviceArray of the same shape and dtype, on the
  same device.

Destination host arrays are C-contiguous, of the source's shape and dtype.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any, Sequence

import numpy as np

from .._native import core as _core
from .array import DeviceArray

__all__ = ["CopyEngine", "Ticket", "HostCopyEngine", "DoneTicket", "wait_all"]


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


class CopyEngine(ABC):
    """Moves the bytes of one family of DeviceArrays (module doc)."""

    name = "engine"

    @abstractmethod
    def to_host(self, srcs: Sequence[DeviceArray], dsts: Sequence[np.ndarray]) -> list[Ticket]:
        """Device-to-host copies (module doc)."""

    @abstractmethod
    def to_device(self, srcs: Sequence[np.ndarray], dsts: Sequence[DeviceArray]) -> list[Ticket]:
        """Host-to-device copies (module doc)."""

    @abstractmethod
    def copy(self, srcs: Sequence[DeviceArray], dsts: Sequence[DeviceArray]) -> None:
        """Device-to-device copies, ordered with the caller's own device work."""

    @abstractmethod
    def empty_like(self, src: DeviceArray) -> DeviceArray:
        """A new, uninitialised DeviceArray like ``src`` on its device."""

    def alloc_host(self, nbytes: int) -> np.ndarray:
        """A 1-D uint8 host buffer of ``nbytes`` (plain memory unless overridden)."""
        return np.empty(int(nbytes), dtype=np.uint8)

    def free_host(self, buf: np.ndarray) -> None:
        """Gives back a buffer of ``alloc_host`` (nothing to do for plain memory)."""
        return None

    def synchronize(self) -> None:
        """Waits until every copy issued so far has landed."""
        return None


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
