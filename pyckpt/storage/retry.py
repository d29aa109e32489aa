"""Retries with backoff for transient storage errors, and the final clear error.

s3fs/botocore and gcsfs retry some errors themselves; this layer adds what
they lack: a per-request timeout, one retry policy for every backend and
request kind, and an error after the budget that names the object.
"""

from __future__ import annotations

import asyncio
import errno
import random
import time
from typing import Any, Awaitable, Callable, TypeVar

from ..errors import CheckpointIOError
from .options import RemoteOptions

T = TypeVar("T")

_TRANSIENT_CODES = {"500", "502", "503", "504", "RequestTimeout", "RequestTimeoutException",
                    "SlowDown", "ServiceUnavailable", "InternalError", "Throttling",
                    "ThrottlingException", "RequestLimitExceeded", "TooManyRequests", "429"}
_TRANSIENT_NAMES = {"EndpointConnectionError", "ConnectionClosedError", "ReadTimeoutError",
                    "ConnectTimeoutError", "ResponseStreamingError", "IncompleteReadError",
                    "ClientConnectionError", "ClientOSError", "ServerDisconnectedError",
                    "ClientPayloadError", "ServerTimeoutError", "TransportError",
                    "HttpError", "ChecksumError", "TransientError"}


def is_transient(exc: BaseException) -> bool:
    """Whether retrying the same request may succeed."""
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


def _delay(opts: RemoteOptions, attempt: int) -> float:
    base = min(opts.backoff_max, opts.backoff * (2 ** attempt))
    return base * (0.5 + random.random() / 2)


def _give_up(what: str, attempts: int, exc: BaseException) -> CheckpointIOError:
    err = CheckpointIOError(errno.EIO, f"{what} failed after {attempts} attempt(s): "
                                       f"{type(exc).__name__}: {exc}")
    err.__cause__ = exc
    return err


async def retry_async(what: str, opts: RemoteOptions, fn: Callable[[], Awaitable[T]]) -> T:
    """Runs ``await fn()`` with a timeout, retrying transient failures; other
    errors pass through unchanged, an exhausted budget raises CheckpointIOError."""
    for attempt in range(opts.retries):
        try:
            return await asyncio.wait_for(fn(), timeout=opts.timeout)
        except Exception as e:  # noqa: BLE001 - classified below
            if not is_transient(e):
                raise
            if attempt + 1 == opts.retries:
                raise _give_up(what, attempt + 1, e) from e
            await asyncio.sleep(_delay(opts, attempt))
    raise AssertionError("unreachable")


def retry_sync(what: str, opts: RemoteOptions, fn: Callable[[], T]) -> T:
    """The blocking version, for fsspec calls without an async API."""
    for attempt in range(opts.retries):
        try:
            return fn()
        except Exception as e:  # noqa: BLE001
            if not is_transient(e):
                raise
            if attempt + 1 == opts.retries:
                raise _give_up(what, attempt + 1, e) from e
            time.sleep(_delay(opts, attempt))
    raise AssertionError("unreachable")
