"""The one save path. ``pyckpt.save``, ``Checkpoint.write``/``save`` and
``CheckpointManager.save`` all end here (docs/ARCHITECTURE.md, "Walk of a save").

``write`` resolves the store and the communicator, reports progress, and picks
single-process (engine/writer.py) or multi-worker (workers/save.py) saving.
``stage`` is the background variant: it copies the values aside and returns the
work that writes them; ``start`` runs that work in a thread of its own and
returns a ``PendingSave`` (``pyckpt.save(..., blocking=False)``). ``numbered``
bumps a save counter and gives the number back if the save fails.
"""

from __future__ import annotations

import contextlib
import threading
import warnings
from typing import Any, Callable, Iterator, Sequence

import numpy as np

from . import ordering
from . import progress as _progress
from .workers.comm import Communicator, SingleComm, resolve_comm
from .device.array import DeviceArray
from .device.buffers import StagingBuffers, check_budget, lease_shared
from .device.staging import has_device_values, stage_values
from .engine.options import DEFAULT
from .workers import background
from .workers.save import NodeLocalSave, distributed_save, plan_save
from .engine.write_executor import can_stage
from .engine.incremental import Base, save_incremental
from .engine.writer import StagedSave, save_tensors
from .sharded import ShardedArray
from .sharded.perworker import PerWorker
from .storage import Store, resolve
from .variables import Variable

__all__ = ["Item", "PendingSave", "Background", "write", "stage", "start", "numbered"]


class Item:
    """One value to save: its key, the array written by a single process (a host
    array, or a DeviceArray staged through host buffers), and the object a
    multi-worker save plans with (a ShardedArray block, a PerWorker declaration,
    or the array itself)."""

    __slots__ = ("key", "array", "obj")

    def __init__(self, key: str, array: np.ndarray | DeviceArray, obj: Any = None) -> None:
        self.key, self.array = key, array
        self.obj = array if obj is None else obj


def write(items: Sequence[Item], path: Any, *, storage_options: dict | None = None,
          comm: Communicator | None = None,
          progress: Callable[[int, int], Any] | None = None, tree: Any = None,
          graph: dict | None = None, metadata: dict | None = None,
          node_local: int | None = None, base: Base | None = None,
          incremental: bool = False, max_pinned_bytes: int | None = None) -> None:
    """Writes and commits one checkpoint at ``path`` (returns once it is durable,
    on every worker). ``node_local=k``: a multi-worker job's node-local checkpoint,
    ``path`` being this worker's own, with k replicas (workers/node_local.py).
    ``incremental``: an incremental save (engine/incremental.py) referencing the
    unchanged data of ``base`` (None: a full one that records fingerprints).
    ``max_pinned_bytes``: device values are staged within that much pinned memory
    (device/ring.py; single-process saves to local files only)."""
    store, p = resolve(path, storage_options)
    comm, multi = _mode(items, comm)
    _check_incremental(incremental, node_local)
    check_budget(max_pinned_bytes)
    turn = ordering.take(_place(store, p, comm), blocking=True)  # in call order
    try:  # the turn is held inside the progress monitor's life: one of its callbacks may
        # save to the same place (it waits for this turn; the monitor is joined after it)
        with _progress.reporting(progress, sum(it.array.nbytes for it in items)):
            with turn.held():
                _write(items, store, p, comm, multi, tree=tree, graph=graph,
                       metadata=metadata, node_local=node_local, base=base,
                       incremental=incremental, max_pinned_bytes=max_pinned_bytes)
    finally:
        turn.end()


def _place(store: Store, path: str, comm: Communicator | None) -> str:
    """What orders this worker's saves (ordering.py): the directory and the worker's rank."""
    return ordering.place(store, path, comm.rank if comm is not None else 0)


