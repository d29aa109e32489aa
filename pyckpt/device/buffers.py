"""Host staging buffers, allocated once and reused by every later save of the
same state.

A save that must copy values aside (``blocking=False``) or out of device
memory (any save of a DeviceArray) takes its buffers from a ``StagingBuffers``:
host values get plain arrays; the DeviceArrays of one copy engine get slices of
one buffer from ``engine.alloc_host`` (page-locked for CUDA; pinning one large
buffer costs far less than pinning many). The next save with the same keys,
shapes and dtypes gets the same buffers back: no allocation, no pinning, no
page faults.

Bounds: the pinned buffer of an engine is the state's device bytes plus 256-byte
alignment per value (far below 64 MiB for any real model); it is re-allocated
smaller when the state shrinks by more than 64 MiB. ``release()`` frees it all.

``CheckpointManager`` keeps one StagingBuffers (released by ``close()``); plain
``pyckpt.save`` calls share a process-wide one whose pinned buffers are kept
(its host-value buffers are dropped after each save), freed by
``pyckpt.device.release_staging_memory()``.
"""

from __future__ import annotations

import threading
import time
from typing import Any, Callable, Sequence

import numpy as np

from .array import DeviceArray
from .engine import CopyEngine
from .loading import release_bounce_buffers

__all__ = ["StagingBuffers", "lease_shared", "release_staging_memory"]

_ALIGN = 256
_SLACK = 64 << 20  # a pinned buffer larger than needed by more than this is re-allocated


def _aligned(n: int) -> int:
    return (n + _ALIGN - 1) // _ALIGN * _ALIGN


class StagingBuffers:
    """Reusable host buffers for staging one state (module doc). One save at a
    time uses them (``hold``/``unhold``)."""

    def __init__(self) -> None:
        self._host: dict[str, np.ndarray] = {}
        self._slabs: dict[CopyEngine, np.ndarray] = {}
        self._lock = threading.Lock()
        #: seconds the last (re)allocation of pinned buffers took (pinning cost)
        self.last_alloc_seconds = 0.0
        self.allocations = 0

    @property
    def pinned_bytes(self) -> int:
        """Bytes of engine (pinned) host buffers held."""
        return sum(s.nbytes for s in self._slabs.values())

    @property
    def host_bytes(self) -> int:
        """Bytes of plain host buffers held."""
        return sum(a.nbytes for a in self._host.values())

    def hold(self, block: bool = True) -> bool:
        """Reserves the buffers for one save, until ``unhold()`` (after its last
        write); False when ``block`` is False and another save holds them."""
        return self._lock.acquire(blocking=block)

    def unhold(self) -> None:
        """Ends the reservation of ``hold``."""
        self._lock.release()

    def get(self, keys: Sequence[str], srcs: Sequence[Any], *,
            copy_host: bool = True) -> list[np.ndarray]:
        """A C-contiguous host array of each source's shape and dtype, reused from
        the previous call where possible (``hold()`` them until the save ends).
        With ``copy_host`` False, a source that is a host array is its own
        buffer (a blocking save writes it directly)."""
        need: dict[CopyEngine, int] = {}
        for s in srcs:
            if isinstance(s, DeviceArray):
                need[s.engine] = need.get(s.engine, 0) + _aligned(s.nbytes)
        self._fit(need)
        offsets = dict.fromkeys(need, 0)
        out: list[np.ndarray] = []
        host: dict[str, np.ndarray] = {}
        for k, s in zip(keys, srcs):
            if isinstance(s, DeviceArray):
                off = offsets[s.engine]
                offsets[s.engine] = off + _aligned(s.nbytes)
                raw = self._slabs[s.engine][off:off + s.nbytes]
                out.append(raw.view(s.dtype).reshape(s.shape))
                continue
            if not copy_host:
                out.append(s)
                continue
            buf = self._host.get(k)
            if buf is None or buf.shape != s.shape or buf.dtype != s.dtype:
                buf = np.empty(s.shape, dtype=s.dtype)
            host[k] = buf
            out.append(buf)
        if copy_host:
            self._host = host
        return out

    def _fit(self, need: dict[CopyEngine, int]) -> None:
        for eng in [e for e in self._slabs if e not in need]:
            eng.free_host(self._slabs.pop(eng))
        for eng, n in need.items():
            slab = self._slabs.get(eng)
            if slab is not None and n <= slab.nbytes <= n + _SLACK:
                continue
            if slab is not None:
                eng.free_host(self._slabs.pop(eng))
            t0 = time.perf_counter()
            self._slabs[eng] = eng.alloc_host(n)
            self.last_alloc_seconds = time.perf_counter() - t0
            self.allocations += 1

    def release(self) -> None:
        """Frees every buffer (the next save allocates again); waits for a save
        that holds them."""
        with self._lock:
            for eng, slab in self._slabs.items():
                eng.free_host(slab)
            self._slabs.clear()
            self._host.clear()


_SHARED = StagingBuffers()


def lease_shared() -> tuple[StagingBuffers, Callable[[], None]]:
    """Buffers for one plain save, and what to call once it ended: the process-wide
    StagingBuffers (kept for the next save), or, while another save holds those, a
    private set freed at the end."""
    if _SHARED.hold(block=False):
        def done() -> None:
            _SHARED._host.clear()  # plain host copies are not kept; pinned buffers are
            _SHARED.unhold()
        return _SHARED, done
    private = StagingBuffers()
    return private, private.release


def release_staging_memory() -> None:
    """Frees the pinned staging buffers that plain ``pyckpt.save`` calls keep for the
    next save, and the bounce buffers kept by loads into device memory (a
    manager's staging buffers are freed by its ``close()``)."""
    _SHARED.release()
    release_bounce_buffers()
