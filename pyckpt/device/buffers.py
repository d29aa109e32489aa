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

``StagingBuffers(pinned=False)`` is the same with plain memory (pre-touched,
``host_memory.touched``): what a first background save stages into while the
pinned pool is prepared in the background, so that it never waits for pinning.

``CheckpointManager`` keeps one StagingBuffers (released by ``close()``); plain
``pyckpt.save`` calls share a process-wide one whose pinned buffers are kept
(its host-value buffers are dropped after each save), freed by
``pyckpt.device.release_staging_memory()``.

A snapshot held on the host (``Checkpoint.snapshot(host=True)``) keeps its copies
of device values in a ``PinnedPool``: one page-locked buffer per engine, laid
out as above, freed when the pool is garbage-collected or handed over to the
next snapshot taken ``into`` it.
"""

from __future__ import annotations

import threading
import time
import weakref
from typing import Any, Callable, Sequence

import numpy as np

from .array import DeviceArray
from .budgets import check_budget
from .engine import CopyEngine
from .host_memory import touched
from .loading import bounce_bytes, release_bounce_buffers
from .snapshot import release_shared

__all__ = ["StagingBuffers", "PinnedPool", "lease_shared", "on_release", "pinned_memory_kept",
           "release_staging_memory", "warm_shared"]

_ALIGN = 256
_SLACK = 64 << 20  # a pinned buffer larger than needed by more than this is re-allocated


def _aligned(n: int) -> int:
    return (n + _ALIGN - 1) // _ALIGN * _ALIGN


def _human(n: int) -> str:
    return f"{n >> 20} MiB" if n >= 1 << 20 else f"{n} bytes"


def _engine_bytes(srcs: Sequence[Any]) -> dict[CopyEngine, int]:
    """Bytes the DeviceArrays among ``srcs`` take in one buffer per engine (each value
    aligned), engines in order of first appearance."""
    need: dict[CopyEngine, int] = {}
    for s in srcs:
        if isinstance(s, DeviceArray):
            need[s.engine] = need.get(s.engine, 0) + _aligned(s.nbytes)
    return need


def _fits(slab: np.ndarray | None, need: int, slack: int = _SLACK) -> bool:
    """Whether a buffer can be reused for ``need`` bytes: large enough, and not larger
    by more than ``slack``."""
    return slab is not None and need <= slab.nbytes <= need + slack


def _carve(slabs: dict[CopyEngine, np.ndarray], srcs: Sequence[Any]) -> list[np.ndarray | None]:
    """Per source: for a DeviceArray, an array of its shape and dtype in the next aligned
    slice of its engine's buffer (``_engine_bytes`` sized them); None for others."""
    offsets = dict.fromkeys(slabs, 0)
    out: list[np.ndarray | None] = []
    for s in srcs:
        if not isinstance(s, DeviceArray):
            out.append(None)
            continue
        off = offsets[s.engine]
        offsets[s.engine] = off + _aligned(s.nbytes)
        out.append(slabs[s.engine][off:off + s.nbytes].view(s.dtype).reshape(s.shape))
    return out


