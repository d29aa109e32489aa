"""Local filesystem store: the C++ core reads and writes its files directly.

Every OSError of this store (a full disk, a read-only mount, a permission
denied, a failed fsync or rename) leaves it as a ``CheckpointIOError`` with the
same errno, a message naming the file, and the OSError as ``__cause__``: the
``_os_errors`` decorator on each method is the one place where that happens.
A read of a file that does not exist still raises ``FileNotFoundError`` (the
Store contract), which the reader turns into ``CheckpointNotFoundError`` or,
for a data file, ``CorruptCheckpointError``.
"""

from __future__ import annotations

import errno
import functools
import hashlib
import mmap
import os
import re
import shutil
import socket
from typing import Any, Callable, Iterable, Sequence, TypeVar

from ..errors import CheckpointError, CorruptCheckpointError, io_error
from .base import Store

F = TypeVar("F", bound=Callable[..., Any])


def _os_errors(what: str, *, missing_passes: bool = False) -> Callable[[F], F]:
    """Maps the OSErrors of a store method to CheckpointIOError (``what`` and the
    method's path argument, or the object's ``path``, name the operation and file).
    With ``missing_passes``, FileNotFoundError passes unchanged (reads)."""

    def decorate(fn: F) -> F:
        @functools.wraps(fn)
        def wrapper(self: Any, *args: Any, **kwargs: Any) -> Any:
            try:
                return fn(self, *args, **kwargs)
            except CheckpointError:
                raise
            except OSError as e:
                if missing_passes and isinstance(e, FileNotFoundError):
                    raise
                target = args[0] if args and isinstance(args[0], (str, os.PathLike)) \
                    else getattr(self, "path", None)
                where = f"'{os.fspath(target)}'" if target is not None else "a file"
                raise io_error(e, f"cannot {what} {where}") from e

        return wrapper  # type: ignore[return-value]

    return decorate


class LocalStore(Store):
    """The local filesystem: absolute paths, atomic renames, fsync; every path is
    a native path (the C++ core reads, writes and maps the files itself)."""

    local = True
    atomic_rename = True
    protocol = ""

    def join(self, *parts: str) -> str:
        return os.path.join(*parts)

    def exists(self, path: str) -> bool:
        return os.path.exists(path)

    def isdir(self, path: str) -> bool:
        return os.path.isdir(path)

    def is_link(self, path: str) -> bool:
        return os.path.islink(path)

    def temp_writer(self, name: str) -> tuple[bool, int] | None:
        return temp_writer(name)

    @_os_errors("list")
    def listdir(self, path: str) -> list[str]:
        try:
            return os.listdir(path)
        except (FileNotFoundError, NotADirectoryError):
            return []

    @_os_errors("stat", missing_passes=True)
    def size(self, path: str) -> int:
        return os.stat(path).st_size

    def mtime(self, path: str) -> float | None:
        try:
            return os.stat(path).st_mtime
        except OSError:  # missing or unreadable: no time (used to order candidates only)
            return None

    @_os_errors("read", missing_passes=True)
    def read_bytes(self, path: str) -> bytes:
        with os.fdopen(open_unlinked(path), "rb") as f:
            return f.read()

    @_os_errors("read", missing_passes=True)
    def read_ranges(self, path: str, ranges: Sequence[tuple[int, int]]) -> list[bytes]:
        out = []
        with os.fdopen(open_unlinked(path), "rb") as f:
            for start, end in ranges:
                f.seek(start)
                out.append(f.read(end - start))
        return out

    def native_path(self, path: str) -> str:
        """Every path of this store is a local file the C++ core opens itself."""
        return path

    def map_file(self, path: str) -> mmap.mmap:
        return map_file(path)

    @_os_errors("create the directory")
    def makedirs(self, path: str) -> None:
        os.makedirs(path, exist_ok=True)

    @_os_errors("write")
    def write_atomic(self, path: str, data: bytes) -> None:
        directory = os.path.dirname(path) or "."
        os.makedirs(directory, exist_ok=True)  # like an object store: parents are implicit
        tmp = _temp_name(path)
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o644)
        try:
            view = memoryview(data)
            while view:
                n = os.write(fd, view)
                view = view[n:]
            os.fsync(fd)
        except BaseException:
            _close_quietly(fd)
            _discard(tmp)
            raise
        os.close(fd)
        try:
            os.replace(tmp, path)
        except BaseException:
            _discard(tmp)
            raise
        self.sync_dir(directory)

    def open_write(self, path: str) -> "_AtomicFile":
        return _AtomicFile(self, path)

    def delete(self, paths: Iterable[str]) -> None:
        for p in paths:
            self._unlink(p)

    @_os_errors("delete")
    def _unlink(self, path: str) -> None:
        try:
            os.unlink(path)
        except FileNotFoundError:
            pass

    def rmtree(self, path: str) -> None:
        shutil.rmtree(path, ignore_errors=True)

    @_os_errors("sync the directory")
    def sync_dir(self, path: str) -> None:
        try:
            fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        except FileNotFoundError:
            return
        try:
            os.fsync(fd)
        except OSError as e:  # some filesystems cannot sync directories
            if e.errno not in (errno.EINVAL, errno.EBADF):
                raise
        finally:
            os.close(fd)


def open_unlinked(path: str) -> int:
    """A read-only descriptor of the file ``path``, never through a symbolic link in
    its place: every file a checkpoint names is read so (pyckpt's shards by the C++
    core, every other format's files and indexes here), so a link planted in a
    checkpoint cannot make a read return another file's bytes (docs/FORMAT.md,
    "Links"). The directories above it may be links: the user named them."""
    try:
        return os.open(path, os.O_RDONLY | os.O_CLOEXEC | getattr(os, "O_NOFOLLOW", 0))
    except OSError as e:
        if e.errno == errno.ELOOP and os.path.islink(path):
            raise CorruptCheckpointError(
                f"'{path}' is a symbolic link; pyckpt refuses to follow links inside a "
                "checkpoint (copy the file in, or name the file itself)") from None
        raise


def map_file(path: str) -> mmap.mmap:
    """A read-only memory map of the whole (non-empty) local file ``path``, opened by
    ``open_unlinked``; OSErrors become CheckpointIOError (FileNotFoundError passes
    unchanged)."""
    try:
        fd = open_unlinked(path)
        try:
            return mmap.mmap(fd, 0, access=mmap.ACCESS_READ)
        finally:
            os.close(fd)
    except FileNotFoundError:
        raise
    except OSError as e:
        raise io_error(e, f"cannot map '{path}'") from e


class _AtomicFile:
    """Writes to a temporary name; on a clean exit: fsync, rename, fsync the directory."""

    @_os_errors("write")
    def __init__(self, store: LocalStore, path: str) -> None:
        self.store, self.path = store, path
        self.dir = os.path.dirname(path) or "."
        os.makedirs(self.dir, exist_ok=True)
        self.tmp = _temp_name(path)
        self.f = open(self.tmp, "xb")

    @_os_errors("write")
    def write(self, data: Any) -> int:
        return self.f.write(data)

    def __enter__(self) -> "_AtomicFile":
        return self

    @_os_errors("write")
    def __exit__(self, exc_type: Any, *exc: Any) -> None:
        try:
            if exc_type is None:
                self.f.flush()
                os.fsync(self.f.fileno())
                self.f.close()
                os.replace(self.tmp, self.path)
                self.store.sync_dir(self.dir)
        finally:
            if not self.f.closed:
                try:
                    self.f.close()
                except OSError:
                    pass  # a failed flush of data we are discarding anyway
            _discard(self.tmp)


_HOST_TAG = hashlib.sha1(socket.gethostname().encode()).hexdigest()[:8]
_TEMP = re.compile(r"^\..+\.tmp-([0-9a-f]{8})-([0-9]+)-[0-9a-f]{8}$")


def _temp_name(path: str) -> str:
    """``.<name>.tmp-<host>-<pid>-<random>``: the writer's host and pid tell a later
    sweep whether the write can still finish (``LocalStore.temp_writer``)."""
    directory = os.path.dirname(path) or "."
    return os.path.join(directory, f".{os.path.basename(path)}.tmp-{_HOST_TAG}-"
                                   f"{os.getpid()}-{os.urandom(4).hex()}")


def temp_writer(name: str) -> tuple[bool, int] | None:
    """(written on this host, pid) of the process writing the temporary file ``name``
    (a name ``_temp_name`` made), or None for any other name."""
    m = _TEMP.match(name)
    return None if m is None else (m.group(1) == _HOST_TAG, int(m.group(2)))


def _discard(path: str) -> None:
    """Best-effort removal of a temporary file while another error is reported."""
    try:
        os.unlink(path)
    except OSError:
        pass


def _close_quietly(fd: int) -> None:
    try:
        os.close(fd)
    except OSError:
        pass
