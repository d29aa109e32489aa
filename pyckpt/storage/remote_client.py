"""The connection to one fsspec filesystem: what kind it is (S3 through s3fs,
async, other), the state every store over it shares (whether it answers, the
multipart uploads this process could not abort), operations under the retry
policy (retry.py), and single S3 requests whose bytes are watched: upload
bodies as the HTTP client sends them (``PartBody``), downloads as they arrive.
Transfers built on it: uploads.py, downloads.py, stale_uploads.py.
"""

from __future__ import annotations

import asyncio
import io
import threading
import weakref
from typing import Any, Awaitable, Callable

from ..errors import CorruptCheckpointError
from .options import RemoteOptions
from .retry import Attempt, Health, Operation, call_async, current_attempt

_READ_CHUNK = 1 << 20


def _is_s3(fs: Any) -> bool:
    try:
        return hasattr(fs, "_call_s3") and hasattr(fs, "split_path") and hasattr(fs, "loop")
    except Exception:  # noqa: BLE001 - a wrapper without an S3 target
        return False


def _is_gcs(fs: Any) -> bool:
    """gcsfs itself (its resumable uploads are driven request by request)."""
    return type(fs).__module__.startswith("gcsfs") and hasattr(fs, "_call") \
        and hasattr(fs, "split_path") and hasattr(fs, "loop")


def _s3fs_of(fs: Any) -> Any:
    """The s3fs filesystem behind ``fs`` (itself, or the target of a wrapper), or None."""
    for candidate in (fs, getattr(fs, "target", None)):
        if candidate is not None and hasattr(candidate, "get_s3") and hasattr(candidate, "set_session"):
            return candidate
    return None


class PartBody(io.BytesIO):
    """One request body over a shared buffer (no copy), as the file-like object the
    HTTP client streams from. Reads made by another task than the request's own
    (botocore reads the body once in the request's task to checksum it) are the
    client sending it: each counts as progress of the request's ``Attempt``.

    It is an ``io.BytesIO`` only so that aiohttp streams it in chunks; its own
    position and the shared buffer replace BytesIO's storage."""

    def __init__(self, data: Any, att: Attempt | None = None) -> None:
        super().__init__()
        self._data = memoryview(data).cast("B")
        self._pos = 0
        self.att = att

    def read(self, n: int | None = -1) -> bytes:
        end = len(self._data) if n is None or n < 0 else min(len(self._data), self._pos + n)
        out = bytes(self._data[self._pos:end])
        self._pos = max(self._pos, end)
        att = self.att
        if out and att is not None and att.task is not None:
            try:  # bookkeeping only: never fail the HTTP client's read
                task = asyncio.current_task()
                if task is not None and task is not att.task:
                    att.progress()
            except Exception:  # noqa: BLE001 - e.g. no running loop
                pass
        return out

    def readinto(self, b: Any) -> int:
        data = self.read(len(memoryview(b).cast("B")))
        memoryview(b).cast("B")[:len(data)] = data
        return len(data)

    def seek(self, pos: int, whence: int = 0) -> int:
        base = {0: 0, 1: self._pos, 2: len(self._data)}[whence]
        self._pos = max(0, base + pos)
        return self._pos

    def tell(self) -> int:
        return self._pos

    def getbuffer(self) -> memoryview:
        return self._data[:]

    def getvalue(self) -> bytes:
        return bytes(self._data)

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def close(self) -> None:  # the client may close it; the buffer stays usable
        pass


def _rewind_body(params: Any = None, **kwargs: Any) -> None:
    """botocore hook (before-parameter-build): every API call sends a PartBody from its
    start, also when s3fs repeats a call with the same parameters after an error."""
    body = params.get("Body") if isinstance(params, dict) else None
    if isinstance(body, PartBody):
        body.seek(0)


def _note_retry(caught_exception: BaseException | None = None, **kwargs: Any) -> None:
    """botocore hook (needs-retry): remembers the error botocore is about to retry by
    itself, so that a request that then stalls says why (e.g. connection refused)."""
    att = current_attempt.get()
    if att is not None and caught_exception is not None:
        att.note = f"{type(caught_exception).__name__}: {caught_exception}"


