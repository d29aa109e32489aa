"""The storage interface every backend implements (local disk, fsspec stores).

Storage knows bytes, not checkpoints. Paths are '/'-separated strings in the
store's own namespace (an absolute local path, or "bucket/prefix/key" for
object stores). A checkpoint is a directory-like prefix; its index file is
written last and atomically, which is the commit (docs/PROTOCOL.md). The
interface is shaped for object stores: whole-object and ranged reads,
whole-object atomic writes, no rename needed.

Bulk transfers take typed requests: ``fetch`` a list of ``ByteRange``s, and
``write_files`` a list of ``NewFile``s (a path, a size and a function that
produces any byte range of the file). What the bytes mean, and their
checksums, is the engine's business.

Capability: ``native_path(path)`` is the path of a local file that the C++
core may open itself (pread/pwrite, mmap), or None. The engine asks it once
per bulk read or write and takes the fast path when it has one.
"""

from __future__ import annotations

import abc
import errno
from typing import Any, Callable, Iterable, NamedTuple, Sequence

from .. import progress
from ..errors import CheckpointIOError

#: Bytes per part when a generic store streams a new file through ``open_write``.
STREAM_PART = 16 << 20


class ByteRange(NamedTuple):
    """Bytes [start, end) of the object at ``path``."""

    path: str
    start: int
    end: int


class NewFile(NamedTuple):
    """A file (object) to write whole: ``size`` bytes, produced part by part by
    ``fill(begin, buf)``, which writes the file's bytes [begin, begin + len(buf))
    into ``buf`` and returns it. ``fill`` may be called from any thread, for any
    range, more than once for one range (retries)."""

    path: str
    size: int
    fill: Callable[[int, bytearray], Any]

    def parts(self, part_size: int) -> list[tuple[int, int]]:
        """[begin, end) of each part of at most ``part_size`` bytes ([(0, 0)] if empty)."""
        return [(b, min(b + part_size, self.size))
                for b in range(0, self.size, part_size)] or [(0, 0)]


def buffer_size(data: Any) -> int:
    """The bytes a ranged read returned: in one buffer, or in the list of buffers it
    was received into (``Store.fetch(into=)``)."""
    if isinstance(data, list):
        return sum(memoryview(b).nbytes for b in data)
    return memoryview(data).nbytes


class LeftoverUploads(NamedTuple):
    """What a store that keeps unfinished uploads (S3 multipart uploads) may clean up
    beside a write under ``prefix``: the uploads of objects whose name ``owner``
    maps to a writer id (None: not a writer's object, never touched) other than
    ``current`` (the writer writing now), once ``is_live(writer)`` says that writer
    has ended (False; None: unknown) or its upload is older than the store's
    ``stale_upload_age``. ``first``: clean up before the write starts instead of
    beside it (the write's own uploads could not be told from the leftovers)."""

    prefix: str
    owner: Callable[[str], str | None]
    current: str | None
    is_live: Callable[[str], bool | None]
    first: bool = False


class FetchPolicy(NamedTuple):
    """How a reader should batch its ranged reads on this store."""

    #: Ranges of one object closer than this are best merged into one request...
    gap: int = 1 << 20
    #: ...unless the merged request would exceed this many bytes.
    request_max: int = 16 << 20
    #: Bytes per ``fetch`` call (bounds memory; the next one can be prefetched).
    batch_bytes: int = 256 << 20
    #: Requests the store runs at once inside one ``fetch``.
    concurrency: int = 8
    #: Whether ``fetch`` receives ranges into the buffers it is given (``into``):
    #: then those bytes need no memory of their own, and batches can be larger.
    lands: bool = False


