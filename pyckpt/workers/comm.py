"""Communicators: the few collective operations a multi-worker save needs,
over an existing distributed engine (no networking of pyckpt's own).

Every call takes a timeout; a worker that does not answer in time makes the
call raise ``WorkerTimeoutError`` (naming the worker where the engine says
which) instead of hanging.
"""

from __future__ import annotations

import abc
import contextlib
import datetime
import sys
import threading
import time
from typing import Any, Iterator

import numpy as np

from ..errors import WorkerTimeoutError

DEFAULT_TIMEOUT = 300.0


class Communicator(abc.ABC):
    """rank / world_size plus object collectives; rank 0 coordinates."""

    rank: int = 0
    world_size: int = 1
    timeout: float = DEFAULT_TIMEOUT

    @abc.abstractmethod
    def gather(self, obj: Any, root: int = 0) -> list | None:
        """Every worker's obj, in rank order, on root (None elsewhere)."""

    @abc.abstractmethod
    def broadcast(self, obj: Any, root: int = 0) -> Any:
        """root's obj, on every worker."""

    @abc.abstractmethod
    def barrier(self) -> None:
        """Returns once every worker has reached the barrier."""

    def all_gather(self, obj: Any) -> list:
        """Every worker's obj, in rank order, on every worker (a gather to rank 0, then a
        broadcast)."""
        return self.broadcast(self.gather(obj))

    #: whether ``background`` can make a communicator for a background thread
    background_capable: bool = False

    def background(self) -> "Communicator":
        """Collective (every worker, at the same point, in the caller's thread): a new
        communicator of the same workers for one background thread of each worker.
        Its collectives never mix with those of this communicator (the training job's
        own), so a background thread may run a whole protocol on it. Only where
        ``background_capable``; else NotImplementedError."""
        raise NotImplementedError(f"{type(self).__name__} cannot make a background communicator")

    def exchange(self, sends: dict[int, list[np.ndarray]],
                 recv_sizes: dict[int, list[int]]) -> dict[int, list[np.ndarray]]:
        """Point-to-point byte transfers, called by every worker at once: sends each
        ``sends[dest]`` list of uint8 arrays to ``dest`` and returns, per source, the
        arrays of the sizes ``recv_sizes[source]`` that it sent here (both sides agree on
        the sizes beforehand). This default goes through ``all_gather`` (every array
        passes through rank 0); the engines' own classes send point to point."""
        everyone = self.all_gather({d: [np.asarray(a, np.uint8) for a in arrs]
                                    for d, arrs in sends.items()})
        return {src: list(everyone[src].get(self.rank, [])) for src in recv_sizes}


class SingleComm(Communicator):
    """One process: every collective is trivial."""

    def gather(self, obj: Any, root: int = 0) -> list:
        """``[obj]``: the one worker's object."""
        return [obj]

    def broadcast(self, obj: Any, root: int = 0) -> Any:
        """``obj`` itself."""
        return obj

    def barrier(self) -> None:
        """Returns at once."""
        pass


