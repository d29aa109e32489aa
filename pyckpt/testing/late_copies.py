"""A copy engine for tests of the device paths without a GPU: its "device"
arrays are host numpy arrays, and every copy completes late and out of order,
on a thread of its own, like asynchronous copies on a device stream.

``LateCopyEngine.array(a)`` wraps a numpy array as a DeviceArray of this
engine. What it checks for the code under test:

- a copy's source is read when the copy *completes*, not when it is issued:
  code that lets the caller change a value before its ticket is done saves the
  changed value, and the tests see it;
- tickets complete in a shuffled order after a delay, so code that assumes
  completion in issue order, or never waits, reads unfilled buffers;
- ``pause()`` holds back every copy issued from then on (they land only after
  ``resume()``): a test sees what the code under test did before any copy
  landed, and code that waits for a copy in the wrong place hangs (its ticket
  times out after 30 s) instead of passing by luck;
- ``fail_on(key)`` makes the copy of the array with that key fail, raised by
  its ``Ticket.wait``;
- ``log`` records ("issue" | "land", direction, key) events in order
  (direction "d2h", "h2d", or "d2d" for ``snapshot``), and ("alloc", "pinned" |
  "device", nbytes) for each ``alloc_host`` / ``alloc_device``;
- device snapshots (``snapshot``): the source is read when the copy is issued
  (the copy is ordered on the caller's stream before any later change) but the
  destination is filled only when its ticket lands, late: code that reads a
  snapshot before waiting for its ticket reads an unfilled buffer. The device
  has ``device_free`` bytes free (None, the default: no device memory for
  snapshots, ``device_memory`` says (0, 0)) of ``device_total``.
"""

from __future__ import annotations

import random
import threading
import time
from typing import Any, Sequence

import numpy as np

from ..device.array import DeviceArray
from ..device.engine import CopyEngine, Ticket, TicketGroup, carve_array

__all__ = ["LateCopyEngine"]


class _LateTicket(Ticket):
    def __init__(self) -> None:
        self.event = threading.Event()
        self.error: BaseException | None = None

    def done(self) -> bool:
        return self.event.is_set()

    def wait(self) -> None:
        if not self.event.wait(30):
            raise TimeoutError("a LateCopyEngine copy did not land within 30 s")
        if self.error is not None:
            raise self.error


class LateCopyEngine(CopyEngine):
    """Copies land ``delay`` seconds (at most) after issue, shuffled (module doc)."""

    name = "late"

    def __init__(self, delay: float = 0.02, seed: int = 0,
                 device_free: int | None = None, device_total: int = 80 << 30) -> None:
        self.delay = delay
        self.device_free = device_free
        self.device_total = device_total
        self.device_allocs = 0
        self.rng = random.Random(seed)
        self.log: list[tuple[str, str, str]] = []
        self.failing: set[str] = set()
        self.host_allocs = 0
        self._lock = threading.Lock()
        self._threads: list[threading.Thread] = []
        self._gate = threading.Event()
        self._gate.set()

    def pause(self) -> None:
        """Copies issued from now on land only after ``resume()`` (module doc)."""
        self._gate.clear()

    def resume(self) -> None:
        self._gate.set()

    def array(self, a: np.ndarray, key: str = "", device: str = "late:0") -> DeviceArray:
        """``a`` as a DeviceArray of this engine (``key`` names it in the log)."""
        d = DeviceArray(a, a.shape, a.dtype, device, self)
        self._keys = getattr(self, "_keys", {})
        self._keys[id(a)] = key or f"#{len(self._keys)}"
        return d

    def key_of(self, d: DeviceArray) -> str:
        return getattr(self, "_keys", {}).get(id(d.obj), "?")

    def fail_on(self, key: str) -> None:
        self.failing.add(key)

    def _record(self, what: str, direction: str, key: str) -> None:
        with self._lock:
            self.log.append((what, direction, key))

    def _issue(self, pairs: list[tuple[Any, Any, str]], direction: str) -> list[Ticket]:
        tickets = [_LateTicket() for _ in pairs]
        for _, _, key in pairs:
            self._record("issue", direction, key)
        order = list(range(len(pairs)))
        self.rng.shuffle(order)

        gate = self._gate if not self._gate.is_set() else None

        def land() -> None:
            time.sleep(self.delay)
            if gate is not None:
                gate.wait(60)
            for i in order:
                src, dst, key = pairs[i]
                t = tickets[i]
                if key in self.failing:
                    t.error = RuntimeError(f"injected copy failure of {key!r}")
                else:
                    np.copyto(dst, src, casting="no")  # the source as it is *now*
                self._record("land", direction, key)
                t.event.set()

        th = threading.Thread(target=land, name="late-copies", daemon=True)
        th.start()
        self._threads.append(th)
        return list(tickets)

    def to_host(self, srcs: Sequence[DeviceArray], dsts: Sequence[np.ndarray]) -> list[Ticket]:
        return self._issue([(s.obj, d, self.key_of(s)) for s, d in zip(srcs, dsts)], "d2h")

    def to_device(self, srcs: Sequence[np.ndarray], dsts: Sequence[DeviceArray]) -> list[Ticket]:
        return self._issue([(s, d.obj, self.key_of(d)) for s, d in zip(srcs, dsts)], "h2d")

    def copy(self, srcs: Sequence[DeviceArray], dsts: Sequence[DeviceArray]) -> None:
        for s, d in zip(srcs, dsts):  # stream-ordered with the caller: done at once here
            np.copyto(d.obj, s.obj, casting="no")
            self._record("land", "d2d", self.key_of(d))

    def empty_like(self, src: DeviceArray) -> DeviceArray:
        return self.array(np.empty(src.shape, dtype=src.dtype), self.key_of(src) + "'",
                          src.device)

    def alloc_host(self, nbytes: int) -> np.ndarray:
        self.host_allocs += 1
        self._record("alloc", "pinned", str(int(nbytes)))
        return super().alloc_host(nbytes)

    # -- device snapshots --------------------------------------------------------------
    def device_memory(self, device: str) -> tuple[int, int]:
        if self.device_free is None:
            return (0, 0)
        return (self.device_free, self.device_total)

    def alloc_device(self, nbytes: int, like: DeviceArray) -> DeviceArray:
        self.device_allocs += 1
        self._record("alloc", "device", str(int(nbytes)))
        return self.array(np.empty(int(nbytes), dtype=np.uint8), f"slab{self.device_allocs}",
                          like.device)

    def carve(self, buf: DeviceArray, offset: int, like: DeviceArray) -> DeviceArray:
        return self.array(carve_array(buf.obj, offset, like), self.key_of(like) + "@snap",
                          like.device)

    def snapshot(self, srcs: Sequence[DeviceArray], dsts: Sequence[DeviceArray]) -> Ticket:
        # read now (stream-ordered before the caller's later work), landed late
        pairs = [(s.obj.copy(), d.obj, self.key_of(s)) for s, d in zip(srcs, dsts)]
        tickets = self._issue(pairs, "d2d")
        return TicketGroup(tickets)

    def synchronize(self) -> None:
        for th in list(self._threads):
            th.join(30)