class Store(abc.ABC):
    """A namespace of byte objects: the abstract primitives every backend
    implements, the bulk transfers (``fetch``, ``write_files``) with generic
    versions built on them, and the ``native_path`` capability."""

    #: Legacy declaration that paths are local files the C++ core can open; the
    #: engine asks ``native_path`` (whose default honours this flag) instead.
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

    # -- capabilities ------------------------------------------------------------
    def native_path(self, path: str) -> str | None:
        """The local file the C++ core may open itself for ``path``, or None when the
        store's objects are reached through its methods only."""
        return path if self.local else None

    def native_paths(self, paths: Sequence[str]) -> list[str] | None:
        """``native_path`` of every path, or None unless the store has all of them."""
        out = []
        for p in paths:
            n = self.native_path(p)
            if n is None:
                return None
            out.append(n)
        return out

    def fetch_policy(self) -> FetchPolicy:
        """How readers should batch their ``fetch`` calls on this store."""
        return FetchPolicy()

    def unfinished(self, path: str) -> list[str]:
        """Names of the entries directly under ``path`` that hold unfinished uploads
        (S3 multipart uploads, which ``listdir`` does not show: a write that died
        before any object of a directory was complete leaves only those). Best effort;
        [] where the store has none."""
        return []

    def abort_uploads(self, path: str, names: Sequence[str]) -> list[str]:
        """Aborts the unfinished uploads (S3 multipart uploads) of the entries
        ``names`` directly under ``path``; their complete objects, if any, are not
        touched. Best effort and bounded; returns the names whose uploads were
        aborted ([] where the store keeps no unfinished uploads)."""
        return []

    def answering(self) -> bool:
        """False while the store counts as down (it stopped answering moments ago and
        has not answered since; docs/PROTOCOL.md 1c): best-effort steps after a
        failure skip their requests rather than spend the failure's follow-up time."""
        return True

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

    def sizes(self, paths: Sequence[str]) -> list[int | None]:
        """The size of each object, None for one that does not exist (object stores ask
        for them all at once)."""
        out: list[int | None] = []
        for p in paths:
            try:
                out.append(self.size(p))
            except FileNotFoundError:
                out.append(None)
        return out

    @abc.abstractmethod
    def read_bytes(self, path: str) -> bytes:
        """The whole object. FileNotFoundError when it does not exist."""

    @abc.abstractmethod
    def read_ranges(self, path: str, ranges: Sequence[tuple[int, int]]) -> list[bytes]:
        """Bytes [start, end) for each range, fetched concurrently where possible."""

    def fetch(self, ranges: Sequence[ByteRange], into: Sequence[Any] | None = None) -> list[Any]:
        """The bytes of each range (bytes or another buffer), in order; concurrent where
        the backend can. A range past the object's end comes back short: the caller
        checks lengths (``buffer_size``). ``into``: per range, None or a list of
        writable contiguous buffers whose sizes add up to the range's, where the store
        may receive its bytes in order (it then returns that very list for the range:
        no copy); stores may ignore it, and a failed fetch may leave any of them partly
        written. This version ignores it and calls ``read_ranges`` once per object."""
        out: list[Any] = [b""] * len(ranges)
        by_path: dict[str, list[int]] = {}
        for i, r in enumerate(ranges):
            by_path.setdefault(r.path, []).append(i)
        for path, idx in by_path.items():
            got = self.read_ranges(path, [(ranges[i].start, ranges[i].end) for i in idx])
            for i, data in zip(idx, got):
                out[i] = data
        return out

    def mtime(self, path: str) -> float | None:
        return None

    def temp_writer(self, name: str) -> tuple[bool, int] | None:
        """For the name of a temporary file this store's atomic writes make beside
        their target (local disks: ``.<name>.tmp-...``, renamed into place at the
        end): (written on this host, the writer's pid); None for any other name and
        on stores that write whole objects without temporary names."""
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

    # -- deletes confined to the directory pyckpt manages (docs/PROTOCOL.md 1d) -----
    def remove(self, root: str, paths: Iterable[str]) -> None:
        """Deletes files ``paths`` (missing ones are ignored), each checked first by
        ``check_inside(root, path)``: nothing is deleted when one of them is refused.
        pyckpt deletes through this method and ``remove_tree`` only."""
        todo = list(paths)
        checked: set[str] = set()
        for p in todo:
            self.check_inside(root, p, checked)
        if todo:
            self.delete(todo)

    def remove_tree(self, root: str, path: str) -> None:
        """Deletes the directory ``path`` inside ``root`` (checked by ``check_inside``)
        and everything under it; a symbolic link in its place is removed itself, never
        what it points to (``rmtree`` never descends through links below it)."""
        self.check_inside(root, path)
        if self.is_link(path):
            self.delete([path])
        else:
            self.rmtree(path)

    def check_inside(self, root: str, path: str, checked: set[str] | None = None) -> None:
        """Refuses (CheckpointIOError, errno ELOOP) a ``path`` to delete that does not
        lie strictly inside the directory ``root`` as written ('/'-separated, no empty,
        ``.`` or ``..`` component), or that is reached from ``root`` through a symbolic
        link (a checkpoint directory linked to another disk: what lies behind the link
        is never pyckpt's to delete). ``root`` itself may be a link: the user named it.
        ``checked``: directories already found to be no link (a batch's cache)."""
        base = root.rstrip("/")
        rest = path[len(base) + 1:] if path.startswith(base + "/") else None
        parts = rest.split("/") if rest else []
        if not parts or any(p in ("", ".", "..") for p in parts):
            raise CheckpointIOError(errno.EPERM, f"pyckpt refuses to delete {self.url(path)}: "
                                                 f"it is not inside {self.url(root)}")
        here = base
        for part in parts[:-1]:
            here = f"{here}/{part}"
            if checked is not None and here in checked:
                continue
            if self.is_link(here):
                raise CheckpointIOError(
                    errno.ELOOP, f"pyckpt refuses to delete {self.url(path)}: {self.url(here)} "
                                 f"is a symbolic link, and pyckpt never deletes through a link "
                                 f"out of {self.url(root)}")
            if checked is not None:
                checked.add(here)

    @abc.abstractmethod
    def open_write(self, path: str) -> Any:
        """A binary file to stream one object into; it appears whole (and durably)
        when the ``with`` block exits without an error, and not at all otherwise."""

    def sync_dir(self, path: str) -> None:
        """Makes entries created in a directory durable (no-op on object stores)."""

    def write_files(self, files: Sequence[NewFile], *,
                    leftovers: LeftoverUploads | None = None) -> None:
        """Writes new files whole and durably, and confirms every file's size with the
        store before it returns (the caller commits next). On failure it raises; the
        caller deletes the files. ``leftovers``: what the store may clean up beside
        the write (stores with unfinished uploads). This version streams each file
        through ``open_write`` part by part, one file after the other."""
        done = progress.counter()
        for f in files:
            with self.open_write(f.path) as out:
                for b, e in f.parts(STREAM_PART):
                    out.write(f.fill(b, bytearray(e - b)))
                    if done is not None:
                        done.add(e - b)
        self.confirm_sizes({f.path: f.size for f in files})

    def confirm_sizes(self, expected: dict[str, int]) -> None:
        """Acknowledged is not enough: checks what the store holds before a commit."""
        for path, size in expected.items():
            got = self.size(path)
            if got != size:
                raise CheckpointIOError(5, f"upload of {self.url(path)} is incomplete: the store "
                                           f"holds {got} of {size} bytes")