class TorchComm(Communicator):
    """torch.distributed (gloo on CPU, nccl on GPU; object collectives need a CPU-capable
    group: with nccl pass a gloo ``group``). The process group's timeout bounds every
    call; ``timeout`` is used for barriers (``monitored_barrier`` on gloo names the
    missing ranks)."""

    def __init__(self, group: Any = None, timeout: float | None = None) -> None:
        import torch.distributed as dist  # optional dependency

        if not dist.is_available() or not dist.is_initialized():
            raise RuntimeError("TorchComm needs an initialized torch.distributed process group")
        self._dist = dist
        self.group = group
        self.rank = dist.get_rank(group)
        self.world_size = dist.get_world_size(group)
        self.timeout = float(timeout) if timeout is not None else DEFAULT_TIMEOUT

    def _global(self, rank: int) -> int:
        return rank if self.group is None else self._dist.get_global_rank(self.group, rank)

    background_capable = True

    def background(self) -> "TorchComm":
        """A new gloo group of the same ranks, with this communicator's timeout, made by
        ``new_group`` (every rank of the group calls it)."""
        ranks = None if self.group is None else self._dist.get_process_group_ranks(self.group)
        group = self._dist.new_group(ranks=ranks, backend="gloo",
                                     timeout=datetime.timedelta(seconds=self.timeout),
                                     use_local_synchronization=ranks is not None)
        return TorchComm(group, self.timeout)

    def _fail(self, what: str, e: BaseException) -> WorkerTimeoutError:
        err = WorkerTimeoutError(f"torch.distributed {what} failed on rank {self.rank}: {e}")
        err.__cause__ = e
        return err

    def gather(self, obj: Any, root: int = 0) -> list | None:
        """Every worker's obj, in rank order, on ``root`` (a rank of ``group``; None
        elsewhere), through ``gather_object``; an engine error (its timeout included)
        is raised as WorkerTimeoutError."""
        out = [None] * self.world_size if self.rank == root else None
        try:
            self._dist.gather_object(obj, out, dst=self._global(root), group=self.group)
        except RuntimeError as e:
            raise self._fail("gather", e) from e
        return out

    def broadcast(self, obj: Any, root: int = 0) -> Any:
        """``root``'s obj on every worker, through ``broadcast_object_list``; an engine
        error (its timeout included) is raised as WorkerTimeoutError."""
        box = [obj]
        try:
            self._dist.broadcast_object_list(box, src=self._global(root), group=self.group)
        except RuntimeError as e:
            raise self._fail("broadcast", e) from e
        return box[0]

    def exchange(self, sends: dict[int, list[np.ndarray]],
                 recv_sizes: dict[int, list[int]]) -> dict[int, list[np.ndarray]]:
        """``Communicator.exchange`` with ``isend``/``irecv`` of uint8 CPU tensors (gloo;
        empty arrays are not sent); an engine error is raised as WorkerTimeoutError."""
        import torch  # optional dependency

        out = {src: [np.empty(n, np.uint8) for n in sizes] for src, sizes in recv_sizes.items()}
        try:
            works = [self._dist.irecv(torch.from_numpy(a), src=self._global(src), group=self.group)
                     for src, arrs in out.items() for a in arrs if a.size]
            works += [self._dist.isend(torch.frombuffer(np.ascontiguousarray(a).data,
                                                        dtype=torch.uint8),
                                       dst=self._global(dest), group=self.group)
                      for dest, arrs in sends.items() for a in arrs if a.size]
            for w in works:
                w.wait()
        except RuntimeError as e:
            raise self._fail("exchange", e) from e
        return out

    def barrier(self) -> None:
        """A ``monitored_barrier`` bounded by ``timeout`` on gloo (naming the missing ranks),
        else a plain barrier; an engine error is raised as WorkerTimeoutError."""
        try:
            if self._dist.get_backend(self.group) == "gloo":
                self._dist.monitored_barrier(group=self.group,
                                             timeout=datetime.timedelta(seconds=self.timeout),
                                             wait_all_ranks=True)
            else:
                self._dist.barrier(group=self.group)
        except RuntimeError as e:
            raise self._fail("barrier", e) from e