class StagingBuffers:
    """Reusable host buffers for staging one state (module doc). One save at a
    time uses them (``hold``/``unhold``).

    With ``max_pinned_bytes`` the pinned memory per copy engine stays within that
    budget: the large device values are staged through a ring (``ring.py``) that
    ``get`` sizes to what the small ones leave of the budget, and names in
    ``ring_items`` (item index -> its engine's ring buffer).

    ``pinned=False``: the engines' buffers are plain (pre-touched) host memory
    instead (``pinned_bytes`` then counts them all the same)."""

    def __init__(self, max_pinned_bytes: int | None = None, *, pinned: bool = True) -> None:
        self.max_pinned_bytes = check_budget(max_pinned_bytes)
        self.pinned = pinned
        self._host: dict[str, np.ndarray] = {}
        self._slabs: dict[CopyEngine, np.ndarray] = {}
        self._rings: dict[CopyEngine, np.ndarray] = {}
        #: item index -> the ring buffer it is staged through (``get`` with a budget)
        self.ring_items: dict[int, np.ndarray] = {}
        self._lock = threading.Lock()
        #: seconds the last (re)allocation of pinned buffers took (pinning cost)
        self.last_alloc_seconds = 0.0
        self.allocations = 0

    @property
    def pinned_bytes(self) -> int:
        """Bytes of engine (pinned) host buffers held."""
        return sum(s.nbytes for s in self._slabs.values()) + \
            sum(r.nbytes for r in self._rings.values())

    @property
    def host_bytes(self) -> int:
        """Bytes of plain host buffers held."""
        return sum(a.nbytes for a in self._host.values())

    def ready_for(self, srcs: Sequence[Any]) -> bool:
        """Whether ``get`` of ``srcs`` would allocate no pinned memory for their device
        values (with a budget: True, its ring is small and allocated at once)."""
        if self.max_pinned_bytes is not None:
            return True
        need = _engine_bytes(srcs)
        return all(_fits(self._slabs.get(eng), n) for eng, n in need.items())

    def hold(self, block: bool = True) -> bool:
        """Reserves the buffers for one save, until ``unhold()`` (after its last
        write); False when ``block`` is False and another save holds them."""
        return self._lock.acquire(blocking=block)

    def unhold(self) -> None:
        """Ends the reservation of ``hold``."""
        self._lock.release()

    def get(self, keys: Sequence[str], srcs: Sequence[Any], *,
            copy_host: bool = True, ring_from: int | None = None) -> list[np.ndarray]:
        """A C-contiguous host array of each source's shape and dtype, reused from
        the previous call where possible (``hold()`` them until the save ends).
        With ``copy_host`` False, a source that is a host array is its own
        buffer (a blocking save writes it directly).

        With a budget, the device values of at least ``ring_from`` bytes get a
        placeholder at the start of their engine's ring (``ring_items`` names them;
        the save stages them with ``ring.stage_ring``); None (a save that cannot
        stage through a ring) raises ValueError when there are device values."""
        self.ring_items = {}
        ringed: set[int] = set()
        if self.max_pinned_bytes is not None and any(isinstance(s, DeviceArray) for s in srcs):
            if ring_from is None:
                raise ValueError("max_pinned_bytes bounds the staging of single-process saves "
                                 "to local files only; this save (to an object store, of "
                                 "several workers, incremental or of non-native byte order) "
                                 "stages the whole state: leave max_pinned_bytes unset")
            ringed = {i for i, s in enumerate(srcs)
                      if isinstance(s, DeviceArray) and s.nbytes >= ring_from}
        small = [None if i in ringed else s for i, s in enumerate(srcs)]
        need = _engine_bytes(small)
        # within a budget the small values' buffer is exactly their size: the ring
        # gets the rest (a larger buffer left by an earlier save is re-allocated)
        self._fit(need, 0 if self.max_pinned_bytes is not None else _SLACK)
        self._fit_rings(keys, srcs, ringed, need, ring_from or 0)
        pinned = _carve(self._slabs, small)
        for i in ringed:
            s = srcs[i]
            ring = self._rings[s.engine]
            self.ring_items[i] = ring
            pinned[i] = ring[:s.nbytes].view(s.dtype).reshape(s.shape)
        out: list[np.ndarray] = []
        host: dict[str, np.ndarray] = {}
        for k, s, p in zip(keys, srcs, pinned):
            if p is not None:
                out.append(p)
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

    def _fit_rings(self, keys: Sequence[str], srcs: Sequence[Any], ringed: set[int],
                   small: dict[CopyEngine, int], ring_from: int) -> None:
        """One ring per engine of the ``ringed`` values: what the budget leaves after
        the small values' buffer; ValueError naming the value when one does not fit."""
        budget = self.max_pinned_bytes or 0
        largest: dict[CopyEngine, int] = {}
        for i in ringed:
            eng = srcs[i].engine
            if largest.get(eng) is None or srcs[i].nbytes > srcs[largest[eng]].nbytes:
                largest[eng] = i
        for eng in [e for e in self._rings if e not in largest]:
            self._free(eng, self._rings.pop(eng))
        for eng, i in largest.items():
            size = (budget - small.get(eng, 0)) // _ALIGN * _ALIGN
            if _aligned(srcs[i].nbytes) > size:
                raise ValueError(
                    f"max_pinned_bytes={budget} is too small for this state: tensor "
                    f"{keys[i]!r} takes {srcs[i].nbytes} bytes and the values under "
                    f"{_human(ring_from)} take {small.get(eng, 0)} bytes of pinned staging; "
                    f"give at least {_aligned(srcs[i].nbytes) + small.get(eng, 0)} bytes")
            self._refit(self._rings, eng, size, 0)

    def _fit(self, need: dict[CopyEngine, int], slack: int = _SLACK) -> None:
        for eng in [e for e in self._slabs if e not in need]:
            self._free(eng, self._slabs.pop(eng))
        for eng, n in need.items():
            self._refit(self._slabs, eng, n, slack)

    def _refit(self, held: dict[CopyEngine, np.ndarray], eng: CopyEngine, n: int,
               slack: int) -> None:
        """Keeps ``held[eng]`` if it fits ``n`` bytes (``_fits``), else pins a new one."""
        buf = held.get(eng)
        if _fits(buf, n, slack):
            return
        if buf is not None:
            self._free(eng, held.pop(eng))
        t0 = time.perf_counter()
        held[eng] = eng.alloc_host(n) if self.pinned else touched(n)
        self.last_alloc_seconds = time.perf_counter() - t0
        self.allocations += 1

    def _free(self, eng: CopyEngine, buf: np.ndarray) -> None:
        if self.pinned:
            eng.free_host(buf)

    def release(self) -> None:
        """Frees every buffer (the next save allocates again); waits for a save
        that holds them."""
        with self._lock:
            for eng, slab in self._slabs.items():
                self._free(eng, slab)
            for eng, ring in self._rings.items():
                self._free(eng, ring)
            self._slabs.clear()
            self._rings.clear()
            self.ring_items = {}
            self._host.clear()


