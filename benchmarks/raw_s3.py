"""The S3 server's own limit, for bench_s3.py: the same bytes moved with the fewest
client steps botocore allows, at the best concurrency.

* save: one multipart upload per object, its parts (``part`` bytes, sliced from the
  state once, untimed) sent with ``upload_part`` by up to ``concurrency`` requests at
  once over all objects, then ``complete_multipart_upload``;
* load: ranged ``get_object`` requests of ``part`` bytes, up to ``concurrency`` at
  once, each body received into its place in one buffer as the network hands it over
  (aiohttp's ``readchunk``: every byte copied once). The buffer is allocated once and
  reused (``load``; the limit for loads into preallocated arrays), or allocated anew
  for every load (``load(fresh=True)``; the limit for loads that return new arrays,
  which pay the kernel's page faults of new memory).

Everything runs on s3fs's event loop through its aiobotocore client (the same client
pyckpt and DCP use), with a connection pool large enough for the highest concurrency.
A sweep over concurrencies picks the best per direction; bench_s3.py then times that
configuration in its interleaved rounds as "raw limit C".
"""

from __future__ import annotations

import asyncio
import statistics
import time
from typing import Any

import fsspec
import numpy as np
from fsspec.asyn import sync

MiB = 1 << 20


class RawS3:
    """Raw transfers of ``objects`` (a list of bytes, one per object) under a prefix."""

    def __init__(self, so: dict, bucket: str, objects: list[bytes], part: int = 16 * MiB,
                 max_concurrency: int = 64) -> None:
        config = {**so.get("config_kwargs", {}), "max_pool_connections": max_concurrency}
        self.fs = fsspec.filesystem("s3", **{**so, "config_kwargs": config},
                                    skip_instance_cache=True)
        self.bucket, self.part = bucket, part
        self.sizes = [len(o) for o in objects]
        self.parts = [[o[a:a + part] for a in range(0, len(o), part)] for o in objects]
        self.into = np.empty(sum(self.sizes), np.uint8)
        self.into[:] = 0  # its pages exist: reused loads pay no page faults
        self.offsets = [sum(self.sizes[:i]) for i in range(len(objects))]

    def _key(self, prefix: str, i: int) -> str:
        return f"{prefix}/obj-{i:03d}.bin"

    async def _call(self, method: str, **kw: Any) -> Any:
        await self.fs.set_session()
        return await self.fs._call_s3(method, **kw)

    async def _save(self, prefix: str, concurrency: int) -> None:
        sem = asyncio.Semaphore(concurrency)

        async def one(i: int) -> None:
            key = self._key(prefix, i)
            mpu = await self._call("create_multipart_upload", Bucket=self.bucket, Key=key)
            uid = mpu["UploadId"]

            async def part(n: int, body: bytes) -> dict:
                async with sem:
                    out = await self._call("upload_part", Bucket=self.bucket, Key=key,
                                           UploadId=uid, PartNumber=n + 1, Body=body)
                return {"PartNumber": n + 1, "ETag": out["ETag"]}

            done = await asyncio.gather(*(part(n, b) for n, b in enumerate(self.parts[i])))
            await self._call("complete_multipart_upload", Bucket=self.bucket, Key=key,
                             UploadId=uid, MultipartUpload={"Parts": list(done)})

        await asyncio.gather(*(one(i) for i in range(len(self.parts))))

    async def _load(self, prefix: str, concurrency: int, into: np.ndarray) -> None:
        sem = asyncio.Semaphore(concurrency)
        view = memoryview(into)

        async def get(i: int, a: int, b: int) -> None:
            async with sem:
                resp = await self._call("get_object", Bucket=self.bucket,
                                        Key=self._key(prefix, i), Range=f"bytes={a}-{b - 1}")
                body = resp["Body"]
                content = body.raw_stream.content
                pos = start = self.offsets[i] + a
                while True:
                    chunk, _ = await content.readchunk()
                    if not chunk:
                        if content.at_eof():
                            break
                        continue
                    if pos + len(chunk) > start + b - a:
                        raise AssertionError(f"long read of object {i} [{a}, {b})")
                    view[pos:pos + len(chunk)] = chunk
                    pos += len(chunk)
                body.close()
            if pos - start != b - a:
                raise AssertionError(f"short read of object {i} [{a}, {b})")

        await asyncio.gather(*(get(i, a, min(a + self.part, size))
                               for i, size in enumerate(self.sizes)
                               for a in range(0, size, self.part)))

    def save(self, prefix: str, concurrency: int) -> None:
        sync(self.fs.loop, self._save, prefix, concurrency)

    def load(self, prefix: str, concurrency: int, fresh: bool = False) -> np.ndarray:
        into = np.empty(len(self.into), np.uint8) if fresh else self.into
        sync(self.fs.loop, self._load, prefix, concurrency, into)
        return into

    def sweep(self, prefix: str, concurrencies: tuple[int, ...], rounds: int,
              clean: Any) -> dict:
        """Median seconds of a save and a load at each concurrency (``clean(prefix)``
        after each round); the best concurrency per direction."""
        out: dict = {"save": {}, "load": {}}
        for c in concurrencies:
            saves, loads = [], []
            for r in range(rounds):
                p = f"{prefix}/c{c}-r{r}"
                t = time.perf_counter()
                self.save(p, c)
                saves.append(time.perf_counter() - t)
                t = time.perf_counter()
                self.load(p, c)
                loads.append(time.perf_counter() - t)
                clean(p)
            out["save"][c] = statistics.median(saves)
            out["load"][c] = statistics.median(loads)
        out["best"] = {d: min(out[d], key=out[d].get) for d in ("save", "load")}
        return out
