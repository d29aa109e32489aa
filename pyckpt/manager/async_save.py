"""Background saves for ``CheckpointManager.save(blocking=False)``.

The caller's thread copies every tracked value into staging buffers (a
parallel copy in the C++ core) and returns; one background thread writes the
checkpoint from those buffers, commits it and applies retention. Values
mutated after ``save`` returns therefore never reach that checkpoint. On local
disks the writing starts while the copy is still running (``StagedSave``):
each tensor is written as soon as it is staged, so an async save costs about
as much disk time as a blocking one.

Host memory: one staging copy of the state (``device.StagingBuffers``: plain
memory for host values, one pinned buffer per device for device values, whose
copies run on the device's copy stream). The buffers are kept and reused by
the next async save (no allocation, no pinning, no first-touch page faults)
and freed by ``close()``; ``warm()`` allocates them ahead of the first save.
At most one save is in flight: a new save first waits for the previous one.
With ``max_async_bytes`` set, a state larger than that is saved blocking.

With several workers the work run here is one worker's part of the save
(``workers/background.py``: write, publish its result through the store, and on
rank 0 commit): it never issues a collective on the job's communicator
(docs/PROTOCOL.md section 6b). A node-local save (a multi-worker tiered
manager) runs its collectives here on a communicator made for background
threads (``Communicator.background``, docs/PROTOCOL.md section 7b).
"""

from __future__ import annotations

import threading
from typing import Any, Callable

import numpy as np

from ..device.buffers import StagingBuffers


class AsyncSaver:
    """Runs one background save at a time and keeps its staging buffers for the next;
    the error of a background save is re-raised by ``wait``."""

    def __init__(self) -> None:
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None
        self._lock = threading.Lock()
        self.staging = StagingBuffers()
        self._warming: threading.Thread | None = None

    def buffers(self, keys: list[str], srcs: list[Any]) -> list[np.ndarray]:
        """Staging arrays for the given values (host arrays, DeviceArrays), reused
        from the previous save when shapes and dtypes match."""
        self._join_warming()
        return self.staging.get(keys, srcs)

    def warm(self, keys: list[str], srcs: list[Any]) -> None:
        """Allocates (and pins) the staging buffers in the background, so that the
        first async save does not pay for it."""
        self._warming = threading.Thread(target=self.staging.get, args=(keys, srcs),
                                         name="pyckpt-warm-staging", daemon=True)
        self._warming.start()

    def _join_warming(self) -> None:
        if self._warming is not None:
            self._warming.join()
            self._warming = None

    def release(self) -> None:
        """Frees the staging buffers (after waiting for the in-flight save)."""
        self._join_warming()
        self.staging.release()

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

    def join(self, timeout: float | None = None) -> None:
        """Waits (at most ``timeout`` seconds) for the in-flight save without taking its
        error (``wait`` raises it)."""
        t = self._thread
        if t is not None and t is not threading.current_thread():
            t.join(timeout)

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
