"""Parallel, retried object I/O over an fsspec filesystem.

Uploads stream each shard file part by part, straight from the tensors
(``_core.fill_range`` gathers a part's bytes, padding included, with the GIL
released), so memory stays at ``max_concurrency * part_size`` whatever the
checkpoint size:
- on S3 (s3fs): multipart uploads with up to ``max_concurrency`` parts of any
  file in flight, each part retried on transient errors; the bytes the HTTP
  client sends are watched, so a stalled server is noticed after
  ``stall_timeout`` seconds without a byte (retry.py);
- elsewhere: one streamed ``fs.open(path, "wb")`` per file, files in parallel,
  a failed file retried whole.
When an upload fails, every request still in flight is cancelled and a
bounded, best-effort cleanup runs (one attempt per request, ``cleanup_timeout``
in all): the save's multipart uploads are aborted and its objects deleted.
The upload's own error is raised; what the cleanup could not do is added to it
as a note, and multipart uploads it could not abort are recorded and aborted at
the next save to the store (``sweep_uploads``).

Downloads fetch byte ranges concurrently (S3: streamed ``get_object`` with
every chunk watched; other async filesystems: ``_cat_file``; others: a thread
pool), each retried.
"""

from __future__ import annotations

import asyncio
import bisect
import concurrent.futures
import functools
import io
import logging
import threading
import time
import weakref
from typing import Any, Awaitable, Callable, Iterable, Sequence

import numpy as np

from .. import _core, progress
from ..errors import CheckpointIOError, add_note
from .options import RemoteOptions
from .retry import Attempt, Health, Operation, call_async, call_sync, current_attempt

S3_MIN_PART = 5 << 20
_READ_CHUNK = 1 << 20
_MAX_LIST_PAGES = 20
_MAX_RECORDED_ABORTS = 10_000

log = logging.getLogger("pyckpt.storage")


class ShardLayout:
    """The tensors of one shard file, sorted by offset, to be streamed part by part."""

    def __init__(self, arrays: Sequence[np.ndarray], offsets: Sequence[int], size: int) -> None:
        order = sorted(range(len(arrays)), key=lambda i: offsets[i])
        self.arrays = [arrays[i] for i in order]
        self.offsets = [int(offsets[i]) for i in order]
        self.ends = [o + a.nbytes for o, a in zip(self.offsets, self.arrays)]
        self.size = size

    def fill(self, begin: int, buf: Any) -> Any:
        """Writes file bytes [begin, begin + len(buf)) into buf."""
        end = begin + len(buf)
        lo = bisect.bisect_right(self.ends, begin)
        hi = bisect.bisect_left(self.offsets, end)
        _core.fill_range(self.arrays[lo:hi], np.asarray(self.offsets[lo:hi], dtype=np.uint64),
                         begin, buf)
        return buf

    def parts(self, part_size: int) -> list[tuple[int, int]]:
        return [(b, min(b + part_size, self.size)) for b in range(0, self.size, part_size)] or [(0, 0)]


def _is_s3(fs: Any) -> bool:
    try:
        return hasattr(fs, "_call_s3") and hasattr(fs, "split_path") and hasattr(fs, "loop")
    except Exception:  # noqa: BLE001 - a wrapper without an S3 target
        return False


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


async def gather_or_cancel(coros: Iterable[Awaitable[Any]]) -> list:
    """Like asyncio.gather, but the first failure cancels the other tasks (and waits,
    briefly, for them to stop) before it is raised."""
    tasks = [asyncio.ensure_future(c) for c in coros]
    try:
        pending = set(tasks)
        while pending:
            done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_EXCEPTION)
            for t in tasks:
                if t in done and not t.cancelled() and t.exception() is not None:
                    raise t.exception()  # type: ignore[misc]
        return [t.result() for t in tasks]
    finally:
        rest = [t for t in tasks if not t.done()]
        for t in rest:
            t.cancel()
        if rest:
            await asyncio.wait(rest, timeout=2.0)
        for t in tasks:
            if t.done() and not t.cancelled():
                t.exception()


