"""The storage interface every backend implements (local disk, fsspec stores).

Paths are '/'-separated strings in the store's own namespace (an absolute
local path, or "bucket/prefix/key" for object stores). A checkpoint is a
directory-like prefix; its index file is written last and atomically, which
is the commit (docs/PROTOCOL.md). The interface is shaped for object stores:
whole-object and ranged reads, whole-object atomic writes, no rename needed.

Backends declare what they can do with capability flags so that the engine
picks the fastest path: ``local`` stores hand file paths to the C++ core,
which reads and writes them directly.
"""

from __future__ import annotations

import abc
from typing import Any, Iterable, Sequence


class Store(abc.ABC):
    #: Paths are local files the C++ core can open (pread/pwrite, mmap).
    local: bool = False
    #: A file can be renamed atomically (used for the commit on local disks).
    atomic_rename: bool = False
    #: URL scheme prefix used when showing paths to users ("" for local).
    protocol: str = ""

    # -- paths -------------------------------------------------------------------
    def join(self, *parts: str) -> str:
        out = parts[0].rstrip("/")
        for p in parts[1:]:
            out = f"{out}/{p.strip('/')}" if out else p.strip("/")
        return out

    def url(self, path: str) -> str:
        """The path as the user would write it (with its scheme)."""
        return f"{self.protocol}://{path}" if self.protocol else path

    # -- reads -------------------------------------------------------------------
    @abc.abstractmethod
    def exists(self, path: str) -> bool: ...

    @abc.abstractmethod
    def isdir(self, path: str) -> bool: ...

    @abc.abstractmethod
    def listdir(self, path: str) -> list[str]:
        """Names (not paths) of the entries directly under ``path``; [] if none."""

    @abc.abstractmethod
    def size(self, path: str) -> int: ...

    @abc.abstractmethod
    def read_bytes(self, path: str) -> bytes:
        """The whole object. FileNotFoundError when it does not exist."""

    @abc.abstractmethod
    def read_ranges(self, path: str, ranges: Sequence[tuple[int, int]]) -> list[bytes]:
        """Bytes [start, end) for each range, fetched concurrently where possible."""

    def mtime(self, path: str) -> float | None:
        return None

    # -- writes ------------------------------------------------------------------
    @abc.abstractmethod
    def makedirs(self, path: str) -> None: ...

    @abc.abstractmethod
    def write_atomic(self, path: str, data: bytes) -> None:
        """Durably writes a whole object so readers see all of it or none of it."""

    @abc.abstractmethod
    def delete(self, paths: Iterable[str]) -> None:
        """Deletes files; missing ones are ignored."""

    @abc.abstractmethod
    def rmtree(self, path: str) -> None:
        """Deletes a directory-like prefix and everything under it; missing is fine."""

    @abc.abstractmethod
    def open_write(self, path: str) -> Any:
        """A binary file to stream one object into; it appears whole (and durably)
        when the ``with`` block exits without an error, and not at all otherwise."""

    def sync_dir(self, path: str) -> None:
        """Makes entries created in a directory durable (no-op on object stores)."""