def _write(items: Sequence[Item], store: Store, p: str, comm: Communicator | None,
           multi: bool, *, tree: Any, graph: dict | None, metadata: dict | None,
           node_local: int | None, base: Base | None, incremental: bool,
           max_pinned_bytes: int | None) -> None:
    """``write``'s work, in its turn."""
    if has_device_values([it.array for it in items]):
        _write_from_device(items, store, p, multi, lambda host: _write(
            host, store, p, comm, multi, tree=tree, graph=graph, metadata=metadata,
            node_local=node_local, base=base, incremental=incremental,
            max_pinned_bytes=None), tree=tree, graph=graph,
            metadata=metadata, base=base, incremental=incremental,
            max_pinned_bytes=max_pinned_bytes)
    elif multi:
        assert comm is not None
        distributed_save(comm, store, p, [(it.key, _planned(it)) for it in items],
                         tree=tree, graph=graph, metadata=metadata,
                         node_local=node_local is not None, replicate=node_local or 0,
                         incremental=incremental, base=base)
    elif incremental:
        save_incremental(store, p, [(it.key, it.array) for it in items], base, tree=tree,
                         graph=graph, metadata=metadata, keys_checked=True)
    else:
        save_tensors(store, p, [(it.key, it.array) for it in items], tree=tree, graph=graph,
                     metadata=metadata, keys_checked=True)


def _check_incremental(incremental: bool, node_local: int | None) -> None:
    if incremental and node_local is not None:
        raise NotImplementedError(
            "incremental saves of node-local tiers are not supported yet: save them with "
            "incremental=False (docs/API.md section 18)")


def _planned(it: Item) -> Any:
    """What a multi-worker save plans ``it`` as: its ShardedArray block, a PerWorker of its
    (host) array, or the array."""
    if isinstance(it.obj, ShardedArray):
        return it.obj
    return PerWorker(it.array) if isinstance(it.obj, PerWorker) else it.array


def _write_from_device(items: Sequence[Item], store: Store, path: str, multi: bool,
                       write_host: Callable[[list[Item]], None], *, tree: Any,
                       graph: dict | None, metadata: dict | None, base: Base | None = None,
                       incremental: bool = False, max_pinned_bytes: int | None = None) -> None:
    """A blocking save of values of which some live in device memory. One process:
    the device copies land in reusable (pinned) staging buffers and the writers
    start on each as soon as it landed (``stage``); host values are written from
    where they are. Multi-worker: every value is staged to host memory first, then
    saved as host arrays (``write_host``)."""
    keys = [it.key for it in items]
    live = [it.array for it in items]
    buffers, done = lease_shared(max_pinned_bytes)
    try:
        staging = buffers.get(keys, live, copy_host=False,
                              ring_from=ring_from(store, path, live, multi, incremental))
        if multi:
            stage_values(live, staging)
            write_host([Item(it.key, a, a if it.obj is it.array else it.obj)
                        for it, a in zip(items, staging)])
        else:
            stage(store, path, keys, live, staging, graph=graph, tree=tree,
                  metadata=metadata, base=base, incremental=incremental,
                  ring=buffers.ring_items)()
    finally:
        done()


def ring_from(store: Store, path: str, live: Sequence[Any], multi: bool,
              incremental: bool) -> int | None:
    """The size from which device values may be staged through a ring of pinned
    memory (``max_pinned_bytes``): the checksum chunk, for the saves ``stage`` runs
    as a StagedSave; None for the others (they need the whole state staged)."""
    if multi or incremental or not _stages_natively(store, path, live):
        return None
    return DEFAULT.chunk_size


def _stages_natively(store: Store, path: str, live: Sequence[Any]) -> bool:
    """Whether ``stage`` writes while it copies (a StagedSave: local files, native
    byte order)."""
    return all(a.dtype.byteorder in "=<|" for a in live) and can_stage(store, path)