_HOOKS = (("before-parameter-build.s3.UploadPart", _rewind_body),
          ("before-parameter-build.s3.PutObject", _rewind_body),
          ("needs-retry.s3", _note_retry))


def gone(exc: BaseException | None) -> bool:
    """Whether a failed abort/delete found nothing to remove (as good as done)."""
    if exc is None or isinstance(exc, FileNotFoundError):
        return True
    text = f"{type(exc).__name__} {exc}"
    return "NoSuchUpload" in text or "NoSuchKey" in text


class _FsState:
    """What every store over one filesystem shares: whether it answers, and the
    multipart uploads this process failed to abort there."""

    def __init__(self) -> None:
        self.health = Health()
        #: upload id -> (bucket, key, url); aborted at the next save (stale_uploads.py)
        self.unaborted: dict[str, tuple[str, str, str]] = {}
        self.lock = threading.Lock()


_FS_STATE: "weakref.WeakKeyDictionary[Any, _FsState]" = weakref.WeakKeyDictionary()
_FS_STATE_LOCK = threading.Lock()


def _state_of(fs: Any) -> _FsState:
    with _FS_STATE_LOCK:
        try:
            state = _FS_STATE.get(fs)
            if state is None:
                state = _FS_STATE[fs] = _FsState()
            return state
        except TypeError:  # not weakly referenceable or not hashable: this store's own
            return _FsState()


class RemoteClient:
    """One fsspec filesystem as pyckpt talks to it: its kind (S3, async), its shared
    state, operations under the retry policy (retry.py), and single S3 requests
    with their bytes watched."""

    def __init__(self, fs: Any, opts: RemoteOptions, url: Any, health: Health | None = None) -> None:
        self.fs = fs
        self.opts = opts
        self.url = url  # path -> URL for messages
        shared = _state_of(fs)
        self.health = health if health is not None else shared.health
        self.is_async = bool(getattr(fs, "async_impl", False)) and hasattr(fs, "_cat_file")
        self.is_s3 = _is_s3(fs)
        #: s3fs itself (not a wrapper): requests and response bodies are watched
        self.s3_native = self.is_s3 and self.is_async
        self.is_gcs = self.is_async and _is_gcs(fs)
        #: multipart uploads this process failed to abort: upload id -> (bucket, key, url);
        #: aborted at the next save to this store (stale_uploads.py); guarded by ``lock``
        self.unaborted = shared.unaborted
        self.lock = shared.lock

    def operation(self, probe: bool = False, quiet: bool = False) -> Operation:
        """A new operation (retry.py) against this filesystem's health."""
        return Operation(self.opts, self.health, probe=probe, quiet=quiet)

    def run(self, coro_fn: Callable[..., Awaitable[Any]], *args: Any) -> Any:
        """Runs a coroutine on the filesystem's event loop and waits for it."""
        from fsspec.asyn import sync  # fsspec internals, needed only by remote stores

        return sync(self.fs.loop, coro_fn, *args)

    # -- S3 request helpers ---------------------------------------------------------
    async def hook_client(self, bucket: str | None) -> bool:
        """Installs pyckpt's hooks on the S3 client (bodies rewound at each API call,
        botocore's own retried errors noted); False when it cannot (then bodies go as
        plain bytes and their progress is not watched)."""
        s3 = _s3fs_of(self.fs)
        if s3 is None:
            return False
        try:
            await s3.set_session()
            client = await s3.get_s3(bucket) if bucket else s3.s3
            for event, handler in _HOOKS:  # idempotent (unique ids)
                client.meta.events.register(event, handler, unique_id="pyckpt-" + event)
            return True
        except Exception:  # noqa: BLE001 - an s3fs without these internals: plain bodies
            return False

    def request(self, method: str, **kw: Any) -> Callable[[Attempt], Awaitable[Any]]:
        """One S3 API call with these parameters (a copy), as a retryable request."""
        params = dict(kw)

        async def request(att: Attempt) -> Any:
            return await self.fs._call_s3(method, **params)
        return request

    def s3_call(self, what: str, method: str, **kw: Any) -> Any:
        """One S3 API call as an operation of its own (blocking)."""
        async def go() -> Any:
            return await call_async(what, self.operation(), self.request(method, **kw))

        return self.run(go)

    async def send(self, att: Attempt, data: Any, watched: bool, method: str, **kw: Any) -> Any:
        """One S3 call with ``data`` as its body (a ``PartBody`` when ``watched``)."""
        body = PartBody(data, att) if watched else data
        return await self.fs._call_s3(method, Body=body, **kw)

    async def s3_get(self, att: Attempt, path: str, start: int | None, end: int | None,
                     into: list | None = None) -> Any:
        """One GET of the object (or of bytes [start, end)), every piece of its body
        progress of the attempt. ``into``: buffers of end - start bytes in all that
        the body is received into, in order (``_receive_into``); else the bytes are
        returned."""
        bucket, key, version = self.fs.split_path(path)
        kw: dict = {}
        if start is not None and end is not None:
            kw["Range"] = f"bytes={start}-{end - 1}"
        if version:
            kw["VersionId"] = version
        resp = await self.fs._call_s3("get_object", Bucket=bucket, Key=key, **kw)
        att.progress()
        body = resp["Body"]
        try:
            if into is not None:
                return await _receive_into(body, into, att, self.url(path), start, end)
            chunks = []
            while True:
                chunk = await body.read(_READ_CHUNK)
                if not chunk:
                    break
                chunks.append(chunk)
                att.progress()
        finally:
            body.close()
        return chunks[0] if len(chunks) == 1 else b"".join(chunks)

    def read_object(self, path: str) -> bytes:
        """The whole object (S3), its bytes watched."""
        async def go() -> bytes:
            await self.hook_client(self.fs.split_path(path)[0])
            return await call_async(f"read of {self.url(path)}", self.operation(),
                                    lambda att: self.s3_get(att, path, None, None))

        return self.run(go)

    def write_object(self, path: str, data: bytes) -> None:
        """One PUT (S3), its body watched."""
        bucket, key, _ = self.fs.split_path(path)

        async def go() -> None:
            watched = await self.hook_client(bucket)
            await call_async(f"write of {self.url(path)}", self.operation(),
                             lambda att: self.send(att, data, watched, "put_object",
                                                    Bucket=bucket, Key=key),
                             stall=self.opts.stall_timeout if watched else self.opts.timeout)

        self.run(go)


