"""Reads that land in device memory: verified reads into pinned bounce buffers,
then host-to-device copies that overlap the next reads.

``fill_targets`` is the one place where a load tells device targets from host
ones. Host targets (arrays, ShardedArray blocks) are read directly. The
DeviceArrays of each copy engine are read in batches: batch k is read (in
parallel, verified, GIL released) into one of two bounce buffers while the
copies of batch k-1 fly to the device from the other. Each bounce buffer holds
at least 64 MiB and at least the largest target, so extra pinned memory is
about 2 x max(64 MiB, largest tensor); the buffers are kept for the next load
and freed by ``pyckpt.device.release_staging_memory()``.

It returns once every copy has landed: the targets hold the loaded values
(same storage, same device) and later work on the device sees them.
"""

from __future__ import annotations

import threading
from typing import Any, Callable, Sequence

import numpy as np

from .array import DeviceArray
from .engine import CopyEngine, Ticket, group_by_engine, wait_all

__all__ = ["fill_targets", "bounce_bytes", "release_bounce_buffers"]

_MIN_BOUNCE = 64 << 20
_ALIGN = 256

ReadHost = Callable[[Sequence[int], Sequence[Any]], None]


class _Bounce:
    """Two reusable host buffers of one engine (module doc)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.bufs: list[np.ndarray] = []
        self.engine: CopyEngine | None = None

    def ensure(self, engine: CopyEngine, size: int) -> list[np.ndarray]:
        if self.bufs and self.bufs[0].nbytes >= size:
            return self.bufs
        self.free()
        self.engine = engine
        self.bufs = [engine.alloc_host(size) for _ in range(2)]
        return self.bufs

    def free(self) -> None:
        if self.engine is not None:
            for b in self.bufs:
                self.engine.free_host(b)
        self.bufs, self.engine = [], None


_BOUNCE: dict[CopyEngine, _Bounce] = {}
_BOUNCE_LOCK = threading.Lock()


def bounce_bytes() -> int:
    """Bytes of pinned bounce buffers kept for the next load into device memory."""
    with _BOUNCE_LOCK:
        return sum(b.nbytes for bo in _BOUNCE.values() for b in bo.bufs)


def release_bounce_buffers() -> None:
    """Frees the kept bounce buffers (waits for loads using them)."""
    with _BOUNCE_LOCK:
        items = list(_BOUNCE.values())
        _BOUNCE.clear()
    for b in items:
        with b.lock:
            b.free()


def _aligned(n: int) -> int:
    return (n + _ALIGN - 1) // _ALIGN * _ALIGN


def _batches(sizes: Sequence[int], cap: int) -> list[list[int]]:
    """Consecutive positions whose aligned sizes fit in ``cap`` bytes."""
    out: list[list[int]] = []
    cur: list[int] = []
    used = 0
    for k, n in enumerate(sizes):
        a = _aligned(n)
        if cur and used + a > cap:
            out.append(cur)
            cur, used = [], 0
        cur.append(k)
        used += a
    if cur:
        out.append(cur)
    return out


def _to_device(engine: CopyEngine, read_host: ReadHost, indices: Sequence[int],
               dsts: Sequence[DeviceArray]) -> None:
    size = max([_MIN_BOUNCE] + [_aligned(d.nbytes) for d in dsts])
    with _BOUNCE_LOCK:
        bounce = _BOUNCE.setdefault(engine, _Bounce())
    private = not bounce.lock.acquire(blocking=False)
    if private:  # another load holds the kept buffers: use our own
        bounce = _Bounce()
    try:
        bufs = bounce.ensure(engine, size)
        in_flight: list[list[Ticket]] = [[], []]
        try:
            for k, batch in enumerate(_batches([d.nbytes for d in dsts], size)):
                slot = k % 2
                wait_all(in_flight[slot])  # the copies from this buffer have landed
                in_flight[slot] = []
                views, off = [], 0
                for p in batch:
                    d = dsts[p]
                    views.append(bufs[slot][off:off + d.nbytes].view(d.dtype).reshape(d.shape))
                    off += _aligned(d.nbytes)
                read_host([indices[p] for p in batch], views)
                in_flight[slot] = engine.to_device(views, [dsts[p] for p in batch])
        finally:
            for tickets in in_flight:  # no copy may still read a buffer we give back
                for t in tickets:
                    try:
                        t.wait()
                    except BaseException:  # noqa: BLE001 - re-raised below via wait_all
                        pass
        for tickets in in_flight:
            wait_all(tickets)
    finally:
        if private:
            bounce.free()
        else:
            bounce.lock.release()


def fill_targets(read_host: ReadHost, indices: Sequence[int], dsts: Sequence[Any]) -> None:
    """Fills every target (module doc); ``read_host(indices, host_targets)`` is the
    format's verified read into host arrays and ShardedArray blocks."""
    groups = group_by_engine(dsts)
    if not groups:
        read_host(indices, dsts)
        return
    host = [k for k, d in enumerate(dsts) if not isinstance(d, DeviceArray)]
    if host:
        read_host([indices[k] for k in host], [dsts[k] for k in host])
    for engine, ks in groups.items():
        _to_device(engine, read_host, [indices[k] for k in ks], [dsts[k] for k in ks])
