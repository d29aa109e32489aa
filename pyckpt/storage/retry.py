"""Retries, stall detection and deadlines for storage requests, and the final clear error.

s3fs/botocore and gcsfs retry some errors themselves; this layer adds what
they lack, for every backend and request kind (docs/PROTOCOL.md, "Timeouts,
retries and cleanup"):

- **stall detection by progress**: each attempt of a request runs under a
  watchdog; the request's transfer code reports every chunk of bytes sent or
  received (``Attempt.progress``); an attempt that moves no byte for
  ``stall_timeout`` seconds is cancelled and counts as a transient failure.
  Requests whose bytes cannot be watched are bounded by the ``stall`` the
  caller gives (``stall_timeout`` for small metadata requests, ``timeout`` for
  opaque transfers); every attempt is bounded by ``timeout`` in all;
- **a deadline per operation**: an ``Operation`` (one upload of a save's files,
  one batch of reads, one metadata call) keeps the time of its last progress
  (a byte moved or a request finished); a transient failure is retried only
  while that is less than ``deadline`` seconds ago, and at most ``retries``
  times per request. So an operation against a server that stopped answering
  fails about ``deadline`` seconds after the last byte moved, whatever the
  per-request limits;
- **store health**: when an operation gives up on a transient failure, its
  ``Health`` (one per store) is marked down; until a request succeeds again,
  for at most ``max(deadline, 4 * cleanup_timeout)`` seconds, every new
  operation is a *probe*: one attempt bounded by ``cleanup_timeout``, and all
  of them together by the *follow-up window*, ``3 * cleanup_timeout`` from the
  moment the store went down; for one ``cleanup_timeout`` past it, a probe
  fails at once, untried (``StoreDown``), so that the rest of a failed
  operation's follow-ups end without a request; later probes try again. This bounds what follows a failure (the cleanup, the
  caller's removal of its files, the check of an index, the release of a lease)
  instead of retrying, or even trying, each step against a dead server;
- an error after the budget, ``CheckpointIOError``, that names the object.
"""

from __future__ import annotations

import asyncio
import contextvars
import errno
import random
import re
import threading
import time
from typing import Any, Awaitable, Callable, TypeVar

from ..errors import CheckpointIOError, StallError, StoreDown
from .diagnose import explain
from .options import LAST_ATTEMPT_MIN, RemoteOptions

T = TypeVar("T")

_TRANSIENT_CODES = {"500", "502", "503", "504", "RequestTimeout", "RequestTimeoutException",
                    "SlowDown", "ServiceUnavailable", "InternalError", "Throttling",
                    "ThrottlingException", "RequestLimitExceeded", "TooManyRequests", "429"}
_TRANSIENT_NAMES = {"EndpointConnectionError", "ConnectionClosedError", "ReadTimeoutError",
                    "ConnectTimeoutError", "ResponseStreamingError", "IncompleteReadError",
                    "ClientConnectionError", "ClientOSError", "ServerDisconnectedError",
                    "ClientPayloadError", "ServerTimeoutError", "TransportError",
                    "HttpError", "ChecksumError", "TransientError", "FSTimeoutError"}


def is_transient(exc: BaseException) -> bool:
    """Whether retrying the same request may succeed: ``exc``, or the error it was
    raised from (s3fs turns a botocore ClientError into an OSError, e.g. 503
    SlowDown into ``OSError(EBUSY)``, with the ClientError as its ``__cause__``).
    A CheckpointIOError is a final verdict, never transient."""
    for _ in range(5):
        if isinstance(exc, CheckpointIOError):
            return False
        if _is_transient_one(exc):
            return True
        if exc.__cause__ is None:
            return False
        exc = exc.__cause__
    return False


def _is_transient_one(exc: BaseException) -> bool:
    if isinstance(exc, (asyncio.TimeoutError, TimeoutError, ConnectionError)):
        return True
    for cls in type(exc).__mro__:
        if cls.__name__ in _TRANSIENT_NAMES:
            if cls.__name__ == "HttpError":  # gcsfs: only server-side codes
                code = getattr(exc, "code", None)
                return code is None or (isinstance(code, int) and (code >= 500 or code == 429))
            return True
    response = getattr(exc, "response", None)
    if isinstance(response, dict):  # botocore ClientError
        err = response.get("Error", {}) or {}
        status = (response.get("ResponseMetadata", {}) or {}).get("HTTPStatusCode")
        if str(err.get("Code")) in _TRANSIENT_CODES or (isinstance(status, int) and status >= 500):
            return True
    if isinstance(exc, OSError) and exc.errno in (errno.ECONNRESET, errno.ECONNREFUSED,
                                                   errno.ETIMEDOUT, errno.EPIPE, errno.EAGAIN):
        return True
    return False