class PinnedPool:
    """Page-locked host buffers, one per copy engine, owned by one holder (a
    ``Snapshot``): each is given back (``engine.free_host``) when the pool is
    garbage-collected, unless a newer pool took it over (``place(donor=)``)."""

    def __init__(self) -> None:
        #: engine -> its page-locked buffer
        self.slabs: dict[CopyEngine, np.ndarray] = {}
        self._free: dict[CopyEngine, Any] = {}  # engine -> weakref.finalize of its buffer

    def place(self, srcs: Sequence[DeviceArray],
              donor: "PinnedPool | None" = None) -> list[np.ndarray]:
        """A host array of each source's shape and dtype, in aligned slices of one
        page-locked buffer per engine held by this pool: ``donor``'s buffer of that
        engine where it fits (handed over), else a new one."""
        need = _engine_bytes(srcs)
        slabs = {eng: self._slab(eng, n, donor) for eng, n in need.items()}
        out = [a for a in _carve(slabs, srcs) if a is not None]
        assert len(out) == len(srcs)  # every source is a DeviceArray
        return out

    def _slab(self, eng: CopyEngine, need: int, donor: "PinnedPool | None") -> np.ndarray:
        """A page-locked buffer of at least ``need`` bytes of ``eng``, owned from now on
        (an empty array, not owned, for 0 bytes)."""
        if need == 0:
            return np.empty(0, dtype=np.uint8)
        if donor is not None and _fits(donor.slabs.get(eng), need):
            slab = donor._give(eng)
            assert slab is not None
        else:
            slab = eng.alloc_host(need)
        self._own(eng, slab)
        return slab

    def _own(self, eng: CopyEngine, buf: np.ndarray) -> None:
        """Takes ownership of a page-locked buffer of ``eng`` (given back with the pool)."""
        self.slabs[eng] = buf
        self._free[eng] = weakref.finalize(self, eng.free_host, buf)

    def _give(self, eng: CopyEngine) -> np.ndarray | None:
        """Hands the page-locked buffer of ``eng`` over to another pool."""
        buf = self.slabs.pop(eng, None)
        fin = self._free.pop(eng, None)
        if fin is not None:
            fin.detach()
        return buf


_SHARED = StagingBuffers()


def lease_shared(max_pinned_bytes: int | None = None) -> tuple[StagingBuffers, Callable[[], None]]:
    """Buffers for one plain save (within ``max_pinned_bytes`` of pinned memory per
    engine, if given), and what to call once it ended: the process-wide
    StagingBuffers (kept for the next save), or, while another save holds those, a
    private set freed at the end."""
    budget = check_budget(max_pinned_bytes)
    if _SHARED.hold(block=False):
        _SHARED.max_pinned_bytes = budget  # its buffers are re-fitted by get()

        def done() -> None:
            _SHARED._host.clear()  # plain host copies are not kept; pinned buffers are
            _SHARED.unhold()
        return _SHARED, done
    private = StagingBuffers(budget)
    return private, private.release


def warm_shared(keys: Sequence[str], srcs: Sequence[Any]) -> bool:
    """Allocates (pins) the process-wide staging buffers for the device values among
    ``srcs``, for the next plain ``pyckpt.save`` without a pinned budget (run in a
    background thread while a save stages into plain memory); False, doing nothing,
    while a save holds them."""
    if not _SHARED.hold(block=False):
        return False
    try:
        _SHARED.max_pinned_bytes = None
        _SHARED.get(keys, srcs, copy_host=False)
        return True
    finally:
        _SHARED._host.clear()
        _SHARED.unhold()


def pinned_memory_kept() -> int:
    """Bytes of page-locked host memory pyckpt keeps between calls: the staging
    buffers of plain ``pyckpt.save`` calls and the bounce buffers of loads into
    device memory (a manager's and a snapshot's are not counted: they are freed
    with them)."""
    return _SHARED.pinned_bytes + bounce_bytes()


#: what upper layers keep between calls and free with ``release_staging_memory``
#: (``on_release``): the kept walks of in-memory copies (graph/walk_cache.py)
_RELEASERS: list[Callable[[], None]] = []


def on_release(free: Callable[[], None]) -> None:
    """Registers ``free`` to run at every ``release_staging_memory()`` (once per
    function, in registration order)."""
    if free not in _RELEASERS:
        _RELEASERS.append(free)


def release_staging_memory() -> None:
    """Frees the pinned staging buffers and the device snapshot buffers
    (``snapshot.py``) that plain ``pyckpt.save`` calls keep for the next save, the
    bounce buffers kept by loads into device memory (a manager's staging and
    snapshot buffers are freed by its ``close()``), and what the upper layers
    registered with ``on_release`` (the kept walks of ``snapshot()``,
    ``restore(snapshot)`` and ``copy_state``, which hold the tensors they copy)."""
    release_shared()
    _SHARED.release()
    release_bounce_buffers()
    for free in list(_RELEASERS):
        free()
