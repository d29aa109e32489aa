"""Tuning of remote (fsspec) storage, given as ``storage_options={"pyckpt": {...}}``
(the ``pyckpt`` entry is removed before the rest goes to fsspec).

Failure handling (docs/PROTOCOL.md, "Timeouts, retries and cleanup"): a request
that moves no bytes for ``stall_timeout`` seconds is abandoned and retried; an
operation (one upload of a save's shard files, one batch of ranged reads, one
metadata call) stops retrying once it has made no progress for ``deadline``
seconds, or after ``retries`` attempts of one request; the cleanup after a
failed save (aborting its multipart uploads, deleting its objects) is one
best-effort attempt bounded by ``cleanup_timeout``.
"""

from __future__ import annotations

import dataclasses
from typing import Any

#: The shortest last attempt of an operation near its deadline, in seconds (retry.py).
LAST_ATTEMPT_MIN = 1.0


@dataclasses.dataclass(frozen=True)
class RemoteOptions:
    #: Bytes per uploaded part (S3 multipart: at least 5 MiB) and per streamed write.
    part_size: int = 16 << 20
    #: Requests in flight at once (parts of any shard file, or ranged reads).
    max_concurrency: int = 8
    #: Attempts per request for transient errors (connection resets, timeouts, stalls,
    #: 5xx, throttling), within the operation's ``deadline``.
    retries: int = 5
    #: First backoff delay in seconds; doubles per attempt, with jitter, up to backoff_max.
    backoff: float = 0.2
    backoff_max: float = 5.0
    #: Seconds one request may take in all, however steadily its bytes flow.
    timeout: float = 120.0
    #: Seconds a request may go without moving a byte (sending its body or receiving its
    #: response) before it is abandoned as stalled and retried. Requests whose bytes
    #: cannot be watched (metadata requests, non-S3 transfers) count as stalled when
    #: they have not finished within this time (metadata) or ``timeout`` (transfers).
    stall_timeout: float = 30.0
    #: Seconds an operation may go without progress (no byte moved, no request
    #: finished), retries and backoff included, before it gives up with
    #: CheckpointIOError. Also how long a store that stopped answering is treated as
    #: unreachable: meanwhile each request gets one attempt of ``cleanup_timeout``.
    deadline: float = 60.0
    #: Seconds the best-effort cleanup after a failure may take (abort the save's
    #: multipart uploads, delete its objects), each request one attempt.
    cleanup_timeout: float = 10.0
    #: Multipart uploads of pyckpt data files under a checkpoint's prefix that were
    #: started this many seconds ago are aborted at the next save there, even when
    #: their save attempt still looks live (uploads of ended attempts are aborted at
    #: once). Set a bucket lifecycle rule too (docs/PROTOCOL.md).
    stale_upload_age: float = 24 * 3600.0
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
        for name in ("timeout", "stall_timeout", "deadline", "cleanup_timeout"):
            if not getattr(opts, name) > 0:
                raise ValueError(f"pyckpt storage option {name} must be a positive number of seconds")
        return opts, so

    def failure_bound(self) -> float:
        """The most seconds any route to a store that stopped answering takes to fail
        once no byte moves (a save, a load, a copy, an export, a persist): the failing
        operation's ``deadline``, plus its last backoff delay or its last attempt's
        minimum (1 s), whichever is longer, then the follow-up window of the failure,
        ``3 * cleanup_timeout``, which bounds every step after it together (the cleanup
        of the upload or of the attempt's files, the check of the index, the removal of
        the attempt's marker, the release of a lease). 95 s with the defaults;
        docs/PROTOCOL.md, section 1c."""
        return self.deadline + max(self.backoff_max, LAST_ATTEMPT_MIN) + 3 * self.cleanup_timeout

    def key(self) -> Any:
        return dataclasses.astuple(self)
