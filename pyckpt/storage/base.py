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

    def is_link(self, path: str) -> bool:
        """Whether path is a symbolic link (never on object stores). Deleting code
        removes a link itself, never what it points to."""
        return False

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

    # -- engine hooks (generic versions; backends override them to go faster) ----------
    def write_shards(self, paths: list[str], sizes: Sequence[int], keys: list[str],
                     arrays: list[Any], file_idx: Any, offsets: Any, options: Any) -> Any:
        """Writes the shard files of one save (non-local stores); returns the masked chunk
        CRCs. This version streams each file through ``open_write`` part by part and
        confirms every file's size before the caller may commit."""
        from .. import _core
        from .remote_io import ShardLayout

        crcs, _ = _core.compute_checksums(keys, arrays, options.chunk_size, options.threads)
        for path, layout in shard_layouts(paths, sizes, arrays, file_idx, offsets):
            with self.open_write(path) as f:
                for b, e in layout.parts(16 << 20):
                    f.write(layout.fill(b, bytearray(e - b)))
        self.confirm_sizes(dict(zip(paths, (int(s) for s in sizes))))
        return crcs

    def confirm_sizes(self, expected: dict[str, int]) -> None:
        """Acknowledged is not enough: checks what the store holds before a commit."""
        from ..errors import CheckpointIOError

        for path, size in expected.items():
            got = self.size(path)
            if got != size:
                raise CheckpointIOError(5, f"upload of {self.url(path)} is incomplete: the store "
                                           f"holds {got} of {size} bytes")

    def read_plan(self, ck: Any, plan: Any, used: Any, dsts: Sequence[Any]) -> None:
        """Reads and verifies the byte ranges of a read plan (non-local stores), with
        ``read_ranges``; backends with concurrent requests override ``fetch``."""
        from .options import RemoteOptions
        from .remote_read import read_plan

        read_plan(self, ck, plan, dsts, getattr(self, "opts", RemoteOptions()))

    def fetch(self, ranges: Sequence[tuple[str, int, int]]) -> list[bytes]:
        """Bytes [start, end) of each (path, start, end)."""
        out: list[bytes] = []
        for path, start, end in ranges:
            out.extend(self.read_ranges(path, [(start, end)]))
        return out


def shard_layouts(paths: Sequence[str], sizes: Sequence[int], arrays: Sequence[Any],
                  file_idx: Any, offsets: Any) -> list[tuple[str, Any]]:
    """(path, ShardLayout) of every shard file of a save, for streaming writers."""
    from .remote_io import ShardLayout

    fi, off = list(file_idx), list(offsets)
    per_file: list[tuple[list, list]] = [([], []) for _ in paths]
    for i, a in enumerate(arrays):
        if a.nbytes:
            per_file[int(fi[i])][0].append(a)
            per_file[int(fi[i])][1].append(int(off[i]))
    return [(p, ShardLayout(arrs, offs, int(sz))) for p, (arrs, offs), sz in
            zip(paths, per_file, sizes)]