def stage(store: Store, path: str, keys: list[str], live: list[Any],
          staging: list[np.ndarray], *, graph: dict | None, tree: Any = None,
          metadata: dict | None = None, base: Base | None = None,
          incremental: bool = False, ring: dict[int, np.ndarray] | None = None
          ) -> Callable[[], Any]:
    """Copies ``live`` (host arrays and DeviceArrays) into ``staging`` (host arrays
    of the same shapes and dtypes, reused across saves; a staging array that is its
    live array is not copied) and returns, once the live values may change again,
    the work that writes and commits the checkpoint from the copies. Where the
    store can write local files, writing starts while the copies run (not for an
    incremental save: it compares the copies before it writes). ``ring``: the
    values staged through a ring of pinned memory (``StagingBuffers.ring_items``;
    only where ``ring_from`` allowed one)."""
    if incremental:
        stage_values(live, staging)
        return lambda: save_incremental(store, path, list(zip(keys, staging)), base,
                                        graph=graph, tree=tree, metadata=metadata,
                                        keys_checked=True)
    if _stages_natively(store, path, live):  # the C++ core writes the files
        staged = StagedSave(store, path, keys, live, staging, graph=graph, metadata=metadata,
                            tree=tree, ring=ring)
        staged.stage()
        return staged.finish
    stage_values(live, staging)
    return lambda: save_tensors(store, path, list(zip(keys, staging)), graph=graph, tree=tree,
                                metadata=metadata, keys_checked=True)


class PendingSave:
    """A save running in the background: the one background runner of saves
    (``pyckpt.save(..., blocking=False)``, ``CheckpointManager.save(blocking=False)``;
    one process or many, node-local or not; a node-local save whose communicator
    cannot run a background part is saved blocking, and its handle comes back done).

    The values were copied aside before it was returned, so the caller may change
    them at once. ``wait()`` blocks until the checkpoint is committed and returns
    its path, or raises the save's error; ``done()`` says whether it finished."""

    def __init__(self, path: str, work: Callable[[], Any] | None = None, *,
                 then: Callable[[BaseException | None], Any] | None = None,
                 release: Callable[[], Any] | None = None,
                 cleanup: Callable[[], Any] | None = None) -> None:
        self.path = path
        self._finished = threading.Event()
        self._error: BaseException | None = None
        self._cleanup = cleanup
        self._thread: threading.Thread | None = None
        if work is not None:  # not a daemon: a pending save finishes at interpreter exit
            self._thread = threading.Thread(target=self._run, args=(work, then, release),
                                            name="pyckpt-save")
            self._thread.start()

    def _run(self, work: Callable[[], Any], then: Callable[[BaseException | None], Any] | None,
             release: Callable[[], Any] | None = None) -> None:
        try:
            try:
                work()
            except BaseException as e:  # re-raised by wait()
                self._error = e
            if then is not None:  # the owner's bookkeeping (a manager records the commit)
                try:
                    then(self._error)
                except BaseException as e:
                    self._error = self._error or e
            if self._error is None:
                self._cleanup = None  # nothing to remove; do not keep what it refers to
        finally:
            try:
                if release is not None:
                    release()
            except BaseException as e:
                self._error = self._error or e
            finally:
                self._finished.set()

    def done(self) -> bool:
        """Whether the save has finished (committed, or failed)."""
        return self._finished.is_set()

    def join(self, timeout: float | None = None) -> None:
        """Waits (at most ``timeout`` seconds) for the save to finish, without raising
        its error (a no-op from the save's own thread)."""
        if self._thread is not threading.current_thread():
            self._finished.wait(timeout)

    @property
    def error(self) -> BaseException | None:
        """The save's error once it finished (None: committed, or still running)."""
        return self._error

    def wait(self, timeout: float | None = None) -> str:
        """Waits for the commit and returns the path; raises the save's error, or
        TimeoutError when ``timeout`` seconds pass first."""
        if not self._finished.wait(timeout):
            raise TimeoutError(f"the save of {self.path} is still running after {timeout} s")
        if self._error is not None:
            raise self._error
        return self.path

    def discard(self) -> None:
        """Removes what the failed save left (its attempt's files) once every worker is
        done with it (a multi-worker save; a no-op otherwise)."""
        if self._error is not None and self._cleanup is not None:
            cleanup, self._cleanup = self._cleanup, None
            try:
                cleanup()
            except OSError as e:
                warnings.warn(f"could not remove the files of the failed save of {self.path}: "
                              f"{e}", stacklevel=2)

    def __repr__(self) -> str:
        state = "running" if not self.done() else "failed" if self._error else "committed"
        return f"<PendingSave {self.path!r}: {state}>"


