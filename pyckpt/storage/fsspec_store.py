"""Stores reached through fsspec: S3 (s3fs), GCS (gcsfs), memory, and any other
fsspec filesystem. Object stores have no rename: a checkpoint is committed by
writing its index with one PUT after every shard upload was acknowledged and
its size confirmed (docs/PROTOCOL.md, "Object stores").

Every request goes through retry.py: retried on transient errors, abandoned
when it stalls, given up on when its operation made no progress for
``deadline`` seconds (docs/PROTOCOL.md, "Timeouts, retries and cleanup").
The transfers live beside it: remote_client.py (the filesystem, single S3
requests), uploads.py (``write_files``), downloads.py (``fetch``) and
stale_uploads.py (open multipart uploads of failed writes)."""

from __future__ import annotations

import datetime
import errno
import functools
import logging
import sys
import threading
import time
from typing import Any, Iterable, Sequence

from ..errors import CheckpointIOError
from .base import ByteRange, FetchPolicy, LeftoverUploads, NewFile, Store
from .diagnose import explain
from .downloads import Downloader
from .options import RemoteOptions
from .registry import check_protocol, unknown_protocol
from .remote_client import RemoteClient
from .retry import call_async, call_sync
from .stale_uploads import StaleUploads
from .tasks import gather_or_cancel
from .uploads import Uploader

log = logging.getLogger("pyckpt.storage")

_CACHE: dict[Any, "FsspecStore"] = {}
_CACHE_LOCK = threading.Lock()


def _freeze(x: Any) -> Any:
    if isinstance(x, dict):
        return tuple(sorted((k, _freeze(v)) for k, v in x.items()))
    if isinstance(x, (list, tuple)):
        return tuple(_freeze(v) for v in x)
    try:
        hash(x)
        return x
    except TypeError:
        return id(x)


