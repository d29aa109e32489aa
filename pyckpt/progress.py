"""Progress of long saves and loads: ``progress=callback(bytes_done, bytes_total)``.

The C++ core adds the bytes it has written or read to a counter; a small
monitor thread in Python reads it every ``interval`` seconds and calls the
callback (so the callback never runs on the core's worker threads and may
hold the GIL as long as it likes). The last call always reports
``done == total``.
"""

from __future__ import annotations

import contextlib
import contextvars
import threading
from typing import Callable, Iterator

from ._native import core as _core

ProgressFn = Callable[[int, int], object]

_CURRENT: contextvars.ContextVar["_core.ProgressCounter | None"] = contextvars.ContextVar(
    "pyckpt_progress", default=None)


def counter() -> "_core.ProgressCounter | None":
    """The counter of the operation running in this context (None when nobody listens)."""
    return _CURRENT.get()


def add(n: int) -> None:
    c = _CURRENT.get()
    if c is not None:
        c.add(n)


@contextlib.contextmanager
def reporting(callback: ProgressFn | None, total: int, interval: float = 0.1) -> Iterator[None]:
    if callback is None:
        yield
        return
    c = _core.ProgressCounter()
    token = _CURRENT.set(c)
    stop = threading.Event()

    def monitor() -> None:
        last = -1
        while not stop.wait(interval):
            v = min(c.value, total)
            if v != last:
                callback(v, total)
                last = v

    t = threading.Thread(target=monitor, name="pyckpt-progress", daemon=True)
    t.start()
    ok = False
    try:
        yield
        ok = True
    finally:
        stop.set()
        t.join()
        _CURRENT.reset(token)
        if ok:
            callback(total, total)
