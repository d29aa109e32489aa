"""The writer lease of a manager directory (docs/PROTOCOL.md, "One writer").

Two managers writing one directory would interleave their retention and
delete each other's checkpoints, so a manager takes a lease before its first
write: the file ``pyckpt-manager.lock`` names its owner (a random id, host,
pid) and a heartbeat time refreshed on every save. Another manager refuses
to write while the lease is held by an owner that is alive: on the same host
its pid must still run; elsewhere its heartbeat must be younger than
``lease_seconds``. Before each commit the owner re-reads the file and stops
with ConcurrentWriterError if the lease was taken over.
"""

from __future__ import annotations

import json
import os
import socket
import time
import uuid
import weakref
from typing import Callable

from ..engine.attempts import pid_alive
from ..errors import ConcurrentWriterError
from ..storage import Store

LOCK_NAME = "pyckpt-manager.lock"

# Leases held by managers of this process: owner id -> lease. A lease whose
# manager was garbage-collected (or closed) is gone from here, so a new
# manager in the same process may take the directory over.
_HELD: "weakref.WeakValueDictionary[str, WriterLease]" = weakref.WeakValueDictionary()


class WriterLease:
    """The writer lease of one manager directory (module doc): ``acquire`` takes it,
    ``refresh`` checks and renews it, ``release`` gives it up. ``lease_seconds``
    bounds how long a holder on another host counts as alive without a heartbeat."""

    def __init__(self, store: Store, directory: str, lease_seconds: float = 600.0,
                 clock: Callable[[], float] = time.time) -> None:
        self.store = store
        self.path = store.join(directory, LOCK_NAME)
        self.lease_seconds = lease_seconds
        self.clock = clock
        self.owner = uuid.uuid4().hex
        self.host = socket.gethostname()
        self.held = False

    def _read(self) -> dict | None:
        try:
            doc = json.loads(self.store.read_bytes(self.path).decode("utf-8"))
        except (FileNotFoundError, OSError, UnicodeDecodeError, ValueError):
            return None
        return doc if isinstance(doc, dict) else None

    def _alive(self, doc: dict) -> bool:
        if doc.get("host") == self.host and isinstance(doc.get("pid"), int):
            if doc["pid"] == os.getpid():  # another manager of this very process
                other = _HELD.get(str(doc.get("owner")))
                return other is not None and other.held
            return pid_alive(doc["pid"])
        beat = doc.get("heartbeat")
        return isinstance(beat, (int, float)) and self.clock() - beat < self.lease_seconds

    def _write(self) -> None:
        doc = {"owner": self.owner, "host": self.host, "pid": os.getpid(),
               "heartbeat": self.clock()}
        self.store.write_atomic(self.path, json.dumps(doc).encode("utf-8"))

    def _describe(self, doc: dict) -> str:
        # the lock file is read from storage: describe it without trusting its types
        beat = doc.get("heartbeat")
        age = f"{self.clock() - beat:.0f} s ago" if isinstance(beat, (int, float)) else "unknown"
        return (f"owner {str(doc.get('owner', '?'))[:8]} (host {doc.get('host')!r}, "
                f"pid {doc.get('pid')!r}, last heartbeat {age})")

    def acquire(self) -> None:
        """Takes the lease, or raises ConcurrentWriterError naming the live holder."""
        doc = self._read()
        if doc is not None and doc.get("owner") != self.owner and self._alive(doc):
            raise ConcurrentWriterError(
                f"another CheckpointManager is writing {self.store.url(self.path.rsplit('/', 1)[0])}: "
                f"{self._describe(doc)}. Two writers would delete each other's checkpoints; "
                "use one manager per directory (or close() the other one).")
        self._write()
        check = self._read()
        if check is None or check.get("owner") != self.owner:  # lost a race with another taker
            raise ConcurrentWriterError(f"lost the writer lease of {self.store.url(self.path)} "
                                        "to another manager")
        self.held = True
        _HELD[self.owner] = self

    def refresh(self) -> None:
        """Verifies the lease is still ours; renews the heartbeat when it is getting old."""
        if not self.held:
            self.acquire()
            return
        doc = self._read()
        if doc is None or doc.get("owner") != self.owner:
            self.held = False
            _HELD.pop(self.owner, None)
            raise ConcurrentWriterError(
                f"the writer lease of {self.store.url(self.path)} was taken over by "
                + (self._describe(doc) if doc else "nobody (the lock file vanished)")
                + "; this manager stops writing")
        beat = doc.get("heartbeat")
        if not isinstance(beat, (int, float)) or self.clock() - beat > self.lease_seconds / 4:
            self._write()

    def release(self) -> None:
        """Gives the lease up, deleting the lock file if it still names this owner (best
        effort: storage errors are ignored)."""
        if not self.held:
            return
        self.held = False
        _HELD.pop(self.owner, None)
        try:
            doc = self._read()
            if doc is not None and doc.get("owner") == self.owner:
                self.store.delete([self.path])
        except OSError:
            pass  # best effort: a stale lease is recognised by pid or heartbeat
