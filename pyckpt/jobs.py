"""Background jobs: the one runner of the work that outlives the call that started it
(a background save's write and commit, a tier's persist), and the one shutdown path.

- ``submit(fn, name, lane=...)`` runs ``fn()`` in a thread of its own, named
  ``name``, and returns its ``Job``. The thread is not a daemon: the interpreter
  waits for it at exit, so a save or persist in flight then still commits.
  ``daemon=True`` is for work nobody needs once the process ends (allocating
  staging buffers ahead): the exit does not wait for it.
- Jobs of one *lane* (any hashable: one manager's persists) run one after the
  other, in the order submitted: a job starts once the lane's previous job ended.
  Jobs of distinct lanes, and jobs without one, run concurrently (saves to one
  place are ordered by ``ordering.py``, whose turn ends before a save's callbacks
  run, not by a lane). A job must not wait for a later job of its own lane.
- A job's error never escapes its thread: it is kept on its handle (``error``;
  ``wait`` raises it). ``join`` never raises it, and is a no-op from within the
  job itself.
- One shutdown path: at interpreter exit, once the interpreter has waited for the
  non-daemon threads, ``shutdown`` drains every job (in the order submitted,
  jobs submitted meanwhile included) and then runs the finalizers registered with
  ``at_shutdown`` (newest first; e.g. the managers' writer-lease releases). Tests
  call ``drain(timeout)`` and ``shutdown(timeout)`` themselves.
- In a child made by ``os.fork`` the parent's jobs do not run: they count as ended
  there, and the child drains only its own.
"""

from __future__ import annotations

import atexit
import os
import threading
import time
from typing import Any, Callable, Hashable

__all__ = ["Job", "submit", "drain", "at_shutdown", "shutdown", "pending"]

_LOCK = threading.Lock()
#: the non-daemon jobs not ended yet, in the order submitted
_LIVE: list["Job"] = []
#: the newest job of each lane, until it ends
_LANES: dict[Hashable, "Job"] = {}
_FINALIZERS: list[Callable[[], Any]] = []


class Job:
    """One background job (``submit``): ``join`` waits for it, ``done`` says whether it
    ended, ``error`` is what it raised, ``wait`` returns its result or raises."""

    __slots__ = ("name", "lane", "daemon", "thread", "_fn", "_earlier", "_ended",
                 "_result", "_error")

    def __init__(self, fn: Callable[[], Any], name: str, lane: Hashable | None,
                 daemon: bool, earlier: "Job | None") -> None:
        self.name, self.lane, self.daemon = name, lane, daemon
        self._fn: Callable[[], Any] | None = fn
        self._earlier = earlier
        self._ended = threading.Event()
        self._result: Any = None
        self._error: BaseException | None = None
        #: the thread it runs in (started by ``submit``)
        self.thread = threading.Thread(target=self._run, name=name, daemon=daemon)

    def _run(self) -> None:
        try:
            earlier, self._earlier = self._earlier, None  # hold no ended job
            if earlier is not None:
                earlier._ended.wait()
            fn, self._fn = self._fn, None  # keep nothing it refers to once it ended
            assert fn is not None
            self._result = fn()
        except BaseException as e:  # noqa: BLE001 - kept for whoever waits for it
            self._error = e
        finally:
            _forget(self)
            self._ended.set()

    def done(self) -> bool:
        """Whether it ended (returned or raised)."""
        return self._ended.is_set()

    def running_here(self) -> bool:
        """Whether the calling thread is this job's."""
        return threading.current_thread() is self.thread

    def join(self, timeout: float | None = None) -> bool:
        """Waits (at most ``timeout`` seconds) for it to end, without raising its error;
        returns whether it ended. From within the job itself: a no-op (False)."""
        if self.running_here():
            return False
        return self._ended.wait(timeout)

    @property
    def error(self) -> BaseException | None:
        """What it raised, once it ended (None: it returned, or it still runs)."""
        return self._error

    def wait(self, timeout: float | None = None) -> Any:
        """Waits for it to end and returns what it returned; raises its error, or
        TimeoutError when ``timeout`` seconds pass first."""
        if not self.join(timeout):
            raise TimeoutError(f"the background job {self.name!r} is still running"
                               + (f" after {timeout} s" if timeout is not None else ""))
        if self._error is not None:
            raise self._error
        return self._result

    def __repr__(self) -> str:
        state = "running" if not self.done() else "failed" if self._error else "ended"
        return f"<Job {self.name!r}: {state}>"


def _forget(job: Job) -> None:
    with _LOCK:
        if job in _LIVE:
            _LIVE.remove(job)
        if job.lane is not None and _LANES.get(job.lane) is job:
            del _LANES[job.lane]


def submit(fn: Callable[[], Any], name: str, *, lane: Hashable | None = None,
           daemon: bool = False) -> Job:
    """Runs ``fn()`` in the background (module doc) and returns its ``Job``: at once,
    or, with a ``lane``, once the lane's jobs submitted before it ended."""
    with _LOCK:
        earlier = _LANES.get(lane) if lane is not None else None
        job = Job(fn, name, lane, daemon, earlier)
        if lane is not None:
            _LANES[lane] = job
        if not daemon:
            _LIVE.append(job)
    try:
        job.thread.start()
    except BaseException as e:  # no thread (e.g. at interpreter shutdown): it never runs
        job._error = e
        _forget(job)
        job._ended.set()
        raise
    return job


def pending() -> list[Job]:
    """The jobs the exit waits for that have not ended, in the order submitted."""
    with _LOCK:
        return list(_LIVE)


def drain(timeout: float | None = None) -> bool:
    """Waits (at most ``timeout`` seconds in all) for every non-daemon job, in the order
    submitted, jobs submitted meanwhile included (not for the calling job itself);
    returns whether none is left."""
    end = None if timeout is None else time.monotonic() + timeout
    while True:
        left = [j for j in pending() if not j.running_here()]
        if not left:
            return True
        remaining = None if end is None else max(0.0, end - time.monotonic())
        if not left[0].join(remaining) and end is not None and time.monotonic() >= end:
            return False


def at_shutdown(fn: Callable[[], Any]) -> Callable[[], Any]:
    """Registers ``fn`` (once) to run at shutdown, after every job ended; returns it."""
    with _LOCK:
        if fn not in _FINALIZERS:
            _FINALIZERS.append(fn)
    return fn


def shutdown(timeout: float | None = None) -> bool:
    """The shutdown path (run at interpreter exit): drains every job, then runs the
    finalizers, newest first (one that raises does not stop the others: at exit the
    services they talk to may be gone already). Returns False, without running the
    finalizers, when jobs still run after ``timeout`` seconds."""
    if not drain(timeout):
        return False
    with _LOCK:
        finalizers = list(reversed(_FINALIZERS))
    for fn in finalizers:
        try:
            fn()
        except BaseException:  # noqa: BLE001 - see the docstring
            pass
    return True


def _after_fork_in_child() -> None:
    with _LOCK:
        parents = list(_LIVE) + list(_LANES.values())
        _LIVE.clear()
        _LANES.clear()
    for job in parents:  # their threads do not exist here
        job._ended.set()


atexit.register(shutdown)
if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)