async def _receive_into(body: Any, into: list, att: Attempt, url: str, start: int | None,
                        end: int | None) -> Any:
    """Receives a GET's ``body`` into the buffers ``into``, in order, one network read
    at a time (aiohttp's ``readchunk`` hands over the bytes it received, without
    joining them: each byte is copied once, into place). Returns ``into`` when the
    body filled it exactly; a shorter body comes back as the parts filled (for the
    caller's length check); a longer one raises ``CorruptCheckpointError``."""
    views = [memoryview(b).cast("B") for b in into]
    size = sum(v.nbytes for v in views)
    content = getattr(getattr(body, "raw_stream", None), "content", None)
    readchunk = getattr(content, "readchunk", None)
    pos = k = off = 0  # bytes received; the buffer being filled, and how far
    while True:
        if readchunk is not None and content is not None:
            chunk, _ = await readchunk()
            if not chunk:
                if content.at_eof():
                    break
                continue  # the end of an HTTP chunk
        else:  # another HTTP backend: bounded reads
            chunk = await body.read(min(_READ_CHUNK, size - pos + 1))
            if not chunk:
                break
        n = len(chunk)
        if pos + n > size:
            raise CorruptCheckpointError(f"'{url}' returned more than the {size} bytes of "
                                         f"bytes [{start}, {end}) (a changed object?)")
        data, c = memoryview(chunk), 0
        while c < n:
            v = views[k]
            take = min(n - c, v.nbytes - off)
            v[off:off + take] = data[c:c + take]
            c, off = c + take, off + take
            if off == v.nbytes:
                k, off = k + 1, 0
        pos += n
        att.progress()
    return into if pos == size else views[:k] + [views[k][:off]]
