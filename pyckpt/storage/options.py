"""Tuning of remote (fsspec) storage, given as ``storage_options={"pyckpt": {...}}``
(the ``pyckpt`` entry is removed before the rest goes to fsspec)."""

from __future__ import annotations

import dataclasses
from typing import Any


@dataclasses.dataclass(frozen=True)
class RemoteOptions:
    #: Bytes per uploaded part (S3 multipart: at least 5 MiB) and per streamed write.
    part_size: int = 16 << 20
    #: Requests in flight at once (parts of any shard file, or ranged reads).
    max_concurrency: int = 8
    #: Attempts per request for transient errors (connection resets, timeouts, 5xx, throttling).
    retries: int = 5
    #: First backoff delay in seconds; doubles per attempt, with jitter, up to backoff_max.
    backoff: float = 0.2
    backoff_max: float = 5.0
    #: Seconds one request may take before it is abandoned and retried.
    timeout: float = 120.0
    #: Ranged reads closer than this are merged into one request...
    read_gap: int = 1 << 20
    #: ...unless the merged request would exceed this many bytes (also capped at
    #: read_batch_bytes / max_concurrency, so a batch keeps every connection busy).
    read_request_max: int = 16 << 20
    #: Bytes fetched per batch of a load (bounds memory; the next batch is prefetched).
    read_batch_bytes: int = 256 << 20

    @classmethod
    def split(cls, storage_options: dict | None) -> tuple["RemoteOptions", dict]:
        """(pyckpt's options, the options for fsspec)."""
        so = dict(storage_options or {})
        mine = so.pop("pyckpt", None) or {}
        if not isinstance(mine, dict):
            raise TypeError("storage_options['pyckpt'] must be a dict of RemoteOptions fields")
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = set(mine) - names
        if unknown:
            raise TypeError(f"unknown pyckpt storage options: {sorted(unknown)}; known: {sorted(names)}")
        opts = cls(**mine)
        if opts.part_size < 1 or opts.max_concurrency < 1 or opts.retries < 1:
            raise ValueError("part_size, max_concurrency and retries must be positive")
        return opts, so

    def key(self) -> Any:
        return dataclasses.astuple(self)