class FsspecStore(Store):
    """A store over one fsspec filesystem (one per filesystem and options,
    ``for_url``); no native paths: bulk reads are concurrent ranged requests,
    bulk writes parallel part uploads."""

    local = False
    atomic_rename = False

    def __init__(self, fs: Any, opts: RemoteOptions) -> None:
        self.fs = fs
        self.opts = opts
        proto = fs.protocol
        self.protocol = proto[0] if isinstance(proto, (tuple, list)) else proto
        self.io = RemoteClient(fs, opts, self.url)
        self.uploads = Uploader(self.io)
        self.downloads = Downloader(self.io)
        self.stale = StaleUploads(self.io)
        #: path -> (error, time): files whose cleanup ran after that error (``delete``)
        self._cleaned: dict[str, tuple[BaseException, float]] = {}
        self._cleaned_lock = threading.Lock()

    @classmethod
    def for_url(cls, url: str, storage_options: dict | None) -> tuple["FsspecStore", str]:
        import fsspec  # optional at import time: loaded with the first URL

        opts, fs_options = RemoteOptions.split(storage_options)
        check_protocol(url)
        try:
            fs, path = fsspec.core.url_to_fs(url, **fs_options)
        except ValueError as e:
            if "protocol not known" not in str(e).lower():
                raise
            raise unknown_protocol(url) from e
        except Exception as e:  # noqa: BLE001 - a client that looks for credentials at once (gcsfs)
            problem = explain(e, url=url)
            if problem is None:
                raise
            raise CheckpointIOError(errno.EACCES, f"opening {url}: {problem}") from e
        key = (type(fs), _freeze(fs_options), url.split("://", 1)[0], opts.key(), id(fs))
        with _CACHE_LOCK:
            store = _CACHE.get(key)
            if store is None:
                store = _CACHE[key] = cls(fs, opts)
        return store, path.rstrip("/")

    # -- paths ----------------------------------------------------------------------
    def join(self, *parts: str) -> str:
        return "/".join(p.strip("/") if i else p.rstrip("/") for i, p in enumerate(parts) if p)

    def url(self, path: str) -> str:
        # memory:// paths carry a leading "/" inside fsspec; show them as users write them
        return self.fs.unstrip_protocol(path).replace("memory:///", "memory://", 1)

    def _op(self, what: str, name: str, *args: Any, stall: float | None = None,
            **kwargs: Any) -> Any:
        """fs.<name>(*args) as one operation (retry.py): through the async API under the
        watchdog where the filesystem has one (so a server that stops answering cannot
        hang the caller), else directly. ``stall``: the limit of a request whose bytes
        cannot be watched (default ``stall_timeout``, for small metadata requests)."""
        fs = self.fs
        op = self.io.operation()
        if getattr(fs, "async_impl", False) and hasattr(fs, "_" + name):
            fn = getattr(fs, "_" + name)

            async def go() -> Any:
                if self.io.s3_native and args and isinstance(args[0], str):
                    await self.io.hook_client(fs.split_path(args[0])[0])
                return await call_async(what, op, lambda att: fn(*args, **kwargs), stall=stall)

            return self.io.run(go)
        return call_sync(what, op, lambda: getattr(fs, name)(*args, **kwargs))

    def _fresh(self, path: str) -> None:
        """Forgets cached listings: another process may have written since."""
        try:
            self.fs.invalidate_cache(path)
        except Exception:  # noqa: BLE001 - not every filesystem caches
            pass

    # -- reads ----------------------------------------------------------------------
    def exists(self, path: str) -> bool:
        self._fresh(path)
        return self._op(f"existence check of {self.url(path)}", "exists", path)

    def isdir(self, path: str) -> bool:
        self._fresh(path)
        return self._op(f"listing {self.url(path)}", "isdir", path)

    def listdir(self, path: str) -> list[str]:
        self._fresh(path)
        try:
            entries = self._op(f"listing {self.url(path)}", "ls", path, detail=False)
        except (FileNotFoundError, NotADirectoryError):
            return []
        base = path.rstrip("/")
        out = []
        for e in entries:
            e = e.rstrip("/")
            if e != base and e.startswith(base + "/"):
                out.append(e[len(base) + 1:])
            elif e != base and "/" not in e:
                out.append(e)
        return out

    def size(self, path: str) -> int:
        self._fresh(path)
        info = self._op(f"size of {self.url(path)}", "info", path)
        return int(info["size"])

    def sizes(self, paths: Sequence[str]) -> list[int | None]:
        """Store.sizes: one metadata request per object, all in flight at once (one
        round trip instead of one per data file before a load)."""
        fs = self.fs
        if len(paths) < 2 or not (getattr(fs, "async_impl", False) and hasattr(fs, "_info")):
            return super().sizes(paths)
        for p in paths:
            self._fresh(p)
        op = self.io.operation()

        async def one(p: str) -> int | None:
            try:
                info = await call_async(f"size of {self.url(p)}", op, lambda att: fs._info(p))
            except FileNotFoundError:
                return None
            return int(info["size"])

        async def go() -> list[int | None]:
            if self.io.s3_native:
                await self.io.hook_client(fs.split_path(paths[0])[0])
            return await gather_or_cancel([one(p) for p in paths])

        return self.io.run(go)

    def mtime(self, path: str) -> float | None:
        try:
            info = self._op(f"modification time of {self.url(path)}", "info", path)
        except (FileNotFoundError, OSError):
            return None
        for k in ("mtime", "LastModified", "updated", "created"):
            v = info.get(k)
            if hasattr(v, "timestamp"):
                return float(v.timestamp())
            if isinstance(v, (int, float)):
                return float(v)
            if isinstance(v, str):
                try:
                    return datetime.datetime.fromisoformat(v.replace("Z", "+00:00")).timestamp()
                except ValueError:
                    pass
        return None

    def read_bytes(self, path: str) -> bytes:
        if self.io.s3_native:  # streamed, every chunk watched
            return self.io.read_object(path)
        return self._op(f"read of {self.url(path)}", "cat_file", path, stall=self.opts.timeout)

    def read_ranges(self, path: str, ranges: Sequence[tuple[int, int]]) -> list[bytes]:
        return self.downloads.fetch([ByteRange(path, s, e) for s, e in ranges])

    def fetch(self, ranges: Sequence[ByteRange], into: Sequence[Any] | None = None) -> list[Any]:
        """The ranges, up to ``max_concurrency`` requests at once, each retried; on S3
        received straight into ``into``'s buffers where given."""
        return self.downloads.fetch(ranges, into)

    def unfinished(self, path: str) -> list[str]:
        return self.stale.entries_under(path)

    def abort_uploads(self, path: str, names: Sequence[str]) -> list[str]:
        return self.stale.abort_named(path, set(names))

    def answering(self) -> bool:
        return not self.io.health.probing(self.opts, time.monotonic())

    def fetch_policy(self) -> FetchPolicy:
        """The read batching of this store's ``RemoteOptions``."""
        o = self.opts
        return FetchPolicy(gap=o.read_gap, request_max=o.read_request_max,
                           batch_bytes=o.read_batch_bytes, concurrency=o.max_concurrency,
                           lands=self.io.s3_native)

    # -- writes ---------------------------------------------------------------------
    def makedirs(self, path: str) -> None:
        try:
            self._op(f"creating {self.url(path)}", "makedirs", path, exist_ok=True)
        except (FileExistsError, NotImplementedError):
            pass

    def write_atomic(self, path: str, data: bytes) -> None:
        """One PUT: object stores make a whole object visible at once."""
        if self.io.s3_native:  # the body's progress watched
            self.io.write_object(path, data)
        else:
            self._op(f"write of {self.url(path)}", "pipe_file", path, data,
                     stall=self.opts.timeout)
        self._fresh(path)

    def open_write(self, path: str) -> Any:
        """Not offered: an open fsspec file object has no stall limit, no deadline and
        no bounded cleanup, and one left to a finalizer can hang the interpreter's exit.
        New objects go through ``write_files`` (``storage.streamed.write_stream`` for
        sequential producers)."""
        raise TypeError(f"{self.url(path)}: remote stores take new objects through "
                        "write_files / storage.streamed.write_stream, not open_write")

    def delete(self, paths: Iterable[str]) -> None:
        """Deletes the objects (concurrently on async filesystems, as one operation);
        missing ones are ignored. Called while handling the failure of this store's own
        ``write_shards``, for the files whose bounded cleanup already ran (and reported
        on that error), it does not repeat it: a store that stopped answering would
        make it wait, and its failure would hide the save's own error."""
        todo = [p for p in list(paths) if not self._cleaned_for_current_error(p)]
        if not todo:
            return
        fs = self.fs
        if getattr(fs, "async_impl", False) and hasattr(fs, "_rm_file"):
            op = self.io.operation()

            async def one(p: str) -> None:
                try:
                    await call_async(f"delete of {self.url(p)}", op, lambda att: fs._rm_file(p))
                except FileNotFoundError:
                    pass

            async def go() -> None:
                await gather_or_cancel(one(p) for p in todo)

            try:
                self.io.run(go)
            finally:
                for p in todo:
                    self._fresh(p)
            return
        op = self.io.operation()
        for p in todo:
            try:
                call_sync(f"delete of {self.url(p)}", op, functools.partial(fs.rm_file, p))
            except FileNotFoundError:
                pass
            self._fresh(p)

    def _mark_cleaned(self, paths: Sequence[str], error: BaseException) -> None:
        now = time.monotonic()
        with self._cleaned_lock:
            for p, (_, t) in list(self._cleaned.items()):
                if now - t > 600:
                    del self._cleaned[p]
            for p in paths:
                self._cleaned[p] = (error, now)

    def _cleaned_for_current_error(self, path: str) -> bool:
        """Whether ``path`` was cleaned up after the error being handled right now."""
        current = sys.exc_info()[1]
        if current is None:
            return False
        with self._cleaned_lock:
            entry = self._cleaned.get(path)
            if entry is None or entry[0] is not current:
                return False
            del self._cleaned[path]
            return True

    def rmtree(self, path: str) -> None:
        self._fresh(path)
        try:
            self._op(f"delete of {self.url(path)}", "rm", path, recursive=True,
                     stall=self.opts.timeout)
        except FileNotFoundError:
            pass
        # multipart uploads under the prefix are part of what is deleted (S3)
        self.stale.abort_under(path)
        if hasattr(self.fs, "call_s3") and hasattr(self.fs, "split_path"):
            # S3 gateways over a filesystem (SeaweedFS, MinIO) keep the emptied
            # "directory"; deleting the key with a trailing slash removes it.
            bucket, key, _ = self.fs.split_path(path)
            try:
                self.io.s3_call(f"delete of {self.url(path)}/", "delete_object", Bucket=bucket,
                                Key=key.rstrip("/") + "/")
            except Exception:  # noqa: BLE001 - best effort; plain S3 has nothing to delete
                pass
        self._fresh(path)

    # -- bulk writes ------------------------------------------------------------------
    def write_files(self, files: Sequence[NewFile], *,
                    leftovers: LeftoverUploads | None = None) -> None:
        """Uploads every file in parallel parts and confirms their sizes. Beside it,
        aborts the multipart uploads that ended writers left open under
        ``leftovers.prefix`` (``abort_stale_uploads``).

        On failure the upload's own error is raised, after a bounded best-effort
        cleanup (abort this write's multipart uploads, delete its objects) whose
        failures are notes on that error; the caller's deletion of the files while
        handling it is then not repeated (``delete``)."""
        paths = [f.path for f in files]
        sweep = self._start_sweep(leftovers) if files and leftovers is not None else None
        if sweep is not None and leftovers is not None and leftovers.first:
            sweep.join(timeout=2 * self.opts.cleanup_timeout)  # bounded, best effort
            sweep = None
        try:
            self.uploads.upload(files)  # on failure it has cleaned up after itself
        except BaseException as e:
            self._mark_cleaned(paths, e)
            raise
        try:
            self.confirm_sizes({f.path: f.size for f in files})
        except BaseException as e:  # a short or missing object: delete them all
            self.uploads.discard(e, paths)
            self._mark_cleaned(paths, e)
            raise
        if sweep is not None:  # it runs beside the upload; bounded, best effort
            sweep.join(timeout=2 * self.opts.cleanup_timeout)

    def _start_sweep(self, leftovers: LeftoverUploads) -> threading.Thread | None:
        """``abort_stale_uploads`` in a thread of its own, beside the upload (S3 only):
        it adds no time to a save, and a store that stalls makes the upload fail, not
        the sweep wait."""
        if not self.io.is_s3:
            return None

        def sweep() -> None:
            try:
                self.abort_stale_uploads(leftovers)
            except Exception as e:  # noqa: BLE001 - best effort
                log.info(
                    "pyckpt: sweeping multipart uploads under %s failed: %s",
                    self.url(leftovers.prefix), e)

        thread = threading.Thread(target=sweep, name="pyckpt-sweep", daemon=True)
        thread.start()
        return thread

    def abort_stale_uploads(self, leftovers: LeftoverUploads) -> list[str]:
        """Aborts the multipart uploads that failed writes left open (S3; best effort,
        bounded by ``cleanup_timeout``): those this process could not abort, and,
        under ``leftovers.prefix``, those of other writers' objects whose writer has
        ended (``leftovers.is_live`` gives False) or that began more than
        ``stale_upload_age`` seconds ago. Returns the keys aborted."""
        return self.stale.sweep(leftovers)