class MPIComm(Communicator):
    """mpi4py. Object collectives are built from non-blocking point-to-point
    messages polled until ``timeout``, so a stuck worker raises
    WorkerTimeoutError naming it instead of hanging (a worker that dies usually
    makes the MPI launcher end the whole job)."""

    _TAG_BASE = 0x5C4E0

    def __init__(self, comm: Any = None, timeout: float | None = None) -> None:
        from mpi4py import MPI  # optional dependency

        self._MPI = MPI
        self.comm = comm if comm is not None else MPI.COMM_WORLD
        self.rank = self.comm.Get_rank()
        self.world_size = self.comm.Get_size()
        self.timeout = float(timeout) if timeout is not None else DEFAULT_TIMEOUT
        self._seq = 0

    @property
    def background_capable(self) -> bool:  # type: ignore[override]
        """With MPI_THREAD_MULTIPLE (mpi4py's default): a second thread may call MPI."""
        return bool(self._MPI.Query_thread() >= self._MPI.THREAD_MULTIPLE)

    def background(self) -> "MPIComm":
        """``Dup`` of the communicator (collective), with the same timeout."""
        if not self.background_capable:
            raise NotImplementedError("MPI was not initialized with MPI_THREAD_MULTIPLE")
        return MPIComm(self.comm.Dup(), self.timeout)

    def _tag(self) -> int:
        self._seq = (self._seq + 1) % 4096
        return self._TAG_BASE + self._seq

    def _poll(self, test: Any, what: str) -> Any:
        deadline = time.monotonic() + self.timeout
        spins = 0
        while True:
            done, value = test()
            if done:
                return value
            if time.monotonic() > deadline:
                raise WorkerTimeoutError(f"MPI {what} did not complete within {self.timeout:.0f} s "
                                         f"(rank {self.rank} waiting): that worker is dead or stuck")
            spins += 1
            # spin briefly, then sleep at most 1 ms: a late wake-up delays every worker
            time.sleep(0 if spins < 200 else 0.001)

    def _recv(self, source: int, tag: int, what: str) -> Any:
        def test() -> tuple[bool, Any]:
            msg = self.comm.improbe(source=source, tag=tag)
            return (msg is not None, msg)

        return self._poll(test, f"{what}: rank {source}").recv()

    def _wait_sent(self, reqs: list, what: str) -> None:
        for dest, req in reqs:
            self._poll(lambda req=req: (req.Test(), None), f"{what}: sending to rank {dest}")

    def gather(self, obj: Any, root: int = 0) -> list | None:
        """Every worker's obj, in rank order, on ``root`` (None elsewhere), received in
        arrival order; WorkerTimeoutError names the ranks that did not answer in time."""
        tag = self._tag()
        if self.rank != root:
            self._wait_sent([(root, self.comm.isend(obj, dest=root, tag=tag))], "gather")
            return None
        out: list = [None] * self.world_size
        out[root] = obj
        pending = set(range(self.world_size)) - {root}
        while pending:  # in arrival order, whoever is first
            def test() -> tuple[bool, Any]:
                msg = self.comm.improbe(source=self._MPI.ANY_SOURCE, tag=tag)
                return (msg is not None, msg)

            try:
                msg = self._poll(test, "gather")
            except WorkerTimeoutError as e:
                raise WorkerTimeoutError(f"{e}; no answer from rank(s) {sorted(pending)}") from None
            status = self._MPI.Status()
            value = msg.recv(status=status)
            out[status.Get_source()] = value
            pending.discard(status.Get_source())
        return out

    def broadcast(self, obj: Any, root: int = 0) -> Any:
        """``root``'s obj on every worker, sent point to point; WorkerTimeoutError when a
        send or the receive does not complete in time."""
        tag = self._tag()
        if self.rank == root:
            reqs = [(d, self.comm.isend(obj, dest=d, tag=tag))
                    for d in range(self.world_size) if d != root]
            self._wait_sent(reqs, "broadcast")
            return obj
        return self._recv(root, tag, "broadcast")

    def exchange(self, sends: dict[int, list[np.ndarray]],
                 recv_sizes: dict[int, list[int]]) -> dict[int, list[np.ndarray]]:
        """``Communicator.exchange`` with ``Isend``/``Irecv`` of byte buffers, polled until
        ``timeout`` (WorkerTimeoutError names the peer); empty arrays are not sent."""
        tag = self._tag()
        out = {src: [np.empty(n, np.uint8) for n in sizes] for src, sizes in recv_sizes.items()}
        reqs = [(src, self.comm.Irecv(a, source=src, tag=tag))
                for src, arrs in out.items() for a in arrs if a.size]
        reqs += [(dest, self.comm.Isend(np.ascontiguousarray(a, np.uint8), dest=dest, tag=tag))
                 for dest, arrs in sends.items() for a in arrs if a.size]
        for peer, req in reqs:
            self._poll(lambda req=req: (req.Test(), None), f"exchange with rank {peer}")
        return out

    def barrier(self) -> None:
        """A non-blocking barrier polled until ``timeout``, then WorkerTimeoutError."""
        req = self.comm.Ibarrier()
        self._poll(lambda: (req.Test(), None), "barrier")


_SCOPE = threading.local()


@contextlib.contextmanager
def comm_scope(comm: Communicator | None) -> Iterator[None]:
    """Within the block, in this thread, ``resolve_comm(None)`` answers ``comm`` (a
    manager restoring with its communicator: PerWorker values pick their row by it)."""
    previous = getattr(_SCOPE, "comm", None)
    _SCOPE.comm = comm
    try:
        yield
    finally:
        _SCOPE.comm = previous


def resolve_comm(comm: Communicator | None) -> Communicator | None:
    """The communicator to use: the one given; else the one of an enclosing
    ``comm_scope``; else an initialized torch.distributed default group (only if
    torch is already imported); else None (one process)."""
    if comm is not None:
        return comm
    scoped = getattr(_SCOPE, "comm", None)
    if scoped is not None:
        return scoped
    torch = sys.modules.get("torch")
    if torch is not None:
        try:
            import torch.distributed as dist  # optional dependency

            if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
                return TorchComm()
        except Exception:  # noqa: BLE001 - a broken torch install must not break saves
            return None
    return None
