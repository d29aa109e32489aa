"""Moving a batch of values between any mix of host arrays and values in device
memory (``DeviceArray``): ``copy_values``, the one routine that copies
state in memory (``Checkpoint.snapshot()``, ``restore(snapshot)``,
``pyckpt.copy_state``, graph/snapshot.py).

Copies between two values of one device run on that device, ordered with the
caller's own work (``CopyEngine.copy``), never crossing PCIe; copies between
host and device go through the device's copy engine and are waited for; host
values are copied in parallel by the C++ core.
"""

from __future__ import annotations

from itertools import repeat
from operator import attrgetter
from typing import Any, Sequence, Union, cast

import numpy as np

from .._dtypes import finish_byte_order, refuse_objects, source_order_view
from .._native import core as _core
from .array import DeviceArray
from .engine import CopyEngine, Ticket

__all__ = ["Value", "copy_values", "one_engine", "unwritable", "overlap", "host_copy"]

#: A value as the copy routines see it: a host array or an array in device memory.
Value = Union[np.ndarray, DeviceArray]

_ENGINE, _DTYPE = attrgetter("engine"), attrgetter("dtype")


def unwritable(arr: np.ndarray) -> str | None:
    """Why a host array cannot be filled in place, or None: read-only, or elements
    that share memory (``overlap``)."""
    flags = arr.flags
    if not flags.writeable:
        return "read-only"
    if flags.c_contiguous or flags.f_contiguous or arr.size == 0:
        return None
    return overlap(arr.shape, arr.strides, arr.itemsize)


def overlap(shape: Sequence[int], strides: Sequence[int], itemsize: int) -> str | None:
    """Why elements of a layout (strides in bytes) may share memory, or None: a stride
    of 0 (as ``broadcast_to`` / torch's ``expand`` make: each element would take the
    last value written), or strides this cannot prove free of overlap (an exotic
    ``as_strided``). Each dimension, smallest stride first, must step past all the
    bytes the smaller ones span."""
    extent = itemsize
    for stride, n in sorted((abs(st), n) for st, n in zip(strides, shape) if n > 1):
        if stride == 0:
            return ("overlapping: its elements share memory (a stride of 0, as expand() "
                    "or broadcast_to() make); fill a contiguous copy, then copy it over")
        if stride < extent:
            return (f"possibly overlapping (strides {tuple(strides)} for shape "
                    f"{tuple(shape)}); fill a contiguous copy, then copy it over")
        extent += stride * (n - 1)
    return None


def _wait_all(tickets: Sequence[Ticket]) -> None:
    """Waits for every ticket, then raises the first error (no copy is left in flight)."""
    first: BaseException | None = None
    for t in tickets:
        try:
            t.wait()
        except BaseException as e:  # noqa: BLE001 - re-raised below, after the others landed
            if first is None:
                first = e
    if first is not None:
        raise first


def host_copy(srcs: list[np.ndarray], dsts: list[np.ndarray], threads: int = 0) -> None:
    """Host to host, in parallel (C++ core); a destination in the other byte order is
    filled through a view of the source's dtype, then swapped in place."""
    if not srcs:
        return
    views, swap = [], []
    for s, d in zip(srcs, dsts):
        view, swapped = source_order_view(d, s.dtype)  # the copy is of raw bytes
        if swapped:
            swap.append(d)
        views.append(view)
    _core.copy_arrays(list(srcs), views, threads)
    finish_byte_order(swap)


