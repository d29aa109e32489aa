"""An in-process communicator for tests: N threads play N workers.

``ThreadGroup(n).run(fn)`` calls ``fn(comm)`` in n threads, each with its own
``ThreadComm`` (rank 0..n-1), and returns their results or exceptions. A
worker that stops taking part (returns early, raises, or sleeps) makes the
others' next collective time out with WorkerTimeoutError naming it, as a dead
process would with a real engine.
"""

from __future__ import annotations

import threading
from typing import Any, Callable

from ..workers.comm import Communicator, WorkerTimeoutError


class ThreadGroup:
    """``world_size`` workers played by threads of this process, sharing one mailbox;
    their collectives wait at most ``timeout`` seconds."""

    def __init__(self, world_size: int, timeout: float = 10.0) -> None:
        self.world_size = world_size
        self.timeout = timeout
        self._cv = threading.Condition()
        self._slots: dict[tuple[int, int], Any] = {}  # (sequence, rank) -> object
        self._children: dict[int, ThreadGroup] = {}  # background groups, by sequence

    def comm(self, rank: int) -> "ThreadComm":
        """A new communicator of this group for ``rank``."""
        return ThreadComm(self, rank)

    def run(self, fn: Callable[["ThreadComm"], Any]) -> list[Any]:
        """fn(comm) on every rank; each entry is the return value or the exception."""
        out: list[Any] = [None] * self.world_size

        def body(rank: int) -> None:
            try:
                out[rank] = fn(self.comm(rank))
            except BaseException as e:  # noqa: BLE001 - returned to the caller
                out[rank] = e

        threads = [threading.Thread(target=body, args=(r,)) for r in range(self.world_size)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        return out

    def _put(self, seq: int, rank: int, obj: Any) -> None:
        with self._cv:
            self._slots[(seq, rank)] = obj
            self._cv.notify_all()

    def _take(self, seq: int, ranks: list[int], me: int, what: str) -> list[Any]:
        with self._cv:
            ok = self._cv.wait_for(lambda: all((seq, r) in self._slots for r in ranks),
                                   timeout=self.timeout)
            if not ok:
                missing = [r for r in ranks if (seq, r) not in self._slots]
                raise WorkerTimeoutError(f"{what}: rank(s) {missing} did not answer within "
                                         f"{self.timeout} s (rank {me} waiting)")
            return [self._slots[(seq, r)] for r in ranks]


class ThreadComm(Communicator):
    """One worker's communicator in a ThreadGroup (from ``ThreadGroup.comm``)."""

    def __init__(self, group: ThreadGroup, rank: int) -> None:
        self.group = group
        self.rank = rank
        self.world_size = group.world_size
        self.timeout = group.timeout
        self._seq = 0

    def _next(self) -> int:
        self._seq += 1
        return self._seq

    def gather(self, obj: Any, root: int = 0) -> list | None:
        """Every rank's obj, in rank order, on ``root`` (None elsewhere); WorkerTimeoutError
        names the ranks that did not answer within the group's timeout."""
        seq = self._next()
        self.group._put(seq, self.rank, obj)
        if self.rank != root:
            return None
        return self.group._take(seq, list(range(self.world_size)), self.rank, "gather")

    def broadcast(self, obj: Any, root: int = 0) -> Any:
        """``root``'s obj on every rank; WorkerTimeoutError when root does not send in time."""
        seq = self._next()
        if self.rank == root:
            self.group._put(seq, root, obj)
            return obj
        return self.group._take(seq, [root], self.rank, "broadcast")[0]

    background_capable = True

    def background(self) -> "ThreadComm":
        """This rank's communicator in a new group of the same workers (the group made
        by the first rank to reach this call, found by the others at the same call)."""
        seq = self._next()
        with self.group._cv:
            child = self.group._children.setdefault(
                seq, ThreadGroup(self.world_size, self.group.timeout))
        return ThreadComm(child, self.rank)

    def exchange(self, sends: dict, recv_sizes: dict) -> dict:
        """``Communicator.exchange`` through the group's mailbox (copies of the arrays)."""
        seq = self._next()
        self.group._put(seq, self.rank, {d: [a.copy() for a in arrs] for d, arrs in sends.items()})
        got = self.group._take(seq, sorted(recv_sizes), self.rank, "exchange")
        return {src: list(box.get(self.rank, [])) for src, box in zip(sorted(recv_sizes), got)}

    def barrier(self) -> None:
        """Returns once every rank has reached it; else WorkerTimeoutError naming the missing."""
        seq = self._next()
        self.group._put(seq, self.rank, None)
        self.group._take(seq, list(range(self.world_size)), self.rank, "barrier")