class Background:
    """What one owner's background saves keep from one save to the next (a manager's):
    the staging buffers (reused when shapes and dtypes match; ``warm`` allocates them
    ahead, ``release`` frees them) and, for node-local saves, the communicator their
    background part runs its collectives on."""

    def __init__(self, max_pinned_bytes: int | None = None) -> None:
        self.buffers = StagingBuffers(max_pinned_bytes)
        self._warming: threading.Thread | None = None
        self.comm: Communicator | None = None

    def ready(self) -> None:
        """Waits for ``warm``'s allocation, if one runs."""
        if self._warming is not None:
            self._warming.join()
            self._warming = None

    def get(self, keys: list[str], srcs: list[Any], *,
            ring_from: int | None = None) -> list[np.ndarray]:
        self.ready()
        return self.buffers.get(keys, srcs, ring_from=ring_from)

    def warm(self, keys: list[str], srcs: list[Any]) -> None:
        """Allocates (and pins) the staging buffers in a background thread (not with a
        pinned budget: its ring is small, and sized by the first save)."""
        if self.buffers.max_pinned_bytes is not None:
            return
        self._warming = threading.Thread(target=self.buffers.get, args=(keys, srcs),
                                         name="pyckpt-warm-staging", daemon=True)
        self._warming.start()

    def release(self) -> None:
        self.ready()
        self.buffers.release()

    def background_comm(self, comm: Communicator) -> Communicator:
        """Collective: the background communicator of node-local saves, made at the first
        such save and made anew by all after one failed anywhere (its collectives may
        be out of step)."""
        if any(comm.all_gather(self.comm is None)):
            self.comm = comm.background()
        assert self.comm is not None
        return self.comm


def start(items: Sequence[Item], path: Any, *, storage_options: dict | None = None,
          comm: Communicator | None = None,
          progress: Callable[[int, int], Any] | None = None, tree: Any = None,
          graph: dict | None = None, metadata: dict | None = None,
          node_local: int | None = None, keep: Background | None = None,
          then: Callable[[BaseException | None], Any] | None = None,
          base: Base | None = None, incremental: bool = False,
          max_pinned_bytes: int | None = None) -> PendingSave:
    """``write`` in the background, in every mode: returns once every value is copied
    aside into staging buffers (one host copy of the state, pinned for device values;
    ``keep``'s, else the process-wide ones kept for the next save:
    ``pyckpt.device.release_staging_memory()`` frees them). With several workers (or
    sharded values) every worker calls it at the same point: the collectives that
    plan the save run here, and the background part talks through the store only
    (docs/PROTOCOL.md section 6b); a node-local save's background part runs its
    collectives on ``keep``'s background communicator (section 7b), and is saved
    blocking where the communicator cannot make one. ``then(error)`` runs in the
    background thread once the save ended (its error becomes the save's).
    ``progress`` is refused: its monitor lives in the caller's context, which a
    background save outlives."""
    if progress is not None:
        raise ValueError("progress= cannot be combined with blocking=False (yet): poll "
                         "the returned handle's done() instead")
    shown = str(path.__fspath__()) if hasattr(path, "__fspath__") else str(path)
    store, p = resolve(path, storage_options)
    comm, multi = _mode(items, comm)
    _check_incremental(incremental, node_local)
    if multi and node_local is not None and not (comm and comm.background_capable):
        handle = PendingSave(shown)
        handle._run(lambda: write(items, path, storage_options=storage_options, comm=comm,
                                  tree=tree, graph=graph, metadata=metadata,
                                  node_local=node_local), then)
        return handle
    check_budget(max_pinned_bytes)
    turn = ordering.take(_place(store, p, comm), blocking=False)  # in call order
    if keep is not None:  # its own budget (the manager's max_pinned_bytes)
        buffers, get, release = keep.buffers, keep.get, None
    else:
        buffers, release = lease_shared(max_pinned_bytes)
        get = buffers.get
    keys = [it.key for it in items]
    live = [it.array for it in items]
    try:
        if multi:
            assert comm is not None
            if buffers.max_pinned_bytes is not None and has_device_values(live):
                buffers.get(keys, live, ring_from=None)  # raises: it needs the whole state
            work, cleanup = _start_multi(comm, store, p, items, get, tree=tree, graph=graph,
                                         metadata=metadata, node_local=node_local, keep=keep,
                                         incremental=incremental, base=base)
        else:
            staging = get(keys, live, ring_from=ring_from(store, p, live, multi, incremental))
            work, cleanup = stage(store, p, keys, live, staging, graph=graph,
                                  tree=tree, metadata=metadata, base=base,
                                  incremental=incremental, ring=buffers.ring_items), None
        return PendingSave(shown, _in_turn(turn, work), then=then, release=release,
                           cleanup=cleanup)
    except BaseException:  # nothing runs in the background: the buffers are free again
        turn.end()
        if release is not None:
            release()
        raise


