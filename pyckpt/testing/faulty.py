"""``faulty::``: an fsspec filesystem that wraps another and injects faults.

Use it through fsspec's URL chaining, for pyckpt's tests and your own::

    faults = Faults(fail_nth={3}, latency=0.01)
    pyckpt.save(tree, "faulty::s3://bucket/run/ckpt-1",
                storage_options={"faulty": {"faults": faults}, "s3": {...}})
    faults.requests, faults.bytes_read      # what went over the wire

Every call that reaches the wrapped filesystem counts as one request. A
failing request raises ``faults.error`` (by default ConnectionResetError, a
transient error that retries may overcome) before reaching the target.
"""

from __future__ import annotations

import dataclasses
import random
import threading
import time
from typing import Any, Callable

import fsspec
from fsspec.implementations.chained import ChainedFileSystem


@dataclasses.dataclass
class Faults:
    """Which requests fail and how (the fields below), and counters of what went
    through: ``requests``, ``failures``, ``bytes_read``, ``bytes_written`` and ``log``,
    one ``(number, kind, description, "ok" or "FAILED")`` per request. Shared by
    reference: pass it as ``storage_options={"faulty": {"faults": faults}}``."""

    #: 1-based numbers of the requests that fail.
    fail_nth: set = dataclasses.field(default_factory=set)
    #: Probability that any request fails (drawn from ``seed``).
    fail_fraction: float = 0.0
    #: Seconds added to every request.
    latency: float = 0.0
    #: Requests of these kinds only are subject to faults ("read", "write", "meta"); None: all.
    kinds: set | None = None
    #: Only requests whose description (as in ``log``) contains this text (or one of
    #: these texts) are subject to faults, e.g. "data-" for a checkpoint's data files,
    #: or ("upload_part", "abort_multipart_upload"); None: all.
    only: str | tuple | None = None
    #: Writes keep only this fraction of their bytes and report success (a silent truncation).
    cut_writes_to: float | None = None
    #: Exception raised by a failing request.
    error: Callable[[str], BaseException] = lambda what: ConnectionResetError(
        104, f"injected fault: {what}")
    seed: int = 0
    # counters
    requests: int = 0
    failures: int = 0
    bytes_read: int = 0
    bytes_written: int = 0
    log: list = dataclasses.field(default_factory=list)

    def __post_init__(self) -> None:
        self._lock = threading.Lock()
        self._rng = random.Random(self.seed)

    def reset_counters(self) -> None:
        """Zeroes the counters and clears the log (request numbers start again at 1)."""
        with self._lock:
            self.requests = self.failures = self.bytes_read = self.bytes_written = 0
            self.log.clear()

    def request(self, kind: str, what: str) -> None:
        """Counts one request of ``kind`` ("read", "write", "meta") described by ``what``,
        waits ``latency`` and raises ``error(...)`` when this request is chosen to fail."""
        with self._lock:
            self.requests += 1
            n = self.requests
            only = (self.only,) if isinstance(self.only, str) else self.only
            eligible = ((self.kinds is None or kind in self.kinds)
                        and (only is None or any(text in what for text in only)))
            fail = eligible and (n in self.fail_nth or
                                 (self.fail_fraction > 0 and self._rng.random() < self.fail_fraction))
            if fail:
                self.failures += 1
            self.log.append((n, kind, what, "FAILED" if fail else "ok"))
        if self.latency:
            time.sleep(self.latency)
        if fail:
            raise self.error(f"{kind} {what} (request {n})")

    def __hash__(self) -> int:  # fsspec tokenizes storage options
        return id(self)


def _body_view(body: Any) -> memoryview:
    """The bytes of a request body: bytes-like, or a file-like with getbuffer()."""
    if hasattr(body, "getbuffer"):
        return memoryview(body.getbuffer()).cast("B")
    return memoryview(body).cast("B")


class _WriteFile:
    """A write handle that counts bytes and may cut the written data short."""

    def __init__(self, fs: "FaultyFileSystem", path: str, inner: Any) -> None:
        self.fs, self.path, self.inner = fs, path, inner
        self.written = 0

    def write(self, data: Any) -> int:
        faults = self.fs.faults
        n = len(memoryview(data).cast("B"))
        faults.request("write", f"{self.path} bytes [{self.written}, {self.written + n})")
        keep = n
        if faults.cut_writes_to is not None:
            keep = int(n * faults.cut_writes_to)
        self.inner.write(memoryview(data).cast("B")[:keep])
        with faults._lock:
            faults.bytes_written += keep
        self.written += n
        return n

    def close(self) -> None:
        self.inner.close()

    def discard(self) -> None:
        """Drops a half-written object (when the target can), else closes it."""
        if hasattr(self.inner, "discard"):
            self.inner.discard()
        else:
            self.inner.close()

    def __enter__(self) -> "_WriteFile":
        return self

    def __exit__(self, *exc: Any) -> None:
        if exc[0] is not None and hasattr(self.inner, "discard"):
            self.inner.discard()  # do not publish a half-written object
        else:
            self.close()


