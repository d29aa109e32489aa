"""Save attempts inside one checkpoint directory, and the files they leave behind
(docs/FORMAT.md section 1, docs/PROTOCOL.md section 1).

Every save attempt writes its data files under names carrying its random
attempt id. Before its first data byte it drops a small marker file,
``pyckpt-attempt-<id>.json`` (host, pid, start time), and it removes the
marker once it has committed or given up. Two writers racing on one path both
commit; the loser's files are then referenced by no index. So are the files of
a writer killed mid-save. ``sweep`` removes such orphans: data files that the
committed index does not name, of attempts that are not live. An attempt is
live while its marker exists and its process runs (same host), or, for a
marker written on another host, while the marker is younger than
``FOREIGN_ATTEMPT_SECONDS``. The sweep re-reads the index after judging
liveness: an attempt removes its marker only after its commit, so the files
of an attempt that just committed are never taken for orphans.
"""

from __future__ import annotations

import json
import os
import socket
import threading
import time
from typing import Callable

from .._process import pid_alive
from ..format import INDEX_NAME, decode_index
from ..storage import Store
from . import naming

__all__ = ["FOREIGN_ATTEMPT_SECONDS", "begin", "end", "is_live", "sweep", "is_marker"]

MARKER_PREFIX = "pyckpt-attempt-"
MARKER_SUFFIX = ".json"
#: A marker written on another host counts as live for this long (no heartbeat:
#: a save that runs longer than this on another host could lose its files).
FOREIGN_ATTEMPT_SECONDS = 6 * 3600.0

_HOST = socket.gethostname()
_ACTIVE: set[str] = set()           # attempts in progress in this process
_ACTIVE_LOCK = threading.Lock()


def marker_name(attempt: str) -> str:
    """The marker file name of ``attempt``: ``pyckpt-attempt-<id>.json``."""
    return f"{MARKER_PREFIX}{attempt}{MARKER_SUFFIX}"


def is_marker(name: str) -> bool:
    """Whether a directory entry is an attempt marker."""
    return name.startswith(MARKER_PREFIX) and name.endswith(MARKER_SUFFIX)


def begin(store: Store, path: str, attempt: str) -> None:
    """Marks ``attempt`` live in ``path`` (before any of its data is written)."""
    with _ACTIVE_LOCK:
        _ACTIVE.add(attempt)
    doc = {"host": _HOST, "pid": os.getpid(), "time": time.time()}
    store.makedirs(path)
    store.write_atomic(store.join(path, marker_name(attempt)), json.dumps(doc).encode())


def end(store: Store, path: str, attempt: str) -> None:
    """Removes the marker of ``attempt`` (after its commit, or after it gave up).
    Best effort: a marker left behind is recognised as dead by its pid."""
    with _ACTIVE_LOCK:
        _ACTIVE.discard(attempt)
    try:
        store.remove(path, [store.join(path, marker_name(attempt))])
    except OSError:
        pass


def _live(store: Store, path: str, name: str, now: float) -> bool:
    try:
        doc = json.loads(store.read_bytes(store.join(path, name)).decode("utf-8"))
    except FileNotFoundError:
        return False  # ended between the listing and now
    except (OSError, ValueError):
        return True  # unreadable: keep its files (a later sweep decides)
    if not isinstance(doc, dict):
        return True
    pid, host, started = doc.get("pid"), doc.get("host"), doc.get("time")
    if host == _HOST and type(pid) is int:
        if pid == os.getpid():
            with _ACTIVE_LOCK:
                return name[len(MARKER_PREFIX):-len(MARKER_SUFFIX)] in _ACTIVE
        return pid_alive(pid)
    return isinstance(started, (int, float)) and now - started < FOREIGN_ATTEMPT_SECONDS


def _dead_temps(store: Store, path: str, names: list[str], now: float) -> list[str]:
    """The temporary files of atomic writes (an index, a data file, a part record)
    whose writer cannot finish them any more: its process is gone from this host
    (a kill during a commit), or, written on another host, the file is older than
    FOREIGN_ATTEMPT_SECONDS. This process's own are never touched."""
    out = []
    for n in names:
        writer = store.temp_writer(n)
        if writer is None:
            continue
        here, pid = writer
        if here:
            if pid != os.getpid() and not pid_alive(pid):
                out.append(n)
        else:
            t = store.mtime(store.join(path, n))
            if t is not None and now - t > FOREIGN_ATTEMPT_SECONDS:
                out.append(n)
    return out


def is_live(store: Store, path: str, attempt: str) -> bool:
    """Whether save attempt ``attempt`` in ``path`` may still be running (its marker
    exists and its process runs, or it was written elsewhere recently)."""
    name = marker_name(attempt)
    if name not in store.listdir(path):
        return False
    return _live(store, path, name, time.time())


def sweep(store: Store, path: str, clock: Callable[[], float] = time.time) -> list[str]:
    """Removes the orphaned data files and dead markers of the committed checkpoint
    at ``path``, and aborts the unfinished uploads (S3 multipart uploads) of data
    files of attempts that are not live: the committed files are complete, so an
    upload still open there is a failed writer's; returns the names removed and
    aborted. Does nothing unless a valid index is committed there (the files of an
    uncommitted or damaged checkpoint are evidence, not garbage)."""
    names = store.listdir(path)
    markers = [n for n in names if is_marker(n)]
    data = [n for n in names if naming.is_data_file(n)]
    now = clock()
    live, dead_markers = set(), []
    for m in markers:
        if _live(store, path, m, now):
            live.add(m[len(MARKER_PREFIX):-len(MARKER_SUFFIX)])
        else:
            dead_markers.append(m)
    candidates = [n for n in data if naming.attempt_of(n) not in live]
    candidates += _dead_temps(store, path, names, now)
    open_uploads = [n for n in store.unfinished(path)  # [] but on S3: one listing
                    if naming.is_data_file(n) and naming.attempt_of(n) not in live]
    if not candidates and not dead_markers and not open_uploads:
        return []
    index = store.join(path, INDEX_NAME)
    try:  # read after judging liveness: see the module doc
        committed = decode_index(store.read_bytes(index), store.url(index))
    except (OSError, ValueError):
        return []
    referenced = {f.name for f in committed.files if f.at is None}  # its own files
    doomed = [n for n in candidates if n not in referenced] + dead_markers
    store.remove(path, (store.join(path, n) for n in doomed))
    aborted = store.abort_uploads(path, open_uploads) if open_uploads else []
    return doomed + [n for n in open_uploads if n in aborted and n not in doomed]
