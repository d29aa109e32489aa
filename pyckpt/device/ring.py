"""Staging through a ring of pinned memory smaller than the state
(``max_pinned_bytes``, issue 21).

A save given a pinned budget does not pin a host copy of the whole state. Its
large device values (at least one checksum chunk: the writers cut those into
pieces of their own) go through one ring buffer per copy engine, in the order
the writers need them: each value gets the next free slot of the ring, its
device-to-host copy is issued into that slot, and once it landed the writers
are told where its bytes are (``mark(i, slot)``). A slot is reused only after
the writers wrote every byte of the value that held it (``written(i)``), so
copies and writes stay pipelined while the pinned memory stays at the budget.
The small values (checksummed whole, written in runs of several values) are
staged as before, into one buffer sized for all of them (``buffers.py``).

``stage_ring`` returns once every value was copied off the device: from then on
the caller may change them. The ring stays in use until the writers finished;
its owner (a ``StagingBuffers``) is held until then.
"""

from __future__ import annotations

from collections import deque
from typing import Callable, Sequence

import numpy as np

from .array import DeviceArray
from .engine import CopyEngine, Ticket

__all__ = ["stage_ring", "RING_ALIGN"]

RING_ALIGN = 256  # slot alignment inside a ring (as in the staging buffers)


def _aligned(n: int) -> int:
    return (n + RING_ALIGN - 1) // RING_ALIGN * RING_ALIGN


class _Ring:
    """Slots of one ring buffer in use, oldest first: (item, begin, end)."""

    def __init__(self, buf: np.ndarray) -> None:
        self.buf = buf
        self.used: deque[tuple[int, int, int]] = deque()
        self.head = 0

    def place(self, n: int, free_oldest: Callable[[int], None]) -> int:
        """The offset of a free slot of ``n`` bytes at the head (wrapping to the start
        when the rest of the buffer is too short), after waiting for the oldest
        slots that overlap it to be written (``free_oldest(item)``)."""
        size = self.buf.nbytes
        if n > size:
            raise ValueError(f"a value of {n} bytes does not fit a ring of {size} bytes")
        begin = self.head if self.head + n <= size else 0
        end = begin + n
        while any(b < end and begin < e for _, b, e in self.used):
            item, _, _ = self.used.popleft()
            free_oldest(item)
        self.head = end
        return begin


def stage_ring(live: Sequence[DeviceArray], items: Sequence[int],
               rings: dict[CopyEngine, np.ndarray], *,
               mark: Callable[[int, np.ndarray], None],
               written: Callable[[int], None]) -> None:
    """Copies ``live[i]`` for each ``i`` of ``items`` (the writers' order) through the
    ring of its engine (module doc). ``mark(i, slot)`` tells the writers that value
    ``i`` is in ``slot``; ``written(i)`` returns once they wrote it (it raises when the
    write ended first). Returns once every copy landed (also after an error: no
    copy still writes into a ring afterwards)."""
    state = {eng: _Ring(buf) for eng, buf in rings.items()}
    pending: deque[tuple[int, np.ndarray, Ticket]] = deque()  # issued, not yet marked

    def land(upto: int | None = None) -> None:
        """Waits for and marks the issued copies in order, through item ``upto``."""
        while pending:
            i, slot, t = pending.popleft()
            t.wait()
            mark(i, slot)
            if i == upto:
                return

    def free(item: int) -> None:
        if any(i == item for i, _, _ in pending):
            land(item)
        written(item)

    try:
        for i in items:
            v = live[i]
            ring = state[v.engine]
            begin = ring.place(_aligned(v.nbytes), free)
            slot = ring.buf[begin:begin + v.nbytes].view(v.dtype).reshape(v.shape)
            ring.used.append((i, begin, begin + _aligned(v.nbytes)))
            pending.append((i, slot, v.engine.to_host([v], [slot])[0]))
            while pending and pending[0][2].done():  # keep the writers fed
                j, s, t = pending.popleft()
                t.wait()
                mark(j, s)
        land()
    finally:
        while pending:  # after an error: let the issued copies land first
            try:
                pending.popleft()[2].wait()
            except BaseException:  # noqa: BLE001 - the first error is the one raised
                pass