class FaultyFileSystem(ChainedFileSystem):
    """The ``faulty::`` filesystem: forwards every call to the ``target_protocol``
    filesystem (made with ``target_options``), counting each request in ``faults``
    (a new Faults when none is given) and failing it when they say so."""

    protocol = "faulty"

    def __init__(self, target_protocol: str = "memory", target_options: dict | None = None,
                 fo: str | None = None, faults: Faults | None = None, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.target = fsspec.filesystem(target_protocol, **(target_options or {}))
        self.faults = faults if faults is not None else Faults()

    # -- S3 passthrough: with an s3fs target, pyckpt's multipart uploader runs
    # through here, so faults hit individual part uploads (and its retries).
    def __getattr__(self, name: str) -> Any:
        if name in ("split_path", "loop", "call_s3") and hasattr(self.__dict__.get("target"), "_call_s3"):
            return getattr(self.target, name)
        raise AttributeError(name)

    async def _call_s3(self, method: str, *args: Any, **kwargs: Any) -> Any:
        if not hasattr(self.target, "_call_s3"):
            raise AttributeError("_call_s3")
        kind = "write" if method in ("upload_part", "put_object", "create_multipart_upload",
                                     "complete_multipart_upload") else "meta"
        body = kwargs.get("Body")
        self.faults.request(kind, f"{method} {kwargs.get('Key', '')}"
                            + (f" part {kwargs['PartNumber']}" if "PartNumber" in kwargs else ""))
        if body is not None and self.faults.cut_writes_to is not None:
            view = _body_view(body)
            kwargs["Body"] = bytes(view[: int(len(view) * self.faults.cut_writes_to)])
        if body is not None:
            with self.faults._lock:
                self.faults.bytes_written += len(_body_view(kwargs["Body"]))
        return await self.target._call_s3(method, *args, **kwargs)

    def unstrip_protocol(self, path: str) -> str:
        """The full URL of path: ``faulty::`` before the target's URL."""
        return "faulty::" + self.target.unstrip_protocol(path)

    # -- reads ------------------------------------------------------------------
    def cat_file(self, path: str, start: int | None = None, end: int | None = None, **kw: Any) -> bytes:
        """Bytes [start, end) of path (one "read" request; the bytes are counted)."""
        self.faults.request("read", f"{path} bytes [{start}, {end})")
        data = self.target.cat_file(path, start=start, end=end, **kw)
        with self.faults._lock:
            self.faults.bytes_read += len(data)
        return data

    def _open(self, path: str, mode: str = "rb", **kw: Any) -> Any:
        if "w" in mode or "a" in mode:
            self.faults.request("write", f"open {path}")
            return _WriteFile(self, path, self.target.open(path, mode, **kw))
        self.faults.request("read", f"open {path}")
        return self.target.open(path, mode, **kw)

    def open(self, path: str, mode: str = "rb", **kw: Any) -> Any:
        """Opens path on the target (one "read" or "write" request); a write handle
        counts every write as a request and may cut it short (``cut_writes_to``)."""
        return self._open(path, mode, **kw)

    # -- writes -------------------------------------------------------------------
    def pipe_file(self, path: str, value: bytes, **kw: Any) -> None:
        """Writes ``value`` to path in one "write" request, cut short as ``cut_writes_to``
        says."""
        self.faults.request("write", f"put {path} ({len(value)} bytes)")
        if self.faults.cut_writes_to is not None:
            value = value[: int(len(value) * self.faults.cut_writes_to)]
        with self.faults._lock:
            self.faults.bytes_written += len(value)
        self.target.pipe_file(path, value, **kw)

    def rm_file(self, path: str) -> None:
        """Deletes one file (a "meta" request)."""
        self.faults.request("meta", f"delete {path}")
        self.target.rm_file(path)

    def rm(self, path: Any, recursive: bool = False, maxdepth: int | None = None) -> None:
        """Deletes path(s), recursively if asked (one "meta" request)."""
        self.faults.request("meta", f"delete {path}")
        self.target.rm(path, recursive=recursive, maxdepth=maxdepth)

    def makedirs(self, path: str, exist_ok: bool = False) -> None:
        """Creates directories on the target (not counted as a request)."""
        self.target.makedirs(path, exist_ok=exist_ok)

    def mkdir(self, path: str, create_parents: bool = True, **kw: Any) -> None:
        """Creates a directory on the target (not counted as a request)."""
        self.target.mkdir(path, create_parents=create_parents, **kw)

    # -- metadata -------------------------------------------------------------------
    def info(self, path: str, **kw: Any) -> dict:
        """The target's info of path (a "meta" request)."""
        self.faults.request("meta", f"info {path}")
        return self.target.info(path, **kw)

    def ls(self, path: str, detail: bool = True, **kw: Any) -> Any:
        """The target's listing of path (a "meta" request)."""
        self.faults.request("meta", f"list {path}")
        return self.target.ls(path, detail=detail, **kw)

    def exists(self, path: str, **kw: Any) -> bool:
        """Whether path exists on the target (a "meta" request)."""
        self.faults.request("meta", f"exists {path}")
        return self.target.exists(path, **kw)

    def isdir(self, path: str) -> bool:
        """Whether path is a directory on the target (a "meta" request)."""
        self.faults.request("meta", f"isdir {path}")
        return self.target.isdir(path)

    def invalidate_cache(self, path: str | None = None) -> None:
        """Drops the target's listing cache (not counted as a request)."""
        self.target.invalidate_cache(path)


fsspec.register_implementation("faulty", FaultyFileSystem, clobber=True)
