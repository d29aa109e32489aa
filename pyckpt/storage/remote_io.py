"""Parallel, retried object I/O over an fsspec filesystem.

Uploads stream each shard file part by part, straight from the tensors
(``_core.fill_range`` gathers a part's bytes, padding included, with the GIL
released), so memory stays at ``max_concurrency * part_size`` whatever the
checkpoint size:
- on S3 (s3fs): multipart uploads with up to ``max_concurrency`` parts of any
  file in flight, each part retried on transient errors with a timeout; a
  failed upload is aborted so no parts linger;
- elsewhere: one streamed ``fs.open(path, "wb")`` per file, files in parallel,
  a failed file retried whole.
Downloads fetch byte ranges concurrently (async filesystems: ``_cat_file`` with
a semaphore; others: a thread pool), each retried with a timeout.
"""

from __future__ import annotations

import asyncio
import bisect
import concurrent.futures
from typing import Any, Sequence

import numpy as np

from .. import _core, progress
from .options import RemoteOptions
from .retry import retry_async, retry_sync

S3_MIN_PART = 5 << 20


class ShardLayout:
    """The tensors of one shard file, sorted by offset, to be streamed part by part."""

    def __init__(self, arrays: Sequence[np.ndarray], offsets: Sequence[int], size: int) -> None:
        order = sorted(range(len(arrays)), key=lambda i: offsets[i])
        self.arrays = [arrays[i] for i in order]
        self.offsets = [int(offsets[i]) for i in order]
        self.ends = [o + a.nbytes for o, a in zip(self.offsets, self.arrays)]
        self.size = size

    def fill(self, begin: int, buf: bytearray) -> bytearray:
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


class RemoteIO:
    def __init__(self, fs: Any, opts: RemoteOptions, url: Any) -> None:
        self.fs = fs
        self.opts = opts
        self.url = url  # path -> URL for messages
        self.is_async = bool(getattr(fs, "async_impl", False)) and hasattr(fs, "_cat_file")

    def _run(self, coro_fn: Any, *args: Any) -> Any:
        from fsspec.asyn import sync

        return sync(self.fs.loop, coro_fn, *args)

    # -- uploads ------------------------------------------------------------------
    def upload(self, files: list[tuple[str, ShardLayout]]) -> None:
        # the progress counter of the caller, captured here: the upload runs on
        # fsspec's event-loop thread or a pool, where the caller's context is unknown
        done = progress.counter()
        if _is_s3(self.fs):
            self._run(self._s3_upload_all, files, done)
            return
        workers = max(1, min(len(files), self.opts.max_concurrency))
        with concurrent.futures.ThreadPoolExecutor(workers, thread_name_prefix="pyckpt-up") as pool:
            for f in [pool.submit(self._stream_file, p, lay, done) for p, lay in files]:
                f.result()

    def _stream_file(self, path: str, layout: ShardLayout, done: Any) -> None:
        def attempt() -> None:
            with self.fs.open(path, "wb", block_size=max(self.opts.part_size, S3_MIN_PART)) as f:
                for b, e in layout.parts(self.opts.part_size):
                    f.write(layout.fill(b, bytearray(e - b)))
                    if done is not None:
                        done.add(e - b)

        retry_sync(f"upload of {self.url(path)}", self.opts, attempt)

    async def _s3_upload_all(self, files: list[tuple[str, ShardLayout]], done: Any) -> None:
        sem = asyncio.Semaphore(self.opts.max_concurrency)
        await asyncio.gather(*(self._s3_upload_file(p, lay, sem, done) for p, lay in files))

    async def _s3_upload_file(self, path: str, layout: ShardLayout, sem: asyncio.Semaphore,
                              done: Any) -> None:
        fs, opts = self.fs, self.opts
        bucket, key, _ = fs.split_path(path)
        url = self.url(path)
        part_size = max(opts.part_size, S3_MIN_PART)
        if layout.size <= part_size:
            async with sem:
                body = await asyncio.to_thread(layout.fill, 0, bytearray(layout.size))
                await retry_async(f"upload of {url}", opts, lambda: fs._call_s3(
                    "put_object", Bucket=bucket, Key=key, Body=body))
                if done is not None:
                    done.add(layout.size)
            return
        mpu = await retry_async(f"starting the upload of {url}", opts, lambda: fs._call_s3(
            "create_multipart_upload", Bucket=bucket, Key=key))
        upload_id = mpu["UploadId"]

        async def part(number: int, begin: int, end: int) -> dict:
            async with sem:
                # gathered off the event loop (the C++ copy releases the GIL), so the
                # loop keeps other parts' requests going meanwhile
                body = await asyncio.to_thread(layout.fill, begin, bytearray(end - begin))
                out = await retry_async(
                    f"upload of {url} part {number} (bytes [{begin}, {end}))", opts,
                    lambda: fs._call_s3("upload_part", Bucket=bucket, Key=key, UploadId=upload_id,
                                        PartNumber=number, Body=body))
                if done is not None:
                    done.add(end - begin)
                return {"PartNumber": number, "ETag": out["ETag"]}

        try:
            parts = await asyncio.gather(*(part(i + 1, b, e)
                                           for i, (b, e) in enumerate(layout.parts(part_size))))
            await retry_async(f"completing the upload of {url}", opts, lambda: fs._call_s3(
                "complete_multipart_upload", Bucket=bucket, Key=key, UploadId=upload_id,
                MultipartUpload={"Parts": list(parts)}))
        except BaseException:
            try:
                await fs._call_s3("abort_multipart_upload", Bucket=bucket, Key=key,
                                  UploadId=upload_id)
            except Exception:  # noqa: BLE001 - best effort; lifecycle rules clean the rest
                pass
            raise
        finally:
            fs.invalidate_cache(path)

    # -- downloads ----------------------------------------------------------------
    def fetch(self, ranges: Sequence[tuple[str, int, int]]) -> list[bytes]:
        """Bytes [start, end) of each (path, start, end), fetched concurrently."""
        if not ranges:
            return []
        if self.is_async:
            return self._run(self._fetch_async, list(ranges))
        workers = max(1, min(len(ranges), self.opts.max_concurrency))
        with concurrent.futures.ThreadPoolExecutor(workers, thread_name_prefix="pyckpt-get") as pool:
            return list(pool.map(lambda r: self._fetch_one_sync(*r), ranges))

    def _check(self, data: bytes, path: str, start: int, end: int) -> bytes:
        if len(data) != end - start:
            from ..errors import CorruptCheckpointError

            raise CorruptCheckpointError(f"'{self.url(path)}' returned {len(data)} bytes for "
                                         f"bytes [{start}, {end}) (truncated object?)")
        return data

    def _fetch_one_sync(self, path: str, start: int, end: int) -> bytes:
        data = retry_sync(f"read of {self.url(path)} bytes [{start}, {end})", self.opts,
                          lambda: self.fs.cat_file(path, start=start, end=end))
        return self._check(data, path, start, end)

    async def _fetch_async(self, ranges: list[tuple[str, int, int]]) -> list[bytes]:
        sem = asyncio.Semaphore(self.opts.max_concurrency)

        async def one(path: str, start: int, end: int) -> bytes:
            async with sem:
                data = await retry_async(f"read of {self.url(path)} bytes [{start}, {end})",
                                         self.opts,
                                         lambda: self.fs._cat_file(path, start=start, end=end))
            return self._check(data, path, start, end)

        return list(await asyncio.gather(*(one(*r) for r in ranges)))