class Health:
    """Whether a store answers; shared by every operation of one store."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.down_since: float | None = None

    def ok(self) -> None:
        if self.down_since is not None:
            with self._lock:
                self.down_since = None

    def failed(self, now: float) -> None:
        with self._lock:
            if self.down_since is None:
                self.down_since = now

    def probing(self, opts: RemoteOptions, now: float) -> bool:
        """Whether new operations get only one short attempt (the store stopped
        answering less than ``max(deadline, 4 * cleanup_timeout)`` seconds ago: the
        follow-up window and the untried time after it; and has not answered since)."""
        since = self.down_since
        return since is not None and now - since < max(
            opts.deadline, follow_up_window(opts) + opts.cleanup_timeout)

    def window_left(self, opts: RemoteOptions, now: float) -> float | None:
        """Seconds left of the follow-up window of the store's failure (None: the
        store is not down)."""
        since = self.down_since
        return None if since is None else since + follow_up_window(opts) - now


def follow_up_window(opts: RemoteOptions) -> float:
    """How long after a store stopped answering the requests that follow the failure
    (all of them together) may take: ``3 * cleanup_timeout`` (docs/PROTOCOL.md 1c)."""
    return 3 * opts.cleanup_timeout


class Operation:
    """The progress clock of one operation: the requests of one upload, one batch of
    reads, or one metadata call. ``probe`` operations make one attempt per request,
    bounded by ``cleanup_timeout`` (cleanups, and any operation while the store is down)."""

    def __init__(self, opts: RemoteOptions, health: Health | None = None, *,
                 probe: bool = False, quiet: bool = False) -> None:
        self.opts = opts
        #: a quiet operation's failure does not mark the store down (cleanups, sweeps)
        self.quiet = quiet
        self.health = health if health is not None else Health()
        now = time.monotonic()
        self.start = self.last = now
        #: why requests get one short attempt: "cleanup" (best effort by design),
        #: "unreachable" (the store stopped answering recently), or None
        self.probe_reason = ("cleanup" if probe else
                             "unreachable" if self.health.probing(opts, now) else None)
        self.probe = self.probe_reason is not None

    def progress(self) -> None:
        self.last = time.monotonic()
        self.health.ok()

    def give_up(self, what: str, attempts: int, exc: BaseException) -> CheckpointIOError:
        if not self.quiet:
            self.health.failed(time.monotonic())
        return _give_up(what, attempts, exc, self)


class Attempt:
    """One attempt of one request. Transfer code calls ``progress()`` for every chunk of
    bytes it sends or receives; ``task`` is the asyncio task running the request (an
    upload body read by another task is the HTTP client sending it)."""

    __slots__ = ("op", "start", "last", "task", "note")

    def __init__(self, op: Operation) -> None:
        self.op = op
        self.start = self.last = time.monotonic()
        self.task: Any = None
        #: the last error the client retried by itself inside this attempt (botocore's
        #: own retries), reported if the attempt stalls
        self.note: str | None = None

    def progress(self) -> None:
        now = time.monotonic()
        self.last = now
        self.op.last = now
        self.op.health.ok()


#: The attempt the current task runs (client hooks report into it).
current_attempt: contextvars.ContextVar[Attempt | None] = contextvars.ContextVar(
    "pyckpt_attempt", default=None)


async def _as_attempt(att: Attempt, coro: Awaitable[T]) -> T:
    current_attempt.set(att)
    return await coro


def _delay(opts: RemoteOptions, attempt: int) -> float:
    base = min(opts.backoff_max, opts.backoff * (2 ** attempt))
    return base * (0.5 + random.random() / 2)


def _give_up(what: str, attempts: int, exc: BaseException, op: Operation) -> CheckpointIOError:
    now = time.monotonic()
    why = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
    idle = now - op.last
    tail = ""
    if op.probe_reason == "unreachable":
        tail = ("; one short attempt, as the store stopped answering less than "
                f"{op.opts.deadline:g} s ago")
    elif idle >= op.opts.deadline:
        tail = (f"; no progress for {idle:.0f} s (the deadline, "
                f"storage_options={{'pyckpt': {{'deadline': {op.opts.deadline:g}}}}})")
    err = CheckpointIOError(errno.EIO, f"{what} failed after {attempts} attempt(s) in "
                                       f"{now - op.start:.1f} s: {why}{tail}")
    err.__cause__ = exc
    return err


_URL = re.compile(r"[a-z][a-z0-9+.-]*://\S+")


def _final(what: str, exc: Exception) -> Exception:
    """What a request's non-transient failure raises: a ``CheckpointIOError`` naming the
    request, the cause and the fix when the store refused for a known reason (missing
    or rejected credentials, access denied: ``diagnose.explain``); else ``exc`` itself
    (a missing object's FileNotFoundError, which the store's callers act on)."""
    if isinstance(exc, CheckpointIOError):
        return exc
    m = _URL.search(what)
    problem = explain(exc, url=m.group(0).rstrip(":,;)") if m else None)
    if problem is None:
        return exc
    return CheckpointIOError(errno.EACCES, f"{what}: {problem}")


def _limits(op: Operation, stall: float) -> tuple[float, float]:
    """(stall limit, total limit) of the next attempt: never past the operation's
    deadline, nor, for a probe while the store is down, past the follow-up window
    (StoreDown, untried, when it is spent)."""
    o = op.opts
    hard = o.timeout
    now = time.monotonic()
    if op.probe:
        stall, hard = min(stall, o.cleanup_timeout), min(hard, o.cleanup_timeout)
        window = op.health.window_left(o, now)
        if window is not None and window > -o.cleanup_timeout and op.health.probing(o, now):
            if window <= 0:
                since = follow_up_window(o) - window
                raise StoreDown(
                    f"not tried: the store stopped answering {since:.0f}"
                    " s ago and the time for the steps that follow that failure "
                    f"(3 x cleanup_timeout = {follow_up_window(o):g} s) is spent; it is "
                    f"tried again in {o.cleanup_timeout + window:.1f} s")
            stall, hard = min(stall, window), min(hard, window)
    left = o.deadline - (now - op.last)
    stall = min(stall, max(left, min(stall, LAST_ATTEMPT_MIN)))
    return stall, hard


async def watch(coro: Awaitable[T], att: Attempt, stall: float, hard: float) -> T:
    """Awaits ``coro`` as a task; cancels it when it moves no byte for ``stall``
    seconds (StallError) or runs ``hard`` seconds in all (TimeoutError)."""
    task = asyncio.ensure_future(_as_attempt(att, coro))
    att.task = task
    try:
        while True:
            now = time.monotonic()
            if now - att.last >= stall:
                why = (f"; the client's last error: {att.note}" if att.note
                       else " (a stalled server?)")
                raise StallError(f"no bytes moved for {now - att.last:.1f} s{why}")
            if now - att.start >= hard:
                raise asyncio.TimeoutError(f"the request took longer than {hard:g} s")
            wait = min(att.last + stall, att.start + hard) - now
            done, _ = await asyncio.wait({task}, timeout=max(wait, 0.001))
            if done:
                return task.result()
    finally:
        if not task.done():
            task.cancel()
            await asyncio.wait({task}, timeout=1.0)
        if task.done() and not task.cancelled():
            task.exception()  # retrieved: no "exception was never retrieved" noise
        # the task's context holds the attempt (current_attempt): a cycle that would keep
        # the task's result (a request's bytes) alive until a full collection
        att.task = None


async def call_async(what: str, op: Operation, fn: Callable[[Attempt], Awaitable[T]], *,
                     stall: float | None = None) -> T:
    """Runs ``await fn(attempt)`` under the watchdog, retrying transient failures while
    the operation's deadline and the request's attempts allow; other errors pass
    through unchanged; an exhausted budget raises CheckpointIOError naming ``what``."""
    o = op.opts
    stall = o.stall_timeout if stall is None else stall
    attempts = 1 if op.probe else o.retries
    n = 0
    while True:
        n += 1
        att = Attempt(op)
        try:
            s, hard = _limits(op, stall)
            result = await watch(fn(att), att, s, hard)
        except Exception as e:  # noqa: BLE001 - classified below
            if not is_transient(e):
                raise _final(what, e) from e
            idle = time.monotonic() - op.last
            if n >= attempts or idle >= o.deadline:
                raise op.give_up(what, n, e) from e
            await asyncio.sleep(min(_delay(o, n - 1), max(o.deadline - idle, 0.0)))
            continue
        op.progress()
        return result


def call_sync(what: str, op: Operation, fn: Callable[[], T]) -> T:
    """The blocking version, for filesystems without an async API: the same retries
    and deadline, but no watchdog (a blocking call cannot be cancelled)."""
    o = op.opts
    attempts = 1 if op.probe else o.retries
    n = 0
    while True:
        n += 1
        try:
            _limits(op, o.timeout)  # a spent follow-up window: StoreDown, untried
            result = fn()
        except Exception as e:  # noqa: BLE001
            if not is_transient(e):
                raise _final(what, e) from e
            idle = time.monotonic() - op.last
            if n >= attempts or idle >= o.deadline:
                raise op.give_up(what, n, e) from e
            time.sleep(min(_delay(o, n - 1), max(o.deadline - idle, 0.0)))
            continue
        op.progress()
        return result


async def retry_async(what: str, opts: RemoteOptions, fn: Callable[[], Awaitable[T]]) -> T:
    """``call_async`` for one request in an operation of its own."""
    return await call_async(what, Operation(opts), lambda att: fn())


def retry_sync(what: str, opts: RemoteOptions, fn: Callable[[], T]) -> T:
    """``call_sync`` for one request in an operation of its own."""
    return call_sync(what, Operation(opts), fn)