class _Routes:
    """The copies of one ``copy_values`` call, sorted by route (its doc)."""

    def __init__(self) -> None:
        self.host_s: list[np.ndarray] = []
        self.host_d: list[np.ndarray] = []
        self.d2d: dict[CopyEngine, tuple[list[DeviceArray], list[DeviceArray]]] = {}
        self.d2h: dict[CopyEngine, tuple[list[DeviceArray], list[np.ndarray]]] = {}
        self.h2d: dict[CopyEngine, tuple[list[np.ndarray], list[DeviceArray]]] = {}
        self.bounce: list[tuple[np.ndarray, Value]] = []  # (landed host copy, final destination)

    def add(self, s: Value, d: Value) -> None:
        """Routes the copy of ``s`` into ``d``."""
        if isinstance(s, DeviceArray):
            self._from_device(s, d)
        elif isinstance(d, DeviceArray):
            _append(self.h2d, d.engine, _for_device(s, d), d)
        else:  # bytes copied by the core: references would be duplicated, not counted
            refuse_objects(s.dtype)
            refuse_objects(d.dtype)
            self.host_s.append(s)
            self.host_d.append(d)

    def _from_device(self, s: DeviceArray, d: Value) -> None:
        if isinstance(d, DeviceArray) and d.engine is s.engine and d.dtype == s.dtype:
            _append(self.d2d, s.engine, s, d)
            return
        tmp: np.ndarray
        if isinstance(d, np.ndarray) and d.dtype == s.dtype and d.flags.c_contiguous:
            tmp = d  # straight into the destination
        else:
            tmp = np.empty(s.shape, dtype=s.dtype)
            self.bounce.append((tmp, d))
        _append(self.d2h, s.engine, s, tmp)

    def run(self, threads: int) -> None:
        """Issues every copy, then waits for those that land late (the bounced ones
        are only in their host copies after this)."""
        tickets: list[Ticket] = []
        try:
            for eng, (ds, hs) in self.d2h.items():
                tickets.extend(eng.to_host(ds, hs))
            for eng, (hs, ds) in self.h2d.items():
                tickets.extend(eng.to_device(hs, ds))
            for eng, (a, b) in self.d2d.items():
                eng.copy(a, b)
            host_copy(self.host_s, self.host_d, threads)
        finally:
            _wait_all(tickets)


def _append(routes: dict[CopyEngine, tuple[list, list]], eng: CopyEngine, s: Any, d: Any) -> None:
    pair = routes.setdefault(eng, ([], []))
    pair[0].append(s)
    pair[1].append(d)


def _forward(bounce: list[tuple[np.ndarray, Value]], threads: int) -> None:
    """Copies each landed host copy on to its final destination."""
    if not bounce:
        return
    second: list[Ticket] = []
    back_s: list[np.ndarray] = []
    back_d: list[np.ndarray] = []
    try:
        for tmp, d in bounce:
            if isinstance(d, DeviceArray):
                second.extend(d.engine.to_device([_for_device(tmp, d)], [d]))
            else:
                back_s.append(tmp)
                back_d.append(d)
        host_copy(back_s, back_d, threads)
    finally:
        _wait_all(second)


def copy_values(srcs: Sequence[Value], dsts: Sequence[Value], threads: int = 0) -> None:
    """Copies each of ``srcs`` into the matching destination, in place. Each is a host
    array or a DeviceArray; each pair has the same shape and the same dtype up to byte
    order (the caller checked). Returns once every copy is done, or, for copies
    between two DeviceArrays of one engine, once they are queued on the device
    ordered with the caller's work (later work sees the values).

    - device to device (same engine and dtype): one ``engine.copy`` batch per engine;
    - device to host: ``engine.to_host`` (through a temporary when the destination is
      not C-contiguous or not in the source's dtype), waited for;
    - host to device: ``engine.to_device`` (from a C-contiguous copy in the
      destination's dtype where needed), waited for;
    - device to device across engines: to host memory, then to the other device;
    - host to host: in parallel in the C++ core.

    A destination DeviceArray is always written on its device, never replaced.

    A batch of DeviceArrays of one engine, each pair of one dtype (a snapshot or a
    restore of device state), is checked for all values at once and handed to
    ``engine.copy`` as it is, without sorting value by value.
    """
    eng = one_engine(srcs, dsts)
    if eng is not None:  # (every value a DeviceArray: one_engine checked)
        eng.copy(cast(Sequence[DeviceArray], srcs), cast(Sequence[DeviceArray], dsts))
        return
    routes = _Routes()
    for s, d in zip(srcs, dsts):
        routes.add(s, d)
    routes.run(threads)
    _forward(routes.bounce, threads)


def one_engine(srcs: Sequence[Value], dsts: Sequence[Value]) -> CopyEngine | None:
    """The engine of every value when all are DeviceArrays of one engine and each pair
    has one dtype (``copy_values``' device-to-device route for all of them), else None."""
    if not srcs or len(srcs) != len(dsts) or not all(map(isinstance, srcs, repeat(DeviceArray))) \
            or not all(map(isinstance, dsts, repeat(DeviceArray))):
        return None
    engines = set(map(_ENGINE, srcs))
    engines.update(map(_ENGINE, dsts))
    if len(engines) != 1 or list(map(_DTYPE, srcs)) != list(map(_DTYPE, dsts)):
        return None
    return engines.pop()


def _for_device(host: np.ndarray, dst: DeviceArray) -> np.ndarray:
    """``host`` as a C-contiguous array of ``dst``'s dtype (itself where it is one)."""
    if host.dtype == dst.dtype and host.flags.c_contiguous:
        return host
    return np.ascontiguousarray(host, dtype=dst.dtype)  # converts the byte order too