async def bounded(jobs: list[tuple[str, Awaitable[Any]]], timeout: float) -> dict[str, Any]:
    """Runs the jobs concurrently for at most ``timeout`` seconds; returns, per label,
    None (done), the exception raised, or a TimeoutError for one still running."""
    tasks = {asyncio.ensure_future(c): label for label, c in jobs}
    if not tasks:
        return {}
    done, pending = await asyncio.wait(tasks, timeout=timeout)
    for t in pending:
        t.cancel()
    if pending:
        await asyncio.wait(pending, timeout=2.0)
    out: dict[str, Any] = {}
    for t, label in tasks.items():
        if t in pending or t.cancelled():
            out[label] = TimeoutError(f"no answer within {timeout:g} s")
        else:
            out[label] = t.exception()
    return out


def _gone(exc: BaseException | None) -> bool:
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
        #: upload id -> (bucket, key, url); aborted at the next save (``sweep_uploads``)
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


class _Uploads:
    """Multipart uploads a save started and has not completed: path -> (bucket, key, id)."""

    def __init__(self) -> None:
        self.open: dict[str, tuple[str, str, str]] = {}


class RemoteIO:
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
        #: multipart uploads this process failed to abort: upload id -> (bucket, key, url);
        #: aborted at the next save to this store (``sweep_uploads``)
        self.unaborted = shared.unaborted
        self._lock = shared.lock

    def operation(self, probe: bool = False, quiet: bool = False) -> Operation:
        return Operation(self.opts, self.health, probe=probe, quiet=quiet)

    def run(self, coro_fn: Callable[..., Awaitable[Any]], *args: Any) -> Any:
        """Runs a coroutine on the filesystem's event loop and waits for it."""
        from fsspec.asyn import sync

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

    def _request(self, method: str, **kw: Any) -> Callable[[Attempt], Awaitable[Any]]:
        """One S3 API call with these parameters (a copy), as a retryable request."""
        params = dict(kw)

        async def request(att: Attempt) -> Any:
            return await self.fs._call_s3(method, **params)
        return request

    def s3_call(self, what: str, method: str, **kw: Any) -> Any:
        """One S3 API call as an operation of its own (blocking)."""
        async def go() -> Any:
            return await call_async(what, self.operation(), self._request(method, **kw))

        return self.run(go)

    async def _send(self, att: Attempt, data: Any, watched: bool, method: str, **kw: Any) -> Any:
        body = PartBody(data, att) if watched else data
        return await self.fs._call_s3(method, Body=body, **kw)

    async def _s3_get(self, att: Attempt, path: str, start: int | None, end: int | None) -> bytes:
        """One GET of the object (or of bytes [start, end)), its body read in chunks, each
        chunk progress of the attempt."""
        bucket, key, version = self.fs.split_path(path)
        kw: dict = {}
        if start is not None and end is not None:
            kw["Range"] = f"bytes={start}-{end - 1}"
        if version:
            kw["VersionId"] = version
        resp = await self.fs._call_s3("get_object", Bucket=bucket, Key=key, **kw)
        att.progress()
        body = resp["Body"]
        chunks = []
        try:
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
                                    lambda att: self._s3_get(att, path, None, None))

        return self.run(go)

    def write_object(self, path: str, data: bytes) -> None:
        """One PUT (S3), its body watched."""
        bucket, key, _ = self.fs.split_path(path)

        async def go() -> None:
            watched = await self.hook_client(bucket)
            await call_async(f"write of {self.url(path)}", self.operation(),
                             lambda att: self._send(att, data, watched, "put_object",
                                                    Bucket=bucket, Key=key),
                             stall=self.opts.stall_timeout if watched else self.opts.timeout)

        self.run(go)

    # -- uploads ------------------------------------------------------------------
    def upload(self, files: list[tuple[str, ShardLayout]]) -> None:
        # the progress counter of the caller, captured here: the upload runs on
        # fsspec's event-loop thread or a pool, where the caller's context is unknown
        done = progress.counter()
        if self.is_s3:
            self.run(self._s3_upload_all, files, done)
        else:
            self._generic_upload(files, done)

    async def _s3_upload_all(self, files: list[tuple[str, ShardLayout]], done: Any) -> None:
        op = self.operation()
        uploads = _Uploads()
        sem = asyncio.Semaphore(self.opts.max_concurrency)
        try:
            await gather_or_cancel(self._s3_upload_file(p, lay, sem, done, op, uploads)
                                   for p, lay in files)
        except BaseException as e:
            await self._s3_cleanup(e, uploads, [p for p, _ in files])
            raise

    async def _s3_upload_file(self, path: str, layout: ShardLayout, sem: asyncio.Semaphore,
                              done: Any, op: Operation, uploads: _Uploads) -> None:
        fs, opts = self.fs, self.opts
        bucket, key, _ = fs.split_path(path)
        url = self.url(path)
        part_size = max(opts.part_size, S3_MIN_PART)
        watched = await self.hook_client(bucket)
        stall = opts.stall_timeout if watched else opts.timeout
        if layout.size <= part_size:
            async with sem:
                body = await asyncio.to_thread(layout.fill, 0, bytearray(layout.size))
                await call_async(f"upload of {url}", op, lambda att: self._send(
                    att, body, watched, "put_object", Bucket=bucket, Key=key), stall=stall)
                if done is not None:
                    done.add(layout.size)
            return
        mpu = await call_async(f"starting the upload of {url}", op, lambda att: fs._call_s3(
            "create_multipart_upload", Bucket=bucket, Key=key))
        upload_id = mpu["UploadId"]
        uploads.open[path] = (bucket, key, upload_id)

        async def part(number: int, begin: int, end: int) -> dict:
            async with sem:
                # gathered off the event loop (the C++ copy releases the GIL), so the
                # loop keeps other parts' requests going meanwhile
                body = await asyncio.to_thread(layout.fill, begin, bytearray(end - begin))
                out = await call_async(
                    f"upload of {url} part {number} (bytes [{begin}, {end}))", op,
                    lambda att: self._send(att, body, watched, "upload_part", Bucket=bucket,
                                           Key=key, UploadId=upload_id, PartNumber=number),
                    stall=stall)
                if done is not None:
                    done.add(end - begin)
                return {"PartNumber": number, "ETag": out["ETag"]}

        try:
            parts = await gather_or_cancel(part(i + 1, b, e)
                                           for i, (b, e) in enumerate(layout.parts(part_size)))
            # the server may work a while on a large object before it answers: not a stall
            await call_async(f"completing the upload of {url}", op, lambda att: fs._call_s3(
                "complete_multipart_upload", Bucket=bucket, Key=key, UploadId=upload_id,
                MultipartUpload={"Parts": list(parts)}), stall=opts.timeout)
            uploads.open.pop(path, None)
        finally:
            fs.invalidate_cache(path)

    async def _s3_cleanup(self, error: BaseException, uploads: _Uploads, paths: list[str]) -> None:
        """After a failed upload: abort its multipart uploads and delete its objects, one
        attempt each, ``cleanup_timeout`` in all. Never raises: what it could not do is
        a note on ``error``, and unaborted uploads are recorded for the next save."""
        fs = self.fs
        op = self.operation(probe=True, quiet=True)
        jobs: list[tuple[str, Awaitable[Any]]] = []
        aborts: dict[str, tuple[str, str, str, str]] = {}
        for path, (bucket, key, upload_id) in list(uploads.open.items()):
            label = f"abort of the multipart upload of {self.url(path)} (upload id {upload_id})"
            aborts[label] = (upload_id, bucket, key, self.url(path))
            jobs.append((label, call_async(label, op, self._request(
                "abort_multipart_upload", Bucket=bucket, Key=key, UploadId=upload_id))))
        for path in paths:
            label = f"delete of {self.url(path)}"
            bucket, key, _ = fs.split_path(path)
            jobs.append((label, call_async(label, op, self._request(
                "delete_object", Bucket=bucket, Key=key))))
        results = await bounded(jobs, self.opts.cleanup_timeout)
        failed = {label: exc for label, exc in results.items() if not _gone(exc)}
        for label, (upload_id, bucket, key, url) in aborts.items():
            if label in failed:
                self._record_unaborted(upload_id, bucket, key, url)
        for path in paths:
            fs.invalidate_cache(path)
        if failed:
            self._report(error, failed, any(label in aborts for label in failed))

    def _record_unaborted(self, upload_id: str, bucket: str, key: str, url: str) -> None:
        with self._lock:
            if len(self.unaborted) < _MAX_RECORDED_ABORTS:
                self.unaborted[upload_id] = (bucket, key, url)

    def _report(self, error: BaseException, failed: dict[str, BaseException],
                unaborted: bool) -> None:
        lines = [f"  {label}: {type(exc).__name__}: {exc}" for label, exc in failed.items()]
        note = ("pyckpt: the cleanup after this failure did not finish (best effort, "
                f"{self.opts.cleanup_timeout:g} s):\n" + "\n".join(lines))
        if unaborted:
            note += ("\n  The multipart uploads left open were recorded and are aborted at the "
                     "next save to this store; set a bucket lifecycle rule "
                     "(AbortIncompleteMultipartUpload, docs/PROTOCOL.md) for the rest.")
        add_note(error, note)
        log.warning("%s", note)

    def discard(self, error: BaseException, paths: list[str]) -> None:
        """Best-effort, bounded deletion of a failed save's objects (one attempt each,
        ``cleanup_timeout`` in all); what fails becomes a note on ``error``."""
        if not paths:
            return
        if self.is_s3 or self.is_async:
            def delete(p: str) -> Callable[[Attempt], Awaitable[Any]]:
                if self.is_s3:
                    bucket, key, _ = self.fs.split_path(p)
                    return self._request("delete_object", Bucket=bucket, Key=key)

                async def rm(att: Attempt) -> Any:
                    return await self.fs._rm_file(p)
                return rm

            async def go() -> dict:
                op = self.operation(probe=True, quiet=True)
                return await bounded([(f"delete of {self.url(p)}",
                                       call_async(f"delete of {self.url(p)}", op, delete(p)))
                                      for p in paths], self.opts.cleanup_timeout)
            results = self.run(go)
        else:
            results = self._bounded_sync([(f"delete of {self.url(p)}",
                                           functools.partial(self.fs.rm_file, p)) for p in paths])
        failed = {label: exc for label, exc in results.items() if not _gone(exc)}
        for p in paths:
            try:
                self.fs.invalidate_cache(p)
            except Exception:  # noqa: BLE001
                pass
        if failed:
            self._report(error, failed, False)

    def _bounded_sync(self, jobs: list[tuple[str, Callable[[], Any]]]) -> dict[str, Any]:
        """``bounded`` for blocking calls: threads, abandoned (not joined) after the limit."""
        out: dict[str, Any] = {}
        op = self.operation(probe=True, quiet=True)
        pool = concurrent.futures.ThreadPoolExecutor(max(1, min(len(jobs), 8)),
                                                     thread_name_prefix="pyckpt-cleanup")
        try:
            futs = {pool.submit(call_sync, label, op, fn): label for label, fn in jobs}
            done, pending = concurrent.futures.wait(futs, timeout=self.opts.cleanup_timeout)
            for f, label in futs.items():
                out[label] = (TimeoutError(f"no answer within {self.opts.cleanup_timeout:g} s")
                              if f in pending else f.exception())
        finally:
            pool.shutdown(wait=False, cancel_futures=True)
        return out

    def _generic_upload(self, files: list[tuple[str, ShardLayout]], done: Any) -> None:
        op = self.operation()
        stop = threading.Event()
        workers = max(1, min(len(files), self.opts.max_concurrency))
        pool = concurrent.futures.ThreadPoolExecutor(workers, thread_name_prefix="pyckpt-up")
        try:
            futs = [pool.submit(self._stream_file, p, lay, done, op, stop) for p, lay in files]
            for f in concurrent.futures.as_completed(futs):
                f.result()
        except BaseException as e:
            stop.set()  # the other files stop at their next part
            pool.shutdown(wait=False, cancel_futures=True)
            self.discard(e, [p for p, _ in files])
            raise
        pool.shutdown(wait=True)

    def _stream_file(self, path: str, layout: ShardLayout, done: Any, op: Operation,
                     stop: threading.Event) -> None:
        def attempt() -> None:
            f = self.fs.open(path, "wb", block_size=max(self.opts.part_size, S3_MIN_PART))
            try:
                for b, e in layout.parts(self.opts.part_size):
                    if stop.is_set():
                        raise CheckpointIOError(5, f"upload of {self.url(path)} stopped: "
                                                   "another file of the save failed")
                    f.write(layout.fill(b, bytearray(e - b)))
                    op.progress()
                    if done is not None:
                        done.add(e - b)
            except BaseException:
                if hasattr(f, "discard"):
                    f.discard()  # do not publish a half-written object
                else:
                    f.close()
                raise
            f.close()

        call_sync(f"upload of {self.url(path)}", op, attempt)

    # -- stale multipart uploads --------------------------------------------------------
    async def _list_uploads(self, prefix: str) -> list[dict]:
        """The open multipart uploads of keys under ``prefix`` + "/" (S3), at most
        ``_MAX_LIST_PAGES`` pages."""
        bucket, key, _ = self.fs.split_path(prefix)
        kw: dict = {"Bucket": bucket, "Prefix": key.rstrip("/") + "/"}
        out: list[dict] = []
        op = self.operation(quiet=True)
        for _ in range(_MAX_LIST_PAGES):
            page = await call_async(f"listing the multipart uploads under {self.url(prefix)}", op,
                                    self._request("list_multipart_uploads", **kw))
            for u in page.get("Uploads") or []:
                out.append({**u, "Bucket": bucket})
            if not page.get("IsTruncated"):
                break
            kw["KeyMarker"] = page.get("NextKeyMarker") or (out[-1]["Key"] if out else "")
            kw["UploadIdMarker"] = page.get("NextUploadIdMarker") or ""
        return out

    async def _abort_all(self, uploads: list[tuple[str, str, str]]) -> dict[str, Any]:
        """Aborts (bucket, key, upload id) uploads, one attempt each, bounded."""
        op = self.operation(probe=True, quiet=True)
        return await bounded([(upload_id, call_async(
            f"abort of the multipart upload {upload_id}", op,
            self._request("abort_multipart_upload", Bucket=bucket, Key=key, UploadId=upload_id)))
            for bucket, key, upload_id in uploads], self.opts.cleanup_timeout)

    def sweep_uploads(self, prefix: str, keep_attempt: str | None,
                      is_live: Callable[[str], bool | None]) -> list[str]:
        """Aborts the multipart uploads that failed saves left open (S3; best effort,
        bounded; returns the keys aborted):

        - those this process recorded when its cleanup could not abort them (any prefix);
        - under ``prefix`` (a checkpoint), those of pyckpt data files
          (``data-<attempt>-<rank>-<i>.bin``) of another attempt than ``keep_attempt``
          that ``is_live(attempt)`` says have ended (False), or that were started more
          than ``stale_upload_age`` seconds ago.

        Uploads of other keys are never touched."""
        if not self.is_s3:
            return []
        from ..engine import naming

        opts = self.opts
        try:
            uploads = self.run(lambda: asyncio.wait_for(self._list_uploads(prefix),
                                                        opts.cleanup_timeout))
        except Exception as e:  # noqa: BLE001 - best effort: the save itself goes on
            log.info("pyckpt: could not list the multipart uploads under %s: %s",
                     self.url(prefix), e)
            uploads = []
        bucket0, base, _ = self.fs.split_path(prefix)
        base = base.rstrip("/") + "/"
        with self._lock:
            recorded = dict(self.unaborted)
        doomed: dict[str, tuple[str, str, str]] = {
            u: (b, k, u) for u, (b, k, _) in recorded.items()}
        liveness: dict[str, bool | None] = {}
        now = time.time()
        for u in uploads:
            key, upload_id = u.get("Key", ""), u.get("UploadId", "")
            name = key[len(base):] if key.startswith(base) else ""
            if not naming.is_data_file(name):
                continue
            attempt = naming.attempt_of(name)
            if attempt == keep_attempt:
                continue
            started = u.get("Initiated")
            age = now - started.timestamp() if hasattr(started, "timestamp") else 0.0
            if age < opts.stale_upload_age:
                if attempt not in liveness:
                    try:
                        liveness[attempt] = is_live(attempt)
                    except Exception:  # noqa: BLE001 - unknown: keep it
                        liveness[attempt] = True
                if liveness[attempt] is not False:
                    continue
            doomed[upload_id] = (u["Bucket"], key, upload_id)
        if not doomed:
            return []
        try:
            results = self.run(self._abort_all, list(doomed.values()))
        except Exception as e:  # noqa: BLE001
            log.info("pyckpt: could not abort stale multipart uploads: %s", e)
            return []
        aborted = []
        with self._lock:
            for upload_id, exc in results.items():
                if _gone(exc):
                    self.unaborted.pop(upload_id, None)
                    aborted.append(doomed[upload_id][1])
        if aborted:
            log.info("pyckpt: aborted %d multipart upload(s) left open by failed saves: %s",
                     len(aborted), ", ".join(aborted[:5]))
        return aborted

    def abort_uploads_under(self, prefix: str) -> list[str]:
        """Aborts every open multipart upload under ``prefix`` (a prefix being deleted);
        best effort, bounded; returns the keys aborted."""
        if not self.is_s3:
            return []
        try:
            uploads = self.run(lambda: asyncio.wait_for(self._list_uploads(prefix),
                                                        self.opts.cleanup_timeout))
            if not uploads:
                return []
            results = self.run(self._abort_all, [(u["Bucket"], u["Key"], u["UploadId"])
                                                 for u in uploads])
        except Exception as e:  # noqa: BLE001 - best effort
            log.info("pyckpt: could not abort the multipart uploads under %s: %s",
                     self.url(prefix), e)
            return []
        keys = {u["UploadId"]: u["Key"] for u in uploads}
        return [keys[u] for u, exc in results.items() if _gone(exc)]

    # -- downloads ----------------------------------------------------------------
    def fetch(self, ranges: Sequence[tuple[str, int, int]]) -> list[bytes]:
        """Bytes [start, end) of each (path, start, end), fetched concurrently."""
        if not ranges:
            return []
        if self.is_async:
            return self._run_fetch(list(ranges))
        op = self.operation()
        workers = max(1, min(len(ranges), self.opts.max_concurrency))
        with concurrent.futures.ThreadPoolExecutor(workers, thread_name_prefix="pyckpt-get") as pool:
            return list(pool.map(lambda r: self._fetch_one_sync(op, *r), ranges))

    def _run_fetch(self, ranges: list[tuple[str, int, int]]) -> list[bytes]:
        return self.run(self._fetch_async, ranges)

    def _check(self, data: bytes, path: str, start: int, end: int) -> bytes:
        if len(data) != end - start:
            from ..errors import CorruptCheckpointError

            raise CorruptCheckpointError(f"'{self.url(path)}' returned {len(data)} bytes for "
                                         f"bytes [{start}, {end}) (truncated object?)")
        return data

    def _fetch_one_sync(self, op: Operation, path: str, start: int, end: int) -> bytes:
        data = call_sync(f"read of {self.url(path)} bytes [{start}, {end})", op,
                         lambda: self.fs.cat_file(path, start=start, end=end))
        return self._check(data, path, start, end)

    async def _fetch_async(self, ranges: list[tuple[str, int, int]]) -> list[bytes]:
        sem = asyncio.Semaphore(self.opts.max_concurrency)
        op = self.operation()
        s3 = self.s3_native
        if s3:
            for bucket in {self.fs.split_path(p)[0] for p, _, _ in ranges}:
                await self.hook_client(bucket)

        async def one(path: str, start: int, end: int) -> bytes:
            if end <= start:
                return b""
            async with sem:
                what = f"read of {self.url(path)} bytes [{start}, {end})"
                if s3:
                    data = await call_async(what, op,
                                            lambda att: self._s3_get(att, path, start, end))
                else:  # the bytes of _cat_file cannot be watched: a transfer's limit
                    data = await call_async(what, op, lambda att: self.fs._cat_file(
                        path, start=start, end=end), stall=self.opts.timeout)
            return self._check(data, path, start, end)

        return list(await gather_or_cancel(one(*r) for r in ranges))
