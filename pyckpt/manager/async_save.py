"""Background saves for ``CheckpointManager.save(blocking=False)``.

The caller's thread copies every tracked value into staging buffers (a
parallel copy in the C++ core) and returns; one background thread writes the
checkpoint from those buffers, commits it and applies retention. Values
mutated after ``save`` returns therefore never reach that checkpoint. On local
disks the writing starts while the copy is still running (``StagedSave``):
each tensor is written as soon as it is staged, so an async save costs about
as much disk time as a blocking one.

Host memory: one staging copy of the state. The buffers are kept and reused
by the next async save (no allocation, no first-touch page faults), and at
most one save is in flight: a new save first waits for the previous one.
With ``max_async_bytes`` set, a state larger than that is saved blocking.
"""

from __future__ import annotations

import threading
from typing import Any, Callable

import numpy as np



class AsyncSaver:
    """Runs one background save at a time and keeps its staging buffers for the next;
    the error of a background save is re-raised by ``wait``."""

    def __init__(self) -> None:
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None
        self._buffers: dict[str, np.ndarray] = {}
        self._lock = threading.Lock()

    def buffers(self, keys: list[str], srcs: list[np.ndarray]) -> list[np.ndarray]:
        """Staging arrays for the given tensors, reused from the previous save when
        shapes and dtypes match."""
        old = self._buffers
        out = []
        for k, src in zip(keys, srcs):
            buf = old.get(k)
            if buf is None or buf.shape != src.shape or buf.dtype != src.dtype:
                buf = np.empty(src.shape, dtype=src.dtype)
            out.append(buf)
        self._buffers = dict(zip(keys, out))
        return out

    def start(self, work: Callable[[], None]) -> None:
        """Runs ``work`` in a daemon thread, keeping its exception for ``wait``. Call
        ``wait`` first: one save is in flight at most."""
        def run() -> None:
            try:
                work()
            except BaseException as e:  # surfaced at the next call on the manager
                with self._lock:
                    self._error = e

        self._thread = threading.Thread(target=run, name="pyckpt-async-save", daemon=True)
        self._thread.start()

    def busy(self) -> bool:
        """Whether a background save is running."""
        return self._thread is not None and self._thread.is_alive()

    def wait(self) -> None:
        """Waits for the in-flight save; re-raises its error (once)."""
        t = self._thread
        if t is not None:
            t.join()
            self._thread = None
        with self._lock:
            err, self._error = self._error, None
        if err is not None:
            raise err
