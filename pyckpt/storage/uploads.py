"""Uploads of new files to an fsspec filesystem, streamed part by part from
their producers (``NewFile.fill``), so memory stays at about
``max_concurrency * part_size`` whatever the files' size:

- on S3 (s3fs): multipart uploads with up to ``max_concurrency`` parts of any
  file in flight, each part retried on transient errors; the bytes the HTTP
  client sends are watched, so a stalled server is noticed after
  ``stall_timeout`` seconds without a byte (retry.py);
- on GCS (gcsfs): a resumable upload per file, its parts in order, files in
  parallel, every request under the watchdog (bounded by the deadline);
- elsewhere: one streamed ``fs.open(path, "wb")`` per file, files in parallel,
  a failed file retried whole.

When an upload fails, every request still in flight is cancelled and a
bounded, best-effort cleanup runs (one attempt per request, ``cleanup_timeout``
in all): the upload's multipart uploads are aborted and its objects deleted.
The upload's own error is raised; what the cleanup could not do is added to it
as a note, and multipart uploads it could not abort are recorded and aborted at
the next save to the store (stale_uploads.py).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import functools
import logging
import threading
from typing import Any, Awaitable, Callable, Sequence

from .. import progress
from ..errors import CheckpointIOError, add_note
from .base import NewFile
from .remote_client import RemoteClient, gone
from .retry import Attempt, Operation, call_async, call_sync
from .tasks import bounded, gather_or_cancel

S3_MIN_PART = 5 << 20
GCS_PART_UNIT = 256 << 10


def _client_error(exc: BaseException | None) -> bool:
    """An HTTP 4xx answer (the server answered: the session is gone)."""
    code = getattr(exc, "code", None)
    return isinstance(code, int) and 400 <= code < 500
_MAX_RECORDED_ABORTS = 10_000

log = logging.getLogger("pyckpt.storage")


class _Uploads:
    """Multipart uploads a save started and has not completed: path -> (bucket, key, id)."""

    def __init__(self) -> None:
        self.open: dict[str, tuple[str, str, str]] = {}


class Uploader:
    """Uploads and, after a failure, the bounded cleanup of what they left."""

    def __init__(self, client: RemoteClient) -> None:
        self.client = client
        self.fs = client.fs
        self.opts = client.opts
        self.url = client.url

    def upload(self, files: Sequence[NewFile]) -> None:
        """Uploads the files whole (S3: multipart, parts of any file in parallel;
        elsewhere: one streamed write per file, files in parallel). On failure,
        cleans up (bounded, best effort) and raises the upload's own error."""
        # the progress counter of the caller, captured here: the upload runs on
        # fsspec's event-loop thread or a pool, where the caller's context is unknown
        done = progress.counter()
        if self.client.is_s3:
            self.client.run(self._s3_upload_all, files, done)
        elif self.client.is_gcs:
            self.client.run(self._gcs_upload_all, files, done)
        else:
            self._generic_upload(files, done)

    async def _gcs_upload_all(self, files: Sequence[NewFile], done: Any) -> None:
        """GCS (gcsfs): every file a resumable upload, its parts sent in order, up to
        ``max_concurrency`` files at once; each request under the watchdog (bytes are
        not observable: a request is bounded by what is left of the deadline). On
        failure the sessions are cancelled and the objects deleted (bounded)."""
        op = self.client.operation()
        sem = asyncio.Semaphore(self.opts.max_concurrency)
        sessions: dict[str, str] = {}
        try:
            await gather_or_cancel(self._gcs_upload_file(f, sem, done, op, sessions)
                                   for f in files)
        except BaseException as e:
            await self._gcs_cleanup(e, sessions, [f.path for f in files])
            raise

    async def _gcs_upload_file(self, file: NewFile, sem: asyncio.Semaphore, done: Any,
                               op: Operation, sessions: dict[str, str]) -> None:
        from gcsfs.core import initiate_upload, simple_upload, upload_chunk  # optional dependency

        fs, opts, path = self.fs, self.opts, file.path
        bucket, key, _ = fs.split_path(path)
        url = self.url(path)
        # a resumable upload's parts are multiples of 256 KiB, but for the last
        part_size = max(GCS_PART_UNIT, opts.part_size // GCS_PART_UNIT * GCS_PART_UNIT)
        async with sem:
            try:
                if file.size <= part_size:
                    body = await asyncio.to_thread(file.fill, 0, bytearray(file.size))
                    await call_async(f"upload of {url}", op, lambda att: simple_upload(
                        fs, bucket, key, bytes(body)), stall=opts.timeout)
                    if done is not None:
                        done.add(file.size)
                    return
                location = await call_async(
                    f"starting the upload of {url}", op,
                    lambda att: initiate_upload(fs, bucket, key))
                sessions[path] = location
                for b, e in file.parts(part_size):
                    body = bytes(await asyncio.to_thread(file.fill, b, bytearray(e - b)))

                    async def send(att: Attempt, b: int = b, body: bytes = body) -> Any:
                        return await upload_chunk(fs, location, body, b, file.size,
                                                  "application/octet-stream")
                    await call_async(f"upload of {url} part at bytes [{b}, {e})", op, send,
                                     stall=opts.timeout)
                    op.progress()
                    if done is not None:
                        done.add(e - b)
                sessions.pop(path, None)
            finally:
                fs.invalidate_cache(path)

    async def _gcs_cleanup(self, error: BaseException, sessions: dict[str, str],
                           paths: list[str]) -> None:
        """After a failed GCS upload: cancel its resumable sessions and delete its
        objects, one attempt each, ``cleanup_timeout`` in all; never raises."""
        fs = self.fs
        op = self.client.operation(probe=True, quiet=True)
        jobs: list[tuple[str, Awaitable[Any]]] = []
        for path, location in list(sessions.items()):
            label = f"cancel of the resumable upload of {self.url(path)}"

            async def cancel(att: Attempt, location: str = location) -> Any:
                return await fs._call("DELETE", location)
            jobs.append((label, call_async(label, op, cancel)))
        for path in paths:
            label = f"delete of {self.url(path)}"

            async def rm(att: Attempt, path: str = path) -> Any:
                return await fs._rm_file(path)
            jobs.append((label, call_async(label, op, rm)))
        results = await bounded(jobs, self.opts.cleanup_timeout)
        # a cancelled session answers 499 (or 4xx once gone): the object never appears
        failed = {label: exc for label, exc in results.items()
                  if not gone(exc) and not (label.startswith("cancel") and _client_error(exc))}
        for path in paths:
            fs.invalidate_cache(path)
        if failed:
            self._report(error, failed, False)

    async def _s3_upload_all(self, files: Sequence[NewFile], done: Any) -> None:
        op = self.client.operation()
        uploads = _Uploads()
        sem = asyncio.Semaphore(self.opts.max_concurrency)
        try:
            await gather_or_cancel(self._s3_upload_file(f, sem, done, op, uploads)
                                   for f in files)
        except BaseException as e:
            await self._s3_cleanup(e, uploads, [f.path for f in files])
            raise

    async def _s3_upload_file(self, file: NewFile, sem: asyncio.Semaphore, done: Any,
                              op: Operation, uploads: _Uploads) -> None:
        fs, opts, path = self.fs, self.opts, file.path
        bucket, key, _ = fs.split_path(path)
        url = self.url(path)
        part_size = max(opts.part_size, S3_MIN_PART)
        watched = await self.client.hook_client(bucket)
        stall = opts.stall_timeout if watched else opts.timeout
        if file.size <= part_size:
            async with sem:
                body = await asyncio.to_thread(file.fill, 0, bytearray(file.size))
                await call_async(f"upload of {url}", op, lambda att: self.client.send(
                    att, body, watched, "put_object", Bucket=bucket, Key=key), stall=stall)
                if done is not None:
                    done.add(file.size)
            return
        mpu = await call_async(f"starting the upload of {url}", op, lambda att: fs._call_s3(
            "create_multipart_upload", Bucket=bucket, Key=key))
        upload_id = mpu["UploadId"]
        uploads.open[path] = (bucket, key, upload_id)

        async def part(number: int, begin: int, end: int) -> dict:
            async with sem:
                # produced off the event loop (the engine's producer releases the GIL),
                # so the loop keeps other parts' requests going meanwhile
                body = await asyncio.to_thread(file.fill, begin, bytearray(end - begin))
                out = await call_async(
                    f"upload of {url} part {number} (bytes [{begin}, {end}))", op,
                    lambda att: self.client.send(att, body, watched, "upload_part",
                                                 Bucket=bucket, Key=key, UploadId=upload_id,
                                                 PartNumber=number),
                    stall=stall)
                if done is not None:
                    done.add(end - begin)
                return {"PartNumber": number, "ETag": out["ETag"]}

        try:
            parts = await gather_or_cancel(part(i + 1, b, e)
                                           for i, (b, e) in enumerate(file.parts(part_size)))
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
        op = self.client.operation(probe=True, quiet=True)
        jobs: list[tuple[str, Awaitable[Any]]] = []
        aborts: dict[str, tuple[str, str, str, str]] = {}
        for path, (bucket, key, upload_id) in list(uploads.open.items()):
            label = f"abort of the multipart upload of {self.url(path)} (upload id {upload_id})"
            aborts[label] = (upload_id, bucket, key, self.url(path))
            jobs.append((label, call_async(label, op, self.client.request(
                "abort_multipart_upload", Bucket=bucket, Key=key, UploadId=upload_id))))
        for path in paths:
            label = f"delete of {self.url(path)}"
            bucket, key, _ = fs.split_path(path)
            jobs.append((label, call_async(label, op, self.client.request(
                "delete_object", Bucket=bucket, Key=key))))
        results = await bounded(jobs, self.opts.cleanup_timeout)
        failed = {label: exc for label, exc in results.items() if not gone(exc)}
        for label, (upload_id, bucket, key, url) in aborts.items():
            if label in failed:
                self._record_unaborted(upload_id, bucket, key, url)
        for path in paths:
            fs.invalidate_cache(path)
        if failed:
            self._report(error, failed, any(label in aborts for label in failed))

    def _record_unaborted(self, upload_id: str, bucket: str, key: str, url: str) -> None:
        with self.client.lock:
            if len(self.client.unaborted) < _MAX_RECORDED_ABORTS:
                self.client.unaborted[upload_id] = (bucket, key, url)

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
        if self.client.is_s3 or self.client.is_async:
            def delete(p: str) -> Callable[[Attempt], Awaitable[Any]]:
                if self.client.is_s3:
                    bucket, key, _ = self.fs.split_path(p)
                    return self.client.request("delete_object", Bucket=bucket, Key=key)

                async def rm(att: Attempt) -> Any:
                    return await self.fs._rm_file(p)
                return rm

            async def go() -> dict:
                op = self.client.operation(probe=True, quiet=True)
                return await bounded([(f"delete of {self.url(p)}",
                                       call_async(f"delete of {self.url(p)}", op, delete(p)))
                                      for p in paths], self.opts.cleanup_timeout)
            results = self.client.run(go)
        else:
            results = self._bounded_sync([(f"delete of {self.url(p)}",
                                           functools.partial(self.fs.rm_file, p)) for p in paths])
        failed = {label: exc for label, exc in results.items() if not gone(exc)}
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
        op = self.client.operation(probe=True, quiet=True)
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

    def _generic_upload(self, files: Sequence[NewFile], done: Any) -> None:
        op = self.client.operation()
        stop = threading.Event()
        workers = max(1, min(len(files), self.opts.max_concurrency))
        pool = concurrent.futures.ThreadPoolExecutor(workers, thread_name_prefix="pyckpt-up")
        try:
            futs = [pool.submit(self._stream_file, f, done, op, stop) for f in files]
            for f in concurrent.futures.as_completed(futs):
                f.result()
        except BaseException as e:
            stop.set()  # the other files stop at their next part
            pool.shutdown(wait=False, cancel_futures=True)
            self.discard(e, [f.path for f in files])
            raise
        pool.shutdown(wait=True)

    def _stream_file(self, file: NewFile, done: Any, op: Operation,
                     stop: threading.Event) -> None:
        path = file.path

        def attempt() -> None:
            f = self.fs.open(path, "wb", block_size=max(self.opts.part_size, S3_MIN_PART))
            try:
                for b, e in file.parts(self.opts.part_size):
                    if stop.is_set():
                        raise CheckpointIOError(5, f"upload of {self.url(path)} stopped: "
                                                   "another file of the save failed")
                    f.write(file.fill(b, bytearray(e - b)))
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
