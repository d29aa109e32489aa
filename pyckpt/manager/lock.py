"""The writer lease of a manager directory (docs/PROTOCOL.md, "One writer").

Two managers writing one directory would interleave their retention and
delete each other's checkpoints, so a manager takes a lease before its first
write: the file ``pyckpt-manager.lock`` names its owner (a random id, host,
pid) and a heartbeat time refreshed on every save. Another manager refuses
to write while the lease is held by an owner that is alive: on the same host
its pid must still run; elsewhere its heartbeat must be younger than
``lease_seconds``. Before each commit the owner re-reads the file and stops
with ConcurrentWriterError if the lease was taken over.

Within one process a newer manager takes the lease over from an older one
that still exists (restore-and-continue re-creates the manager while the old
one is still referenced): the taker first waits, under the directory's
in-process gate, until the older manager's save in flight (``begin`` ...
``end``, which spans an async save's background commit) has finished, so the
two never interleave; the older manager's next save then raises
ConcurrentWriterError. An older manager never takes the lease back from a
newer live one.
"""

from __future__ import annotations

import itertools
import json
import os
import socket
import threading
import time
import uuid
import weakref
from typing import Callable, Literal

from .._process import pid_alive
from ..errors import ConcurrentWriterError
from ..storage import Store

LOCK_NAME = "pyckpt-manager.lock"

# Leases held by managers of this process: owner id -> lease. A lease whose
# manager was garbage-collected (or closed) is gone from here, so a new
# manager in the same process may take the directory over.
_HELD: "weakref.WeakValueDictionary[str, WriterLease]" = weakref.WeakValueDictionary()

# Creation order of the leases (hence of the managers) of this process: a newer
# manager may take a directory over from an older one, never the reverse.
_GENERATION = itertools.count(1)

# One gate per lock file (by URL) serializes, within this process, the lease
# checks, takeovers and releases of that directory, and lets a taker wait for
# the holder's save in flight.
_GATES: dict[str, threading.Condition] = {}
_GATES_LOCK = threading.Lock()


def _gate(key: str) -> threading.Condition:
    with _GATES_LOCK:
        gate = _GATES.get(key)
        if gate is None:
            gate = _GATES[key] = threading.Condition()  # an RLock: re-entered by refresh
        return gate


Begun = Literal["held", "acquired", "taken over"]


class WriterLease:
    """The writer lease of one manager directory (module doc): ``acquire`` takes it,
    ``refresh`` checks and renews it, ``release`` gives it up. ``lease_seconds``
    bounds how long a holder on another host counts as alive without a heartbeat."""

    def __init__(self, store: Store, directory: str, lease_seconds: float = 600.0,
                 clock: Callable[[], float] = time.time) -> None:
        self.store, self.directory = store, directory
        self.path = store.join(directory, LOCK_NAME)
        self.lease_seconds = lease_seconds
        self.clock = clock
        self.owner = uuid.uuid4().hex
        self.host = socket.gethostname()
        self.held = False
        self.generation = next(_GENERATION)
        self._gate = _gate(store.url(self.path))
        self._busy = False  # a save of this lease's manager is in flight (begin .. end)
        self._took_over = False  # the last acquire displaced an older manager of this process

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

    def _in_process_holder(self, doc: dict) -> "WriterLease | None":
        """The live lease of another manager of this process that ``doc`` names, if any."""
        if doc.get("host") != self.host or doc.get("pid") != os.getpid():
            return None
        other = _HELD.get(str(doc.get("owner")))
        return other if other is not None and other is not self and other.held else None

    def acquire(self) -> None:
        """Takes the lease, or raises ConcurrentWriterError naming the live holder. An
        older live manager of this process is taken over once its save in flight has
        finished (``begin`` reports it); a newer one is never displaced."""
        with self._gate:
            self._took_over = False
            while True:
                doc = self._read()
                if doc is None or doc.get("owner") == self.owner:
                    break
                holder = self._in_process_holder(doc)
                if holder is None:
                    if self._alive(doc):
                        raise ConcurrentWriterError(
                            f"another CheckpointManager is writing {self._dir_url()}: "
                            f"{self._describe(doc)}. Two writers would delete each other's "
                            "checkpoints; use one manager per directory (or close() the other one).")
                    break
                if holder.generation > self.generation:
                    raise ConcurrentWriterError(
                        f"a newer CheckpointManager of this process writes {self._dir_url()} "
                        f"(owner {holder.owner[:8]}); this older one stopped writing there. "
                        "Save with the new manager.")
                if holder._busy:  # its save in flight commits and is recorded first
                    self._gate.wait()
                    continue  # re-read: the holder may have closed, or another taker won
                self._took_over = True
                break
            self._write()
            check = self._read()
            if check is None or check.get("owner") != self.owner:  # lost a race with another taker
                raise ConcurrentWriterError(f"lost the writer lease of {self.store.url(self.path)} "
                                            "to another manager")
            self.held = True
            _HELD[self.owner] = self

    def _dir_url(self) -> str:
        return self.store.url(self.path.rsplit("/", 1)[0])

    def begin(self) -> Begun:
        """Checks (or takes) the lease at the start of a save and marks the save in
        flight until ``end``: "held" (it was ours already), "acquired" (taken now), or
        "taken over" (taken now from an older live manager of this process). After
        "acquired" or "taken over" the caller re-reads the directory's state."""
        with self._gate:
            was_held = self.held
            self.refresh()
            self._busy = True
            if was_held:
                return "held"
            return "taken over" if self._took_over else "acquired"

    def end(self) -> None:
        """Marks the save begun by ``begin`` finished (committed, recorded or failed)."""
        with self._gate:
            self._busy = False
            self._gate.notify_all()

    def refresh(self) -> None:
        """Verifies the lease is still ours; renews the heartbeat when it is getting old."""
        with self._gate:
            if not self.held:
                self.acquire()
                return
            doc = self._read()
            if doc is None or doc.get("owner") != self.owner:
                self.held = False
                _HELD.pop(self.owner, None)
                if doc is None:
                    by = "nobody (the lock file vanished)"
                elif self._in_process_holder(doc) is not None:
                    by = (f"a newer CheckpointManager of this process (owner "
                          f"{str(doc.get('owner'))[:8]}): save with the new manager")
                else:
                    by = self._describe(doc)
                raise ConcurrentWriterError(f"the writer lease of {self.store.url(self.path)} "
                                            f"was taken over by {by}; this manager stops writing")
            beat = doc.get("heartbeat")
            if not isinstance(beat, (int, float)) or self.clock() - beat > self.lease_seconds / 4:
                self._write()

    def release(self) -> None:
        """Gives the lease up, deleting the lock file if it still names this owner (best
        effort: storage errors are ignored)."""
        with self._gate:  # never between another manager's read and write of the file
            if not self.held:
                return
            self.held = False
            _HELD.pop(self.owner, None)
            if not self.store.answering():
                return  # the store stopped answering: the lease is recognised as stale later
            try:
                doc = self._read()
                if doc is not None and doc.get("owner") == self.owner:
                    self.store.remove(self.directory, [self.path])
            except OSError:
                pass  # best effort: a stale lease is recognised by pid or heartbeat
