"""Ranged reads from an fsspec filesystem, concurrently: on S3 (s3fs) streamed
``get_object`` requests with every chunk of the body watched (a stalled
transfer is noticed after ``stall_timeout`` seconds without a byte); on other
async filesystems ``_cat_file``; elsewhere a thread pool. Each request is
retried (retry.py); a short answer is refused."""

from __future__ import annotations

import asyncio
import concurrent.futures
from typing import Any, Sequence

from ..errors import CorruptCheckpointError
from .base import ByteRange, buffer_size
from .remote_client import RemoteClient
from .retry import Operation, call_async, call_sync
from .tasks import gather_or_cancel


class Downloader:
    """Concurrent, retried ranged reads of one filesystem."""

    def __init__(self, client: RemoteClient) -> None:
        self.client = client
        self.fs = client.fs
        self.opts = client.opts
        self.url = client.url

    def fetch(self, ranges: Sequence[ByteRange], into: Sequence[Any] | None = None) -> list[Any]:
        """The bytes of each range, fetched concurrently (one operation of retry.py).
        ``into``: per range, None or the list of buffers that its S3 body is received
        into (``Store.fetch``)."""
        if not ranges:
            return []
        if self.client.is_async:
            return self._run_fetch(list(ranges), list(into) if into is not None
                                   else [None] * len(ranges))
        op = self.client.operation()
        workers = max(1, min(len(ranges), self.opts.max_concurrency))
        with concurrent.futures.ThreadPoolExecutor(workers, thread_name_prefix="pyckpt-get") as pool:
            return list(pool.map(lambda r: self._fetch_one_sync(op, *r), ranges))

    def _run_fetch(self, ranges: list[ByteRange], into: list[Any]) -> list[Any]:
        return self.client.run(self._fetch_async, ranges, into)

    def _check(self, data: Any, path: str, start: int, end: int) -> Any:
        n = buffer_size(data)
        if n != end - start:
            raise CorruptCheckpointError(f"'{self.url(path)}' returned {n} bytes for "
                                         f"bytes [{start}, {end}) (truncated object?)")
        return data

    def _fetch_one_sync(self, op: Operation, path: str, start: int, end: int) -> bytes:
        data = call_sync(f"read of {self.url(path)} bytes [{start}, {end})", op,
                         lambda: self.fs.cat_file(path, start=start, end=end))
        return self._check(data, path, start, end)

    async def _fetch_async(self, ranges: list[ByteRange], into: list[Any]) -> list[Any]:
        sem = asyncio.Semaphore(self.opts.max_concurrency)
        op = self.client.operation()
        s3 = self.client.s3_native
        if s3:
            for bucket in {self.fs.split_path(p)[0] for p, _, _ in ranges}:
                await self.client.hook_client(bucket)

        async def one(path: str, start: int, end: int, dst: Any) -> Any:
            if end <= start:
                return b""
            async with sem:
                what = f"read of {self.url(path)} bytes [{start}, {end})"
                if s3:
                    data = await call_async(what, op, lambda att: self.client.s3_get(
                        att, path, start, end, dst))
                else:  # the bytes of _cat_file cannot be watched: a transfer's limit
                    data = await call_async(what, op, lambda att: self.fs._cat_file(
                        path, start=start, end=end), stall=self.opts.timeout)
            return self._check(data, path, start, end)

        return list(await gather_or_cancel(one(*r, d) for r, d in zip(ranges, into)))
