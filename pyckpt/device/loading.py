"""Reads that land in device memory: verified reads into pinned bounce buffers,
then host-to-device copies that overlap the next reads.

``fill_targets`` is the one place where a load tells device targets from host
ones. Host targets (arrays, ShardedArray blocks) are read directly. The
DeviceArrays of each copy engine are loaded by a pipeline:

- they are cut into batches of consecutive targets of at most ``batch`` bytes
  (a larger target is a batch of its own);
- reader threads (``readers`` of them) take the batches in turn and read each,
  verified (the C++ core, GIL released, in parallel), into the next of
  ``buffers`` pinned bounce buffers of ``batch`` bytes (a batch larger than that:
  into the next of two buffers of the largest target's size), once the copies
  out of the batch that last used that buffer have landed;
- the calling thread issues each batch's host-to-device copies, in batch order,
  as soon as it has been read (``CopyEngine.to_device_batch``: one ticket per
  batch), and goes on with the next one: reads of later batches run while the
  earlier ones' copies fly, up to ``buffers`` batches deep. The readers run in
  copies of the caller's context (``contextvars``: the progress counter).

So a load runs at about the slower of the read and the copies, not their sum.
Every target is filled from verified bytes only: a batch is copied once its read
returned without error. When anything fails (a read, a copy, the caller's
thread interrupted), no batch is issued after it, the readers are stopped and
joined, and every issued copy has landed before the error is raised: no copy
still reads a bounce buffer that is reused or given back.

Settings, read at each load (environment; defaults in brackets):
``PYCKPT_LOAD_BATCH_MB`` [64], ``PYCKPT_LOAD_BUFFERS`` [4],
``PYCKPT_LOAD_READERS`` [2]. There are no more buffers than batches, and a load
of fewer bytes than a batch takes one buffer of its size, so a load pins at most
``buffers x batch`` bytes (256 MiB by default), plus 2 x the largest target when
a target is larger than a batch. The buffers are kept
for the next load (``bounce_bytes``) and freed by
``pyckpt.device.release_staging_memory()``; a load that runs while another one
holds them uses buffers of its own, freed when it returns.

It returns once every copy has landed: the targets hold the loaded values
(same storage, same device) and later work on the device sees them.
"""

from __future__ import annotations

import contextvars
import os
import threading
from typing import Any, Callable, NamedTuple, Sequence

import numpy as np

from .array import DeviceArray
from .engine import CopyEngine, Ticket, group_by_engine

__all__ = ["fill_targets", "bounce_bytes", "release_bounce_buffers", "LoadSettings",
           "load_settings", "plan_buffers", "BufferPlan"]

_ALIGN = 256
#: defaults of the settings (module doc); the environment overrides them
BATCH_BYTES = 64 << 20
BUFFERS = 4
READERS = 2

ReadHost = Callable[[Sequence[int], Sequence[Any]], None]


class LoadSettings(NamedTuple):
    """How deep a load into device memory runs (module doc)."""

    batch: int    # bytes per batch (a larger target is a batch of its own)
    buffers: int  # pinned bounce buffers (>= 1): batches read or in flight at once
    readers: int  # reader threads (>= 1)


def _env(name: str, default: int, scale: int = 1) -> int:
    raw = os.environ.get(name)
    if raw is None or raw.strip() == "":
        return default
    try:
        value = int(float(raw) * scale)
    except ValueError:
        raise ValueError(f"{name}={raw!r}: a positive number expected") from None
    if value < 1:
        raise ValueError(f"{name}={raw!r}: a positive number expected")
    return value


def load_settings() -> LoadSettings:
    """The settings of the next load: the environment's, else the defaults."""
    return LoadSettings(_env("PYCKPT_LOAD_BATCH_MB", BATCH_BYTES, 1 << 20),
                        _env("PYCKPT_LOAD_BUFFERS", BUFFERS), _env("PYCKPT_LOAD_READERS", READERS))


