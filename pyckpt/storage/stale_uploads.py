"""Multipart uploads left open (S3): failed saves, killed processes and
cleanups against a dead server leave them, and S3 bills them until someone
aborts them. Aborted best effort, each request one attempt, within
``cleanup_timeout`` (docs/PROTOCOL.md, section 1c):

- at every write that names its leftovers (``LeftoverUploads``): those this
  process recorded when its cleanup could not abort them (uploads.py), and,
  under the write's prefix, those of other writers that have ended or began
  more than ``stale_upload_age`` seconds ago;
- when a prefix is deleted: every open upload under it;
- after a commit, those of the committed directory's data files whose writers
  are not live (``engine/attempts.sweep``).
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

from .base import LeftoverUploads
from .remote_client import RemoteClient, gone
from .retry import call_async
from .tasks import bounded

_MAX_LIST_PAGES = 20

log = logging.getLogger("pyckpt.storage")


class StaleUploads:
    """The sweeps of open multipart uploads of one filesystem."""

    def __init__(self, client: RemoteClient) -> None:
        self.client = client
        self.fs = client.fs
        self.opts = client.opts
        self.url = client.url

    async def _list_uploads(self, prefix: str) -> list[dict]:
        """The open multipart uploads of keys under ``prefix`` + "/" (S3), at most
        ``_MAX_LIST_PAGES`` pages."""
        bucket, key, _ = self.fs.split_path(prefix)
        kw: dict = {"Bucket": bucket, "Prefix": key.rstrip("/") + "/"}
        out: list[dict] = []
        op = self.client.operation(quiet=True)
        for _ in range(_MAX_LIST_PAGES):
            page = await call_async(f"listing the multipart uploads under {self.url(prefix)}", op,
                                    self.client.request("list_multipart_uploads", **kw))
            for u in page.get("Uploads") or []:
                out.append({**u, "Bucket": bucket})
            if not page.get("IsTruncated"):
                break
            kw["KeyMarker"] = page.get("NextKeyMarker") or (out[-1]["Key"] if out else "")
            kw["UploadIdMarker"] = page.get("NextUploadIdMarker") or ""
        return out

    async def _abort_all(self, uploads: list[tuple[str, str, str]]) -> dict[str, Any]:
        """Aborts (bucket, key, upload id) uploads, one attempt each, bounded."""
        op = self.client.operation(probe=True, quiet=True)
        return await bounded([(upload_id, call_async(
            f"abort of the multipart upload {upload_id}", op,
            self.client.request("abort_multipart_upload", Bucket=bucket, Key=key,
                                UploadId=upload_id)))
            for bucket, key, upload_id in uploads], self.opts.cleanup_timeout)

    def sweep(self, leftovers: LeftoverUploads) -> list[str]:
        """Aborts the multipart uploads that failed writers left open (S3; best effort,
        bounded; returns the keys aborted):

        - those this process recorded when its cleanup could not abort them (any prefix);
        - under ``leftovers.prefix``, those of objects that ``leftovers.owner`` maps to
          a writer other than ``leftovers.current`` which ``leftovers.is_live`` says
          has ended (False), or that were started more than ``stale_upload_age``
          seconds ago.

        Uploads of other keys (``owner`` gives None) are never touched."""
        if not self.client.is_s3:
            return []
        doomed = self._doomed(leftovers, self._listed(leftovers.prefix))
        if not doomed:
            return []
        return self._abort_doomed(doomed)

    def _listed(self, prefix: str) -> list[dict]:
        """The open multipart uploads under ``prefix`` (within ``cleanup_timeout``);
        none where they cannot be listed (best effort)."""
        opts = self.opts
        try:
            return self.client.run(lambda: asyncio.wait_for(self._list_uploads(prefix),
                                                            opts.cleanup_timeout))
        except Exception as e:  # noqa: BLE001 - best effort: the save itself goes on
            log.info("pyckpt: could not list the multipart uploads under %s: %s",
                     self.url(prefix), e)
            return []

    def _doomed(self, leftovers: LeftoverUploads,
                uploads: list[dict]) -> dict[str, tuple[str, str, str]]:
        """The uploads ``sweep`` aborts, as upload id -> (bucket, key, upload id): those
        this process recorded, and those of ``uploads`` (listed under
        ``leftovers.prefix``) that other writers left, ended or stale."""
        _, base, _ = self.fs.split_path(leftovers.prefix)
        base = base.rstrip("/") + "/"
        with self.client.lock:
            recorded = dict(self.client.unaborted)
        doomed: dict[str, tuple[str, str, str]] = {
            u: (b, k, u) for u, (b, k, _) in recorded.items()}
        liveness: dict[str, bool | None] = {}
        now = time.time()
        for u in uploads:
            key, upload_id = u.get("Key", ""), u.get("UploadId", "")
            name = key[len(base):] if key.startswith(base) else ""
            attempt = leftovers.owner(name) if name else None
            if attempt is None or attempt == leftovers.current:
                continue
            started: Any = u.get("Initiated")  # a datetime, from botocore
            age = now - started.timestamp() if hasattr(started, "timestamp") else 0.0
            if age < self.opts.stale_upload_age and not _ended(leftovers, attempt, liveness):
                continue
            doomed[upload_id] = (u["Bucket"], key, upload_id)
        return doomed

    def _abort_doomed(self, doomed: dict[str, tuple[str, str, str]]) -> list[str]:
        """Aborts the uploads of ``_doomed`` (one attempt each, bounded); returns the
        keys aborted, which are no longer recorded."""
        try:
            results = self.client.run(self._abort_all, list(doomed.values()))
        except Exception as e:  # noqa: BLE001
            log.info("pyckpt: could not abort stale multipart uploads: %s", e)
            return []
        aborted = []
        with self.client.lock:
            for upload_id, exc in results.items():
                if gone(exc):
                    self.client.unaborted.pop(upload_id, None)
                    aborted.append(doomed[upload_id][1])
        if aborted:
            log.info("pyckpt: aborted %d multipart upload(s) left open by failed saves: %s",
                     len(aborted), ", ".join(aborted[:5]))
        return aborted

    def entries_under(self, prefix: str) -> list[str]:
        """The names of the entries directly under ``prefix`` that hold open multipart
        uploads (S3; best effort, within ``cleanup_timeout``)."""
        if not self.client.is_s3:
            return []
        _, base, _ = self.fs.split_path(prefix)
        base = base.rstrip("/") + "/"
        names = {u["Key"][len(base):].split("/", 1)[0] for u in self._listed(prefix)
                 if u.get("Key", "").startswith(base)}
        return sorted(n for n in names if n)

    def abort_named(self, prefix: str, names: set[str]) -> list[str]:
        """Aborts the open multipart uploads of the entries ``names`` directly under
        ``prefix`` (S3; best effort, bounded); returns the names aborted."""
        if not self.client.is_s3 or not names:
            return []
        _, base, _ = self.fs.split_path(prefix)
        base = base.rstrip("/") + "/"
        doomed = {u["UploadId"]: (u["Bucket"], u["Key"], u["UploadId"])
                  for u in self._listed(prefix)
                  if u.get("Key", "").startswith(base) and u["Key"][len(base):] in names}
        if not doomed:
            return []
        return sorted({k[len(base):] for k in self._abort_doomed(doomed)})

    def abort_under(self, prefix: str) -> list[str]:
        """Aborts every open multipart upload under ``prefix`` (a prefix being deleted);
        best effort, bounded; returns the keys aborted."""
        if not self.client.is_s3:
            return []
        try:
            uploads = self.client.run(lambda: asyncio.wait_for(self._list_uploads(prefix),
                                                               self.opts.cleanup_timeout))
            if not uploads:
                return []
            results = self.client.run(self._abort_all, [(u["Bucket"], u["Key"], u["UploadId"])
                                                        for u in uploads])
        except Exception as e:  # noqa: BLE001 - best effort
            log.info("pyckpt: could not abort the multipart uploads under %s: %s",
                     self.url(prefix), e)
            return []
        keys = {u["UploadId"]: u["Key"] for u in uploads}
        return [keys[u] for u, exc in results.items() if gone(exc)]


def _ended(leftovers: LeftoverUploads, attempt: str, liveness: dict[str, bool | None]) -> bool:
    """Whether ``leftovers.is_live`` says that writer ``attempt`` has ended (False;
    an error counts as live); answers are kept in ``liveness``, one call a writer."""
    if attempt not in liveness:
        try:
            liveness[attempt] = leftovers.is_live(attempt)
        except Exception:  # noqa: BLE001 - unknown: keep it
            liveness[attempt] = True
    return liveness[attempt] is False
