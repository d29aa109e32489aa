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
from typing import Any, Callable, Iterator, Sequence

import numpy as np

from . import progress as _progress
from .workers.comm import Communicator, SingleComm, resolve_comm
from .device.array import DeviceArray
from .device.buffers import lease_shared
from .device.staging import has_device_values, stage_values
from .workers.save import distributed_save
from .engine.write_executor import can_stage
from .engine.writer import StagedSave, save_tensors
from .sharded import ShardedArray
from .sharded.perworker import PerWorker
from .storage import Store, resolve
from .variables import Variable

__all__ = ["Item", "PendingSave", "write", "stage", "start", "numbered"]


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
          node_local: int | None = None) -> None:
    """Writes and commits one checkpoint at ``path`` (returns once it is durable,
    on every worker). ``node_local=k``: a multi-worker job's node-local checkpoint,
    ``path`` being this worker's own, with k replicas (workers/node_local.py)."""
    store, p = resolve(path, storage_options)
    comm = resolve_comm(comm)
    sharded = any(isinstance(it.obj, (ShardedArray, PerWorker)) for it in items)
    if comm is None and sharded:  # blocks (and per-worker rows) must be checked and
        comm = SingleComm()       # assembled like a multi-worker save
    multi = comm is not None and (comm.world_size > 1 or sharded)
    with _progress.reporting(progress, sum(it.array.nbytes for it in items)):
        if has_device_values([it.array for it in items]):
            _write_from_device(items, store, p, multi, lambda host: write(
                host, path, storage_options=storage_options, comm=comm, tree=tree,
                graph=graph, metadata=metadata, node_local=node_local), tree=tree, graph=graph,
                metadata=metadata)
        elif multi:
            assert comm is not None
            distributed_save(comm, store, p, [(it.key, _planned(it)) for it in items],
                             tree=tree, graph=graph, metadata=metadata,
                             node_local=node_local is not None, replicate=node_local or 0)
        else:
            save_tensors(store, p, [(it.key, it.array) for it in items], tree=tree, graph=graph,
                         metadata=metadata, keys_checked=True)


def _planned(it: Item) -> Any:
    """What a multi-worker save plans ``it`` as: its ShardedArray block, a PerWorker of its
    (host) array, or the array."""
    if isinstance(it.obj, ShardedArray):
        return it.obj
    return PerWorker(it.array) if isinstance(it.obj, PerWorker) else it.array


def _write_from_device(items: Sequence[Item], store: Store, path: str, multi: bool,
                       write_host: Callable[[list[Item]], None], *, tree: Any,
                       graph: dict | None, metadata: dict | None) -> None:
    """A blocking save of values of which some live in device memory. One process:
    the device copies land in reusable (pinned) staging buffers and the writers
    start on each as soon as it landed (``stage``); host values are written from
    where they are. Multi-worker: every value is staged to host memory first, then
    saved as host arrays (``write_host``)."""
    keys = [it.key for it in items]
    live = [it.array for it in items]
    buffers, done = lease_shared()
    try:
        staging = buffers.get(keys, live, copy_host=False)
        if multi:
            stage_values(live, staging)
            write_host([Item(it.key, a, a if it.obj is it.array else it.obj)
                        for it, a in zip(items, staging)])
        else:
            stage(store, path, keys, live, staging, graph=graph, tree=tree,
                  metadata=metadata)()
    finally:
        done()


def stage(store: Store, path: str, keys: list[str], live: list[Any],
          staging: list[np.ndarray], *, graph: dict | None, tree: Any = None,
          metadata: dict | None = None) -> Callable[[], Any]:
    """Copies ``live`` (host arrays and DeviceArrays) into ``staging`` (host arrays
    of the same shapes and dtypes, reused across saves; a staging array that is its
    live array is not copied) and returns, once the live values may change again,
    the work that writes and commits the checkpoint from the copies. Where the
    store can write local files, writing starts while the copies run."""
    native = all(a.dtype.byteorder in "=<|" for a in live)
    if native and can_stage(store, path):  # the C++ core writes the files
        staged = StagedSave(store, path, keys, live, staging, graph=graph, metadata=metadata,
                            tree=tree)
        staged.stage()
        return staged.finish
    stage_values(live, staging)
    return lambda: save_tensors(store, path, list(zip(keys, staging)), graph=graph, tree=tree,
                                metadata=metadata, keys_checked=True)


class PendingSave:
    """A save running in the background (``pyckpt.save(..., blocking=False)``).

    The values were copied aside before it was returned, so the caller may change
    them at once. ``wait()`` blocks until the checkpoint is committed and returns
    its path, or raises the save's error; ``done()`` says whether it finished."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._finished = threading.Event()
        self._error: BaseException | None = None

    def _run(self, work: Callable[[], Any]) -> None:
        try:
            work()
        except BaseException as e:  # re-raised by wait()
            self._error = e
        finally:
            self._finished.set()

    def done(self) -> bool:
        """Whether the save has finished (committed, or failed)."""
        return self._finished.is_set()

    def wait(self, timeout: float | None = None) -> str:
        """Waits for the commit and returns the path; raises the save's error, or
        TimeoutError when ``timeout`` seconds pass first."""
        if not self._finished.wait(timeout):
            raise TimeoutError(f"the save of {self.path} is still running after {timeout} s")
        if self._error is not None:
            raise self._error
        return self.path

    def __repr__(self) -> str:
        state = "running" if not self.done() else "failed" if self._error else "committed"
        return f"<PendingSave {self.path!r}: {state}>"


def start(items: Sequence[Item], path: Any, *, storage_options: dict | None = None,
          comm: Communicator | None = None,
          progress: Callable[[int, int], Any] | None = None, tree: Any = None,
          graph: dict | None = None, metadata: dict | None = None) -> PendingSave:
    """``write`` in the background: returns once every value is copied aside into
    staging buffers (one host copy of the state, pinned for device values, kept
    for the next save: ``pyckpt.device.release_staging_memory()`` frees it). Multi-worker and
    sharded saves run their collectives in the caller's thread, so they are saved
    blocking and the handle comes back finished. ``progress`` is refused: its
    monitor lives in the caller's context, which a background save outlives."""
    if progress is not None:
        raise ValueError("progress= cannot be combined with blocking=False (yet): poll "
                         "the returned handle's done() instead")
    shown = str(path.__fspath__()) if hasattr(path, "__fspath__") else str(path)
    handle = PendingSave(shown)
    comm = resolve_comm(comm)
    if (comm is not None and comm.world_size > 1) or any(
            isinstance(it.obj, (ShardedArray, PerWorker)) for it in items):
        handle._run(lambda: write(items, path, storage_options=storage_options, comm=comm,
                                  progress=progress, tree=tree, graph=graph, metadata=metadata))
        return handle
    store, p = resolve(path, storage_options)
    keys = [it.key for it in items]
    live = [it.array for it in items]
    buffers, done = lease_shared()  # kept for the next save (pinned for device values)
    try:
        work = stage(store, p, keys, live, buffers.get(keys, live), graph=graph, tree=tree,
                     metadata=metadata)
    except BaseException:
        done()
        raise

    def run() -> None:
        try:
            work()
        finally:
            done()

    threading.Thread(target=handle._run, args=(run,), name="pyckpt-save",
                     daemon=False).start()  # not a daemon: a pending save finishes at exit
    return handle


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
