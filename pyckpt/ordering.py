"""The order in which one process's saves to one place commit: the order of their calls.

Every save (``saving.write`` blocking, ``saving.start`` in the background) takes a
``Turn`` for its place when it is called: the directory's identity and the worker's
rank (``place``). Its writing and commit run once every earlier turn of that place
ended, so the last call's values are the ones left (docs/PROTOCOL.md section 5,
"Order of saves").

Why it never deadlocks (docs/PROTOCOL.md section 5, "Order of saves"):

- a turn waits only for turns of its place taken before it (the edges of the wait
  graph all point to earlier calls: no cycle);
- a turn ends when its commit ended (committed or failed), before its completion
  callback runs: a save made from a callback (a manager's bookkeeping, a user's
  ``then``) waits like any other;
- a thread never waits for a turn while it holds one: a blocking save made from
  inside another save of the same thread (a ``progress`` callback) takes no turn
  and is not ordered;
- a turn holds no lock while it waits, and multi-worker saves wait before their
  collectives (each worker for its own earlier saves: the place includes its rank),
  so waiting never reorders collectives between workers.
"""

from __future__ import annotations

import contextlib
import os
import threading
from typing import TYPE_CHECKING, Iterator

if TYPE_CHECKING:
    from .storage import Store

__all__ = ["Turn", "place", "take", "identity"]

#: the newest turn of each place whose save has not ended yet
_NEWEST: dict[str, "Turn"] = {}
_LOCK = threading.Lock()


class _Held(threading.local):
    """Per thread: how many turns it holds (a save running in it)."""
    count = 0


_HELD = _Held()

_LOCAL_PROTOCOLS = ("file", "local")  # fsspec's local filesystem


def identity(store: "Store", path: str) -> str:
    """The directory ``path`` of ``store`` whatever its spelling. A local path: its
    ``realpath`` (links resolved up to the deepest existing ancestor, the components
    that do not exist yet kept as written: a checkpoint directory is made by its
    first save). An object store: its URL with empty and ``.`` components and
    trailing slashes dropped (object names have no links; ``..`` is a name there)."""
    if store.native_path(path) is not None or store.protocol in _LOCAL_PROTOCOLS:
        return os.path.realpath(path)
    scheme, _, rest = store.url(path).partition("://")
    return f"{scheme}://" + "/".join(c for c in rest.split("/") if c not in ("", "."))


def place(store: "Store", path: str, rank: int) -> str:
    """What orders one worker's saves: the directory's identity and the worker's rank
    (workers may be threads of one process)."""
    return f"{identity(store, path)}#{rank}"


class Turn:
    """One save's place in the order of the saves to its place: ``held()`` around its
    writing and commit (waits for the earlier turns first), ``end()`` when it will
    never run (idempotent)."""

    __slots__ = ("key", "_earlier", "_ended", "_registered")

    def __init__(self, key: str, earlier: "Turn | None", registered: bool) -> None:
        self.key = key
        self._earlier = earlier
        self._ended = threading.Event()
        self._registered = registered

    @contextlib.contextmanager
    def held(self) -> Iterator[None]:
        """Waits until every earlier turn of the place ended, then holds the turn for
        the block; it ends with the block, whatever the block raises."""
        try:
            self.wait()
            _HELD.count += 1
            try:
                yield
            finally:
                _HELD.count -= 1
        finally:
            self.end()

    def wait(self) -> None:
        """Waits for the turn before this one to end (it waited for its own first)."""
        earlier, self._earlier = self._earlier, None  # hold no finished turn
        if earlier is not None:
            earlier._ended.wait()

    def end(self) -> None:
        """Lets the next turn of the place go on (forgotten once no later one exists)."""
        if self._ended.is_set():
            return
        with _LOCK:
            if self._registered and _NEWEST.get(self.key) is self:
                del _NEWEST[self.key]
        self._ended.set()
        self._earlier = None

    def __repr__(self) -> str:
        return f"<Turn {self.key!r}: {'ended' if self._ended.is_set() else 'open'}>"


def take(key: str, *, blocking: bool) -> Turn:
    """The caller's turn at ``key``, after every turn taken before (registered now: the
    order is the order of the calls). ``blocking``: the turn is waited for in the
    calling thread; one that already holds a turn (a save made from a ``progress``
    callback) gets an unordered turn, that waits for nothing."""
    if blocking and _HELD.count:
        return Turn(key, None, registered=False)
    with _LOCK:
        earlier = _NEWEST.get(key)
        turn = _NEWEST[key] = Turn(key, earlier, registered=True)
    return turn