def _in_turn(turn: ordering.Turn, work: Callable[[], Any]) -> Callable[[], Any]:
    """``work`` run in ``turn``: once the earlier saves to its place ended (their
    commits, not their callbacks: ordering.py), ending the turn when it ends."""
    def in_order() -> Any:
        with turn.held():
            return work()

    return in_order


def _mode(items: Sequence[Item], comm: Communicator | None) -> tuple[Communicator | None, bool]:
    """The communicator of a save of ``items`` and whether it is a multi-worker save
    (several workers, or sharded values: blocks and per-worker rows are checked and
    assembled like a multi-worker save)."""
    comm = resolve_comm(comm)
    sharded = any(isinstance(it.obj, (ShardedArray, PerWorker)) for it in items)
    if comm is None and sharded:
        comm = SingleComm()
    return comm, comm is not None and (comm.world_size > 1 or sharded)


def _start_multi(comm: Communicator, store: Store, path: str, items: Sequence[Item],
                 get: Callable[[list[str], list[Any]], list[np.ndarray]], *, tree: Any,
                 graph: dict | None, metadata: dict | None, node_local: int | None,
                 keep: Background | None, incremental: bool = False,
                 base: Base | None = None) -> tuple[Callable[[], Any], Callable[[], Any] | None]:
    """Collective, in the caller's thread: stages this worker's values and plans the
    save with the others; returns the background part and what removes a failed
    attempt's files (rank 0's job; node-local: every worker's, in its own directory)."""
    keys = [it.key for it in items]
    live = [it.array for it in items]
    objs = [it.obj for it in items]

    def staged() -> list[tuple[str, Any]]:
        bufs = get(keys, live)
        stage_values(live, bufs)
        return list(zip(keys, background.planned(objs, bufs)))

    if node_local is None:
        bg = background.prepare(comm, store, path, staged, tree=tree, graph=graph,
                                metadata=metadata, incremental=incremental, base=base)
        attempt = bg.attempt  # (the cleanup keeps the id only, not the staged copies)
        if comm.rank != 0:
            return bg.run, None
        return bg.run, lambda: background.discard(store, path, attempt)
    assert keep is not None, "node-local saves keep their background communicator"
    channel = keep.background_comm(comm)
    nl = NodeLocalSave(channel, store, path, plan_save(comm, store, path, staged, metadata,
                                                       DEFAULT),
                       tree=tree, graph=graph, replicate=node_local, options=DEFAULT)
    attempt = nl.attempt

    def run() -> None:
        try:
            nl.run()
        except BaseException:
            keep.comm = None  # its collectives may be out of step: made anew by all
            raise

    return run, lambda: background.discard(store, path, attempt)


@contextlib.contextmanager
def numbered(counter: Variable) -> Iterator[int]:
    """Increments a save counter for one save and gives the number back if the
    save fails (a failed save does not use up a number)."""
    counter.assign_add(1)
    try:
        yield int(counter)
    except BaseException:
        counter.assign_sub(1)
        raise