class _Bounce:
    """The reusable bounce buffers of one engine (module doc)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.bufs: list[np.ndarray] = []
        self.engine: CopyEngine | None = None

    def ensure(self, engine: CopyEngine, sizes: Sequence[int]) -> list[np.ndarray]:
        """Buffers of at least ``sizes[i]`` bytes: the kept ones when they are enough,
        else new ones of exactly those sizes."""
        kept = self.bufs
        if len(kept) >= len(sizes) and all(b.nbytes >= n for b, n in zip(kept, sizes)):
            return kept[:len(sizes)]
        self.free()
        self.engine = engine
        for n in sizes:
            self.bufs.append(engine.alloc_host(n))
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


def _batches(aligned: Sequence[int], cap: int) -> list[list[int]]:
    """Consecutive positions whose (aligned) sizes fit in ``cap`` bytes (a larger one
    alone)."""
    out: list[list[int]] = []
    cur: list[int] = []
    used = 0
    for k, a in enumerate(aligned):
        if cur and used + a > cap:
            out.append(cur)
            cur, used = [], 0
        cur.append(k)
        used += a
    if cur:
        out.append(cur)
    return out


class BufferPlan(NamedTuple):
    """How one load uses its bounce buffers (module doc)."""

    batches: list[list[int]]  # positions of the targets, per batch
    sizes: list[int]          # bytes of each buffer: the batch buffers, then the large ones
    slot: list[int]           # per batch: the buffer it is read into
    prev: list[int]           # per batch: the batch read into that buffer before (-1: none)


def plan_buffers(sizes: Sequence[int], settings: LoadSettings) -> BufferPlan:
    """The batches and buffers of a load of targets of ``sizes`` bytes (module doc):
    at most ``settings.buffers`` buffers of one batch, and at most 2 of the largest
    target for the batches larger than that (a target of their own)."""
    aligned = [(n + _ALIGN - 1) // _ALIGN * _ALIGN for n in sizes]
    cap = max(min(settings.batch, sum(aligned)), _ALIGN)
    batches = _batches(aligned, cap)
    nbytes = [sum(aligned[p] for p in b) for b in batches]
    large = [n > cap for n in nbytes]
    n_large = sum(large)
    n_small = len(batches) - n_large
    small_count = min(settings.buffers, n_small)
    large_count = min(2 if settings.buffers > 1 else 1, n_large)
    bufs = [cap] * small_count + [max((n for n, big in zip(nbytes, large) if big), default=0)] \
        * large_count
    slot: list[int] = []
    prev: list[int] = []
    last: dict[int, int] = {}  # buffer -> the last batch read into it
    seen = [0, 0]              # batches so far, of each kind
    for big in large:
        kind = int(big)
        s = (small_count + seen[1] % large_count) if big else seen[0] % small_count
        seen[kind] += 1
        slot.append(s)
        prev.append(last.get(s, -1))
        last[s] = len(slot) - 1
    return BufferPlan(batches, bufs, slot, prev)


class _Pipeline:
    """One engine's load (module doc): readers fill the buffers, the calling thread
    issues the copies; ``run`` returns once every copy landed or raises after every
    issued copy landed."""

    def __init__(self, engine: CopyEngine, read_host: ReadHost, indices: Sequence[int],
                 dsts: Sequence[DeviceArray], bufs: list[np.ndarray], plan: BufferPlan,
                 readers: int) -> None:
        self.engine, self.read_host, self.indices, self.dsts = engine, read_host, indices, dsts
        self.bufs, self.plan, self.batches = bufs, plan, plan.batches
        self.nreaders = max(1, min(readers, len(self.batches)))
        self.cond = threading.Condition()
        self.next = 0                                   # the next batch a reader takes
        self.filled: dict[int, Any] = {}                # batch -> its views, or its error
        self.tickets: dict[int, Ticket] = {}            # batch -> the ticket of its copies
        self.stop = False

    def views(self, k: int) -> list[np.ndarray]:
        buf = self.bufs[self.plan.slot[k]]
        out, off = [], 0
        for p in self.batches[k]:
            d = self.dsts[p]
            out.append(buf[off:off + d.nbytes].view(d.dtype).reshape(d.shape))
            off += _aligned(d.nbytes)
        return out

    def read(self, k: int) -> list[np.ndarray]:
        """Batch k read, verified, into its buffer (once the batch before it there landed)."""
        views = self.views(k)
        self.read_host([self.indices[p] for p in self.batches[k]], views)
        return views

    def reader(self) -> None:
        while True:
            with self.cond:
                if self.stop or self.next >= len(self.batches):
                    return
                k = self.next
                self.next += 1
                prev = self.plan.prev[k]  # earlier than k: issued in time (batch order)
                while not self.stop and prev >= 0 and prev not in self.tickets:
                    self.cond.wait()
                if self.stop:
                    return
                before = self.tickets.get(prev)
            try:
                if before is not None:
                    before.wait()  # the copies out of this buffer have landed
                got: Any = self.read(k)
            except BaseException as e:  # noqa: BLE001 - handed to the issuing thread
                got = e
            with self.cond:
                self.filled[k] = got
                self.cond.notify_all()
            if isinstance(got, BaseException):
                return

    def issue(self, k: int, views: list[np.ndarray]) -> None:
        t = self.engine.to_device_batch(views, [self.dsts[p] for p in self.batches[k]])
        with self.cond:
            self.tickets[k] = t
            self.cond.notify_all()

    def run(self) -> None:
        if len(self.batches) == 1:  # nothing to overlap: no thread
            try:
                self.issue(0, self.read(0))
                self.tickets[0].wait()
            finally:
                self.drain()
            return
        # each reader runs in a copy of the caller's context (progress counter...)
        threads = [threading.Thread(target=contextvars.copy_context().run, args=(self.reader,),
                                    name=f"pyckpt-load-{i}", daemon=True)
                   for i in range(self.nreaders)]
        try:
            for th in threads:
                th.start()
            for k in range(len(self.batches)):
                with self.cond:
                    while k not in self.filled:
                        self.cond.wait()
                    got = self.filled.pop(k)
                if isinstance(got, BaseException):
                    raise got
                self.issue(k, got)
            for k in range(len(self.batches)):
                self.tickets[k].wait()
        finally:
            with self.cond:
                self.stop = True
                self.cond.notify_all()
            for th in threads:
                if th.ident is not None:
                    th.join()
            self.drain()

    def drain(self) -> None:
        """Waits for every issued copy (errors ignored: the first one is being raised)."""
        for t in list(self.tickets.values()):
            try:
                t.wait()
            except BaseException:  # noqa: BLE001 - see above
                pass


def _to_device(engine: CopyEngine, read_host: ReadHost, indices: Sequence[int],
               dsts: Sequence[DeviceArray]) -> None:
    settings = load_settings()
    plan = plan_buffers([d.nbytes for d in dsts], settings)
    with _BOUNCE_LOCK:
        bounce = _BOUNCE.setdefault(engine, _Bounce())
    private = not bounce.lock.acquire(blocking=False)
    if private:  # another load holds the kept buffers: use our own
        bounce = _Bounce()
    try:
        bufs = bounce.ensure(engine, plan.sizes)
        _Pipeline(engine, read_host, indices, dsts, bufs, plan, settings.readers).run()
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
