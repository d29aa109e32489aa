"""Whole files from sequential producers, written through a store's one guarded
write path (``Store.write_files``).

Copies, persists and exports produce a file's bytes in order (a verified window
of the source, a tensor after the other), while ``write_files`` asks for any part
in any order, from several threads, and again after a failed attempt. A
``StreamedFile`` bridges the two: it runs the producer as far as a request needs,
keeps what was produced but not yet asked for (bounded by the parts in flight),
and starts the producer again from the beginning when an earlier part is asked for
a second time (a whole-file retry). The producer must give the same bytes on every
run.
"""

from __future__ import annotations

import threading
from typing import Any, Callable, Iterable, Iterator

from .. import progress
from .base import LeftoverUploads, NewFile

__all__ = ["StreamedFile", "earlier_uploads_of", "write_stream"]


class StreamedFile:
    """A file of ``size`` bytes at ``path`` whose bytes ``produce()`` yields in order,
    as bytes-like pieces of any size; ``new_file()`` is its ``NewFile``."""

    def __init__(self, path: str, size: int, produce: Callable[[], Iterable[Any]]) -> None:
        self.path, self.size, self._produce = path, size, produce
        self._lock = threading.Lock()
        self._restart()

    def new_file(self) -> NewFile:
        return NewFile(self.path, self.size, self.fill)

    def _restart(self) -> None:
        self._gen: Iterator[Any] = iter(self._produce())
        self._pieces: list[tuple[int, memoryview]] = []  # (offset, bytes) kept
        self._end = 0        # bytes produced so far
        self._done = 0       # every byte below this was handed out (and is dropped)
        self._handed: list[tuple[int, int]] = []  # ranges handed out above _done

    def fill(self, begin: int, buf: bytearray) -> bytearray:
        end = begin + len(buf)
        if begin < 0 or end > self.size:
            raise ValueError(f"{self.path}: bytes [{begin}, {end}) are outside its {self.size}")
        with self._lock:
            if begin < self._done:  # asked again (a retry): produce from the start
                self._restart()
            while self._end < end:
                try:
                    piece = memoryview(next(self._gen)).cast("B")
                except StopIteration:
                    raise ValueError(f"{self.path}: the producer stopped at byte {self._end} "
                                     f"of {self.size}") from None
                if len(piece):
                    self._pieces.append((self._end, piece))
                    self._end += len(piece)
            if end == self.size and self._end > self.size:
                raise ValueError(f"{self.path}: the producer gave more than {self.size} bytes")
            out = memoryview(buf)
            for off, piece in self._pieces:
                lo, hi = max(off, begin), min(off + len(piece), end)
                if lo < hi:
                    out[lo - begin:hi - begin] = piece[lo - off:hi - off]
            self._handed_out(begin, end)
        return buf

    def _handed_out(self, begin: int, end: int) -> None:
        """Records [begin, end) as handed out and drops the pieces below the first
        byte not handed out yet."""
        self._handed.append((begin, end))
        self._handed.sort()
        rest = []
        for b, e in self._handed:
            if b <= self._done:
                self._done = max(self._done, e)
            else:
                rest.append((b, e))
        self._handed = rest
        self._pieces = [(off, p) for off, p in self._pieces if off + len(p) > self._done]


def write_stream(store: Any, path: str, size: int, produce: Callable[[], Iterable[Any]],
                 leftovers: LeftoverUploads | None = None) -> None:
    """Writes one new file of ``size`` bytes that ``produce()`` yields in order (as
    bytes-like pieces) through ``store.write_files``, so a stream gets the same
    retries, limits and cleanup as a save's files. ``produce`` may be called again for
    a retry and must give the same bytes. On failure the caller deletes the file.

    ``leftovers``: what the store may clean up beside the write (``write_files``), e.g.
    ``earlier_uploads_of(path)`` for a file of a fixed name (an export, written again
    by the same route after a failure).

    A local store's file (``store.local``: no requests to guard, no finalizer that can
    hang) is written straight from the producer's pieces, in order, through its
    atomic ``open_write``: no part buffers, no copy."""
    if not getattr(store, "local", False):
        store.write_files([StreamedFile(path, size, produce).new_file()], leftovers=leftovers)
        return
    done = progress.counter()
    written = 0
    with store.open_write(path) as out:
        for piece in produce():
            n = memoryview(piece).nbytes
            if written + n > size:
                raise ValueError(f"{path}: the producer gave more than {size} bytes")
            out.write(piece)
            written += n
            if done is not None:
                done.add(n)
        if written != size:
            raise ValueError(f"{path}: the producer stopped at byte {written} of {size}")


def earlier_uploads_of(path: str) -> LeftoverUploads | None:
    """The unfinished uploads of the object ``path`` itself, whoever started them,
    cleaned up before a new write of it (None for an object at a bucket's top)."""
    folder, _, name = path.rstrip("/").rpartition("/")
    if "/" not in folder:
        return None
    return LeftoverUploads(folder, lambda n: "earlier" if n == name else None, None,
                           lambda writer: False, first=True)
