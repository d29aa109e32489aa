"""Local filesystem store: the C++ core reads and writes its files directly."""

from __future__ import annotations

import errno
import os
import shutil
from typing import Any, Iterable, Sequence

from .base import Store


class LocalStore(Store):
    local = True
    atomic_rename = True
    protocol = ""

    def join(self, *parts: str) -> str:
        return os.path.join(*parts)

    def exists(self, path: str) -> bool:
        return os.path.exists(path)

    def isdir(self, path: str) -> bool:
        return os.path.isdir(path)

    def listdir(self, path: str) -> list[str]:
        try:
            return os.listdir(path)
        except (FileNotFoundError, NotADirectoryError):
            return []

    def size(self, path: str) -> int:
        return os.stat(path).st_size

    def mtime(self, path: str) -> float | None:
        try:
            return os.stat(path).st_mtime
        except FileNotFoundError:
            return None

    def read_bytes(self, path: str) -> bytes:
        with open(path, "rb") as f:
            return f.read()

    def read_ranges(self, path: str, ranges: Sequence[tuple[int, int]]) -> list[bytes]:
        out = []
        with open(path, "rb") as f:
            for start, end in ranges:
                f.seek(start)
                out.append(f.read(end - start))
        return out

    def makedirs(self, path: str) -> None:
        os.makedirs(path, exist_ok=True)

    def write_atomic(self, path: str, data: bytes) -> None:
        directory = os.path.dirname(path) or "."
        os.makedirs(directory, exist_ok=True)  # like an object store: parents are implicit
        tmp = os.path.join(directory, f".{os.path.basename(path)}.tmp-{os.getpid()}-{os.urandom(4).hex()}")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o644)
        try:
            view = memoryview(data)
            while view:
                n = os.write(fd, view)
                view = view[n:]
            os.fsync(fd)
        except BaseException:
            os.close(fd)
            _unlink(tmp)
            raise
        os.close(fd)
        try:
            os.replace(tmp, path)
        except BaseException:
            _unlink(tmp)
            raise
        self.sync_dir(directory)

    def open_write(self, path: str) -> "_AtomicFile":
        return _AtomicFile(self, path)

    def delete(self, paths: Iterable[str]) -> None:
        for p in paths:
            _unlink(p)

    def rmtree(self, path: str) -> None:
        shutil.rmtree(path, ignore_errors=True)

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


class _AtomicFile:
    """Writes to a temporary name; on a clean exit: fsync, rename, fsync the directory."""

    def __init__(self, store: LocalStore, path: str) -> None:
        self.store, self.path = store, path
        self.dir = os.path.dirname(path) or "."
        os.makedirs(self.dir, exist_ok=True)
        self.tmp = os.path.join(self.dir, f".{os.path.basename(path)}.tmp-{os.getpid()}-{os.urandom(4).hex()}")
        self.f = open(self.tmp, "xb")

    def write(self, data: Any) -> int:
        return self.f.write(data)

    def __enter__(self) -> "_AtomicFile":
        return self

    def __exit__(self, exc_type: Any, *exc: Any) -> None:
        try:
            if exc_type is None:
                self.f.flush()
                os.fsync(self.f.fileno())
            self.f.close()
            if exc_type is None:
                os.replace(self.tmp, self.path)
                self.store.sync_dir(self.dir)
        finally:
            if os.path.exists(self.tmp):
                _unlink(self.tmp)


def _unlink(path: str) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass
