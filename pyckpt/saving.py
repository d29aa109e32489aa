"""The one save path. ``pyckpt.save``, ``Checkpoint.write``/``save``,
``CheckpointManager.save``, Lightning's ``save_checkpoint`` and the converters all
end here (docs/ARCHITECTURE.md, "Walk of a save").

A door describes its save as a ``SavePlan`` (``SavePlan.build``: the items, the
resolved store and path, the communicator, tree/graph/metadata, node-local
replicas, the incremental base, the pinned budget); the build runs every check
once and decides the route (``Route``) and the staging once. ``write(plan)`` saves
it blocking: it takes the save's turn (ordering.py), reports progress and runs the
route: one process (engine/writer.py, engine/incremental.py) or several workers
(workers/save.py). ``start(plan)`` is the background variant: it copies the values
aside (``stage``) and returns a ``PendingSave`` whose thread writes and commits.
``run(plan, blocking=...)`` is a numbered save's choice between the two (a
manager's). ``numbered`` bumps a save counter and gives the number back if the save
fails.

Copies of a committed checkpoint are written here too (a tier's persist): a
``CopyPlan`` names the source and the destination; ``copy(plan)`` copies and commits
it whole (engine/copy.py), ``upload(plan, rank, window)`` copies one worker's data
files and ``commit_upload(plan)`` commits them once every worker's are there (a
multi-worker persist). ``from_peers`` picks the node-local checkpoint the nodes can
restore together from their copies, and its ``fetch`` sends each node the files it
lacks and commits the index where it was missing (workers/node_local.py).
"""

from __future__ import annotations

import contextlib
import dataclasses
import enum
import os
import threading
import time
import warnings
from typing import Any, Callable, Iterator, Sequence

import numpy as np

from . import jobs, ordering
from . import progress as _progress
from .workers.comm import Communicator, SingleComm, resolve_comm
from .device.array import DeviceArray
from .device.buffers import StagingBuffers, lease_shared, warm_shared
from .device.budgets import check_budget, check_device_budget
from .device.engine import Ticket, TicketGroup
from .device.snapshot import DeviceSnapshot, device_need, shared_snapshot
from .device.staging import has_device_values, stage_values
from .engine.options import DEFAULT
from .workers import background, node_local
from .workers.save import NodeLocalSave, distributed_save, plan_save
from .engine.copy import commit_copied, copy_checkpoint, copy_files
from .engine.incremental import Base, base_at, save_incremental
from .engine.writer import StagedSave, save_tensors, stages_natively
from .sharded import ShardedArray
from .sharded.perworker import PerWorker
from .storage import Store, resolve
from .variables import Variable

__all__ = ["Item", "Route", "SavePlan", "PendingSave", "Background", "StagingReport", "Base",
           "base_at",
           "write", "stage", "start", "run", "numbered", "CopyPlan", "copy", "upload",
           "commit_upload", "FromPeers", "from_peers"]


class Item:
    """One value to save: its key, the array written by a single process (a host
    array, or a DeviceArray staged through host buffers), and the object a
    multi-worker save plans with (a ShardedArray block, a PerWorker declaration,
    or the array itself)."""

    __slots__ = ("key", "array", "obj")

    def __init__(self, key: str, array: np.ndarray | DeviceArray, obj: Any = None) -> None:
        self.key, self.array = key, array
        self.obj = array if obj is None else obj


class Route(enum.Enum):
    """Who writes a plan, decided once by ``SavePlan.build``."""

    #: one process, a full save (engine/writer.py)
    FILES = "files"
    #: one process, referencing the base's unchanged data (engine/incremental.py)
    INCREMENTAL = "incremental"
    #: several workers (or sharded values) into one checkpoint (workers/save.py; in
    #: the background workers/background.py), incremental or not
    WORKERS = "workers"
    #: several workers, each its own node-local checkpoint with replicas
    #: (workers/node_local.py)
    NODE_LOCAL = "node-local"


@dataclasses.dataclass(frozen=True)
class SavePlan:
    """Everything one save needs, checked (``build``; build it there, not by hand).

    ``store``/``path``: where it goes (``shown``: the path as the caller spelled it,
    for handles); ``comm``: the resolved communicator (None: one process);
    ``route``: who writes it; ``node_local``: the replicas of a node-local save;
    ``incremental``/``base``: an incremental save and the checkpoint it references
    (None: a full one that records fingerprints); ``max_pinned_bytes``: the pinned
    budget device values are staged within; ``max_device_snapshot_bytes``: the
    device memory a background save may snapshot the device values into (None:
    automatic, from the free device memory; 0: never; device/snapshot.py);
    ``on_device``: whether values live in
    device memory (staged through host buffers first); ``overlap``: whether the
    staging copies overlap the writes (a ``StagedSave``: one process, a full save,
    local files, native byte order); ``progress``: the blocking save's callback."""

    items: tuple[Item, ...] = dataclasses.field(repr=False)
    store: Store = dataclasses.field(repr=False)
    path: str
    shown: str
    comm: Communicator | None = dataclasses.field(repr=False)
    route: Route
    tree: Any = dataclasses.field(default=None, repr=False)
    graph: dict | None = dataclasses.field(default=None, repr=False)
    metadata: dict | None = dataclasses.field(default=None, repr=False)
    node_local: int | None = None
    incremental: bool = False
    base: Base | None = dataclasses.field(default=None, repr=False)
    max_pinned_bytes: int | None = None
    max_device_snapshot_bytes: int | None = None
    on_device: bool = False
    overlap: bool = False
    progress: Callable[[int, int], Any] | None = dataclasses.field(default=None, repr=False)

    @classmethod
    def build(cls, items: Sequence[Item], path: Any, *, storage_options: dict | None = None,
              comm: Communicator | None = None,
              progress: Callable[[int, int], Any] | None = None, tree: Any = None,
              graph: dict | None = None, metadata: dict | None = None,
              node_local: int | None = None, incremental: bool = False, base: Any = None,
              full_save_every: int | None = 10,
              max_pinned_bytes: int | None = None,
              max_device_snapshot_bytes: int | None = None) -> "SavePlan":
        """The plan of a save of ``items`` at ``path`` (resolved with
        ``storage_options``). ``node_local=k``: a multi-worker job's node-local
        checkpoint, ``path`` being this worker's own, with k replicas.
        ``incremental``: an incremental save referencing the unchanged data of the
        checkpoint at ``base`` (a committed sibling directory of ``path``, given as a
        path or URL: its manifest is read here; None, or no committed pyckpt
        checkpoint there: a full save that records fingerprints), one save in every
        ``full_save_every`` being full (engine/incremental.py). ``max_pinned_bytes``:
        device values are staged through a ring within that much pinned memory
        (single-process full saves to local files; a multi-worker or object-store
        save with device values refuses it when it stages); incremental and
        node-local saves stage the whole state, without it.
        ``max_device_snapshot_bytes``: see the class doc (``start`` uses it).

        Raises NotImplementedError for an incremental node-local save; ValueError for
        a bad budget, or a ``base`` without ``incremental``, at ``path`` itself or
        outside ``path``'s directory."""
        shown = str(os.fspath(path)) if hasattr(path, "__fspath__") else str(path)
        store, p = resolve(path, storage_options)
        if incremental and node_local is not None:
            raise NotImplementedError(
                "incremental saves of node-local tiers are not supported yet: save them with "
                "incremental=False (docs/API.md section 18)")
        check_budget(max_pinned_bytes)
        check_device_budget(max_device_snapshot_bytes)
        comm = resolve_comm(comm)
        sharded = any(isinstance(it.obj, (ShardedArray, PerWorker)) for it in items)
        if comm is None and sharded:  # blocks and rows are checked and assembled like
            comm = SingleComm()       # a multi-worker save's
        multi = comm is not None and (comm.world_size > 1 or sharded)
        route = (Route.FILES if not multi and not incremental else
                 Route.INCREMENTAL if not multi else
                 Route.WORKERS if node_local is None else Route.NODE_LOCAL)
        live = [it.array for it in items]
        if incremental or node_local is not None:
            max_pinned_bytes = None  # their writers need the whole state staged
        return cls(tuple(items), store, p, shown, comm, route, tree=tree, graph=graph,
                   metadata=metadata, node_local=node_local, incremental=incremental,
                   base=_base(store, p, base, incremental, storage_options, full_save_every),
                   max_pinned_bytes=max_pinned_bytes,
                   max_device_snapshot_bytes=max_device_snapshot_bytes,
                   on_device=has_device_values(live),
                   overlap=route is Route.FILES and stages_natively(store, p, live),
                   progress=progress)

    @property
    def multi(self) -> bool:
        """Whether several workers (or sharded values) are saved as one checkpoint."""
        return self.route in (Route.WORKERS, Route.NODE_LOCAL)

    @property
    def nbytes(self) -> int:
        """This worker's bytes."""
        return sum(it.array.nbytes for it in self.items)

    @property
    def keys(self) -> list[str]:
        return [it.key for it in self.items]

    @property
    def live(self) -> list[Any]:
        """The values as the caller holds them (host arrays and DeviceArrays)."""
        return [it.array for it in self.items]

    @property
    def ring_from(self) -> int | None:
        """The size from which device values may be staged through a ring of pinned
        memory (the checksum chunk, where the copies overlap the writes; None: the
        save needs the whole state staged)."""
        return DEFAULT.chunk_size if self.overlap else None

    @property
    def can_background(self) -> bool:
        """Whether ``start`` can run it in the background: not a node-local save whose
        communicator cannot make a background one (its collectives run there)."""
        return self.route is not Route.NODE_LOCAL or bool(
            self.comm is not None and self.comm.background_capable)

    def with_values(self, values: Sequence[Any]) -> "SavePlan":
        """This plan with its one-process values replaced by ``values`` (a snapshot of
        them: DeviceArrays and host arrays of the same shapes and dtypes)."""
        items = tuple(Item(it.key, v, v if it.obj is it.array else it.obj)
                      for it, v in zip(self.items, values))
        return dataclasses.replace(self, items=items)

    def on_host(self, staged: Sequence[np.ndarray]) -> "SavePlan":
        """This plan with its values replaced by their host copies ``staged``."""
        items = tuple(Item(it.key, a, a if it.obj is it.array else it.obj)
                      for it, a in zip(self.items, staged))
        return dataclasses.replace(self, items=items, on_device=False, max_pinned_bytes=None)


def _base(store: Store, path: str, base: Any, incremental: bool,
          storage_options: dict | None, full_every: int | None) -> Base | None:
    """The base an incremental save of ``path`` compares with (``SavePlan.build``)."""
    if base is None:
        return None
    if not incremental:
        raise ValueError(f"base={base!r} is for incremental saves: pass incremental=True")
    _, bp = resolve(base, storage_options)
    if bp.rstrip("/") == path.rstrip("/"):
        raise ValueError(f"an incremental save of {path} cannot reference the checkpoint it "
                         "replaces: give the base as another checkpoint")
    if bp.rstrip("/").rpartition("/")[0] != path.rstrip("/").rpartition("/")[0]:
        raise ValueError(f"the base of an incremental save of {path} must be a checkpoint in "
                         f"the same directory, not {bp}")
    return base_at(store, bp, full_every)


def write(plan: SavePlan) -> None:
    """Writes and commits ``plan``'s checkpoint (returns once it is durable, on every
    worker), in the order of the calls to its place (ordering.py)."""
    turn = ordering.take(_place(plan), blocking=True)  # in call order
    try:  # the turn is held inside the progress monitor's life: one of its callbacks may
        # save to the same place (it waits for this turn; the monitor is joined after it)
        with _progress.reporting(plan.progress, plan.nbytes):
            with turn.held():
                _write(plan)
    finally:
        turn.end()


def _place(plan: SavePlan) -> str:
    """What orders this worker's saves (ordering.py): the directory and the worker's rank."""
    return ordering.place(plan.store, plan.path, plan.comm.rank if plan.comm is not None else 0)


def _write(plan: SavePlan) -> None:
    """``write``'s work, in its turn, along the plan's route."""
    if plan.on_device:
        _write_from_device(plan)
    elif plan.route is Route.FILES:
        save_tensors(plan.store, plan.path, _pairs(plan), tree=plan.tree, graph=plan.graph,
                     metadata=plan.metadata, keys_checked=True)
    elif plan.route is Route.INCREMENTAL:
        save_incremental(plan.store, plan.path, _pairs(plan), plan.base, tree=plan.tree,
                         graph=plan.graph, metadata=plan.metadata, keys_checked=True)
    else:
        assert plan.comm is not None
        distributed_save(plan.comm, plan.store, plan.path,
                         [(it.key, _planned(it)) for it in plan.items], tree=plan.tree,
                         graph=plan.graph, metadata=plan.metadata,
                         node_local=plan.route is Route.NODE_LOCAL,
                         replicate=plan.node_local or 0, incremental=plan.incremental,
                         base=plan.base)


def _pairs(plan: SavePlan, values: Sequence[Any] | None = None) -> list[tuple[str, Any]]:
    """(key, value) of every item (``values``: its staged copies instead)."""
    return list(zip(plan.keys, plan.live if values is None else values))


def _planned(it: Item) -> Any:
    """What a multi-worker save plans ``it`` as: its ShardedArray block, a PerWorker of its
    (host) array, or the array."""
    if isinstance(it.obj, ShardedArray):
        return it.obj
    return PerWorker(it.array) if isinstance(it.obj, PerWorker) else it.array


def _write_from_device(plan: SavePlan) -> None:
    """A blocking save of values of which some live in device memory. One process:
    the device copies land in reusable (pinned) staging buffers and the writers
    start on each as soon as it landed (``stage``); host values are written from
    where they are. Multi-worker: every value is staged to host memory first, then
    saved as host arrays."""
    buffers, done = lease_shared(plan.max_pinned_bytes)
    try:
        staging = buffers.get(plan.keys, plan.live, copy_host=False, ring_from=plan.ring_from)
        if plan.multi:
            stage_values(plan.live, staging)
            _write(plan.on_host(staging))
        else:
            stage(plan, staging, ring=buffers.ring_items)()
    finally:
        done()


def stage(plan: SavePlan, staging: list[np.ndarray], *,
          ring: dict[int, np.ndarray] | None = None) -> Callable[[], Any]:
    """Copies a one-process plan's values (host arrays and DeviceArrays) into
    ``staging`` (host arrays of the same shapes and dtypes, reused across saves; a
    staging array that is its live array is not copied) and returns, once the live
    values may change again, the work that writes and commits the checkpoint from
    the copies. Where the plan overlaps the copies with the writes (``overlap``),
    writing starts while the copies run (not for an incremental save: it compares
    the copies before it writes). ``ring``: the values staged through a ring of
    pinned memory (``StagingBuffers.ring_items``; only where ``ring_from`` allowed
    one)."""
    store, path, live = plan.store, plan.path, plan.live
    if plan.route is Route.INCREMENTAL:
        stage_values(live, staging)
        return lambda: save_incremental(store, path, _pairs(plan, staging), plan.base,
                                        graph=plan.graph, tree=plan.tree,
                                        metadata=plan.metadata, keys_checked=True)
    if plan.overlap:  # the C++ core writes the files
        staged = StagedSave(store, path, plan.keys, live, staging, graph=plan.graph,
                            metadata=plan.metadata, tree=plan.tree, ring=ring)
        staged.stage()
        return staged.finish
    stage_values(live, staging)
    return lambda: save_tensors(store, path, _pairs(plan, staging), graph=plan.graph,
                                tree=plan.tree, metadata=plan.metadata, keys_checked=True)


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
        self._job: jobs.Job | None = None
        #: how ``start`` copied the values aside (None: not started by ``start``)
        self.staging: StagingReport | None = None
        if work is not None:  # a job (jobs.py): a pending save finishes at interpreter exit
            self._job = jobs.submit(lambda: self._run(work, then, release), "pyckpt-save")

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
        if self._job is None or not self._job.running_here():
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
    ahead, ``release`` frees them), the device snapshot buffers (``snapshot``:
    device/snapshot.py, within ``max_device_snapshot_bytes``) and, for node-local
    saves, the communicator their background part runs its collectives on."""

    def __init__(self, max_pinned_bytes: int | None = None,
                 max_device_snapshot_bytes: int | None = None) -> None:
        self.buffers = StagingBuffers(max_pinned_bytes)
        self.snapshot = DeviceSnapshot(max_device_snapshot_bytes)
        self._warming: jobs.Job | None = None
        self.comm: Communicator | None = None

    def ready(self) -> None:
        """Waits for ``warm``'s allocation, if one runs."""
        if self._warming is not None:
            self._warming.join()
            self._warming = None

    def warming(self) -> jobs.Job | None:
        """``warm``'s allocation while it runs (None once it ended, or none started)."""
        job = self._warming
        return job if job is not None and not job.done() else None

    def get(self, keys: list[str], srcs: list[Any], *,
            ring_from: int | None = None) -> list[np.ndarray]:
        self.ready()
        return self.buffers.get(keys, srcs, ring_from=ring_from)

    def warm(self, keys: list[str], srcs: list[Any]) -> None:
        """With values in device memory among ``srcs``, allocates (and pins) their
        staging buffers in a background thread (not with a pinned budget: its ring is
        small, and sized by the first save); host values alone: nothing to do."""
        if self.buffers.max_pinned_bytes is not None or not has_device_values(srcs):
            return
        self.ready()
        self._warming = jobs.submit(lambda: self.buffers.get(keys, srcs, copy_host=False),
                                    "pyckpt-warm-staging", daemon=True)

    def release(self) -> None:
        self.ready()
        self.buffers.release()
        self.snapshot.release()

    def background_comm(self, comm: Communicator) -> Communicator:
        """Collective: the background communicator of node-local saves, made at the first
        such save and made anew by all after one failed anywhere (its collectives may
        be out of step)."""
        if any(comm.all_gather(self.comm is None)):
            self.comm = comm.background()
        assert self.comm is not None
        return self.comm


@dataclasses.dataclass
class StagingReport:
    """How a background save copied its values aside (``PendingSave.staging``; a
    manager's ``last_staging``).

    - ``route``: ``"device"`` (a snapshot in device memory, drained to storage in
      the background), ``"pinned"`` (one copy into the pinned pool in the call),
      ``"ring"`` (through the ring of ``max_pinned_bytes`` in the call),
      ``"plain"`` (into plain host memory in the call: the pinned pool was being
      prepared in the background), ``"host"`` (no device values: host copies),
      ``"blocking"`` (saved in the call: ``SavePlan.can_background`` is False).
    - ``device_bytes``: device memory the owner's snapshot buffers hold.
    - ``pinned_bytes``: pinned host memory of the staging buffers the save used
      (the device route: set once its drain took them).
    - ``plain_bytes``: plain host memory the save staged its device values into.
    - ``blocked_seconds``: how long the call took (a manager's: its whole ``save``).
    """

    route: str = "host"
    device_bytes: int = 0
    pinned_bytes: int = 0
    plain_bytes: int = 0
    blocked_seconds: float = 0.0


def start(plan: SavePlan, *, keep: Background | None = None,
          then: Callable[[BaseException | None], Any] | None = None) -> PendingSave:
    """``write`` in the background, in every mode: returns once the caller may change
    the values (``PendingSave.staging`` says how they were copied aside). With
    several workers (or sharded values) every worker calls it at the same point: the
    collectives that plan the save run here, and the background part talks through
    the store only (docs/PROTOCOL.md section 6b); a node-local save's background part
    runs its collectives on ``keep``'s background communicator (section 7b), and is
    saved blocking where the communicator cannot make one
    (``SavePlan.can_background``). ``then(error)`` runs in the background thread
    once the save ended (its error becomes the save's). A plan with ``progress`` is
    refused: its monitor lives in the caller's context, which a background save
    outlives.

    The values are copied into staging buffers: ``keep``'s, else the process-wide
    ones kept for the next save (``pyckpt.device.release_staging_memory()`` frees
    them). A one-process save of values in device memory takes the first of:

    1. a snapshot in device memory (device/snapshot.py) when it fits
       ``max_device_snapshot_bytes`` (the plan's, or ``keep``'s): the call issues
       device-to-device copies on the caller's stream and returns; the background
       thread waits for them, drains the snapshot through the pinned buffers (or
       ring) and writes. One snapshot per owner at a time: the call waits until the
       previous save's snapshot left the device;
    2. the pinned pool, when it is ready (allocated, of the state's size; or a ring
       within ``max_pinned_bytes``): one copy into it in the call;
    3. plain host memory, while the pinned pool is prepared in the background
       (``Background.warm``; the process-wide pool likewise), never in the call.

    A multi-worker save of device values (no pinned budget) takes 2 or 3: each
    worker stages its whole part in the call, before the collectives that plan it."""
    t0 = time.perf_counter()
    if plan.progress is not None:
        raise ValueError("progress= cannot be combined with blocking=False (yet): poll "
                         "the returned handle's done() instead")
    if not plan.can_background:
        handle = PendingSave(plan.shown)
        handle.staging = StagingReport("blocking")
        handle._run(lambda: write(plan), then)
        handle.staging.blocked_seconds = time.perf_counter() - t0
        return handle
    turn = ordering.take(_place(plan), blocking=False)  # in call order
    if not plan.multi and plan.on_device:
        try:
            handle = _start_device(plan, turn, keep, then)
        except BaseException:
            turn.end()
            raise
        assert handle.staging is not None  # (_start_device reports its route)
        handle.staging.blocked_seconds = time.perf_counter() - t0
        return handle
    warm: jobs.Job | None = None
    release: Callable[[], None] | None = None
    get: Callable[..., list[np.ndarray]]
    budget = keep.buffers.max_pinned_bytes if keep is not None else plan.max_pinned_bytes
    if plan.multi and plan.on_device and budget is None:  # the whole state, staged
        buffers, release, warm = _pool_or_plain(plan, keep)
        get = buffers.get
    elif keep is not None:  # its own budget (the manager's max_pinned_bytes)
        buffers, get = keep.buffers, keep.get
    else:
        buffers, release = lease_shared(plan.max_pinned_bytes)
        get = buffers.get
    try:
        if plan.multi:
            if budget is not None and plan.on_device:
                # raises: a multi-worker save needs the whole state staged
                buffers.get(plan.keys, plan.live, ring_from=None)
            work, cleanup = _start_multi(plan, get, keep)
        else:
            staging = get(plan.keys, plan.live, ring_from=plan.ring_from)
            work, cleanup = stage(plan, staging, ring=buffers.ring_items), None
        handle = PendingSave(plan.shown, _joining(_in_turn(turn, work), warm), then=then,
                             release=release, cleanup=cleanup)
    except BaseException:  # nothing runs in the background: the buffers are free again
        turn.end()
        if release is not None:
            release()
        raise
    handle.staging = _report(plan, buffers, warm)
    handle.staging.blocked_seconds = time.perf_counter() - t0
    return handle


def _pool_or_plain(plan: SavePlan, keep: Background | None
                   ) -> tuple[StagingBuffers, Callable[[], None] | None, jobs.Job | None]:
    """(staging buffers, what gives them back or None, the job preparing the pinned
    pool or None) for a background save of device values staged in the call: the
    owner's pinned pool (a manager's; else the process-wide one) when it is ready;
    otherwise plain host memory, while the pool is prepared in the background
    (``Background.warm``; ``warm_shared``): the call never waits for the pinning."""
    live = plan.live
    warm: jobs.Job | None = None
    release: Callable[[], None] | None = None
    if keep is not None:
        buffers = keep.buffers
        warm = keep.warming()
        if warm is None and not buffers.ready_for(live):
            keep.warm(plan.keys, live)
            warm = keep.warming()
    else:
        buffers, release = lease_shared(plan.max_pinned_bytes)
        if not buffers.ready_for(live):
            release()
            keys = plan.keys
            warm = jobs.submit(lambda: warm_shared(keys, live), "pyckpt-warm-staging",
                               daemon=True)
    if warm is not None:  # stage into plain memory, while the pool is pinned
        buffers = StagingBuffers(plan.max_pinned_bytes, pinned=False)
        release = buffers.release
    return buffers, release, warm


def _joining(work: Callable[[], Any], warm: jobs.Job | None) -> Callable[[], Any]:
    """``work``, then (also after an error) the wait for the pinned pool's preparation
    ``warm``: a save staged in plain memory ends once the pool it started is ready."""
    if warm is None:
        return work

    def then_warm() -> Any:
        try:
            return work()
        finally:
            warm.join()

    return then_warm


def _report(plan: SavePlan, buffers: StagingBuffers, warm: jobs.Job | None,
            device_bytes: int = 0) -> StagingReport:
    """The StagingReport of a save staged in the call into ``buffers``."""
    if not plan.on_device:
        return StagingReport("host")
    if warm is not None:
        return StagingReport("plain", device_bytes=device_bytes,
                             plain_bytes=buffers.pinned_bytes)
    return StagingReport("ring" if buffers.ring_items else "pinned", device_bytes=device_bytes,
                         pinned_bytes=buffers.pinned_bytes)


def _start_device(plan: SavePlan, turn: ordering.Turn, keep: Background | None,
                  then: Callable[[BaseException | None], Any] | None) -> PendingSave:
    """``start`` of a one-process plan with values in device memory: its three routes
    (``start``'s doc), in its turn."""
    live = plan.live
    snap = keep.snapshot if keep is not None else \
        shared_snapshot(plan.max_device_snapshot_bytes)
    # (no wait for the previous save where it cannot fit; a pinned budget the save
    # cannot stage within is refused in the call, by the pinned route)
    need = device_need(live)
    use = (plan.max_pinned_bytes is None or plan.ring_from is not None) and snap.fits(need)
    if use:
        snap.hold()  # the previous save's snapshot has left the device
        try:
            use = snap.fits(need) and snap.prepare(live, need)
            if use:
                values, tickets = snap.take(live)
            else:
                snap.unhold()
        except BaseException:
            snap.unhold()
            raise
    if use:
        report = StagingReport("device", device_bytes=snap.device_bytes)
        try:
            handle = PendingSave(plan.shown, _drain(plan, values, tickets, snap, turn, keep,
                                                    report), then=then)
        except BaseException:
            snap.unhold()
            raise
        handle.staging = report
        return handle
    buffers, release, warm = _pool_or_plain(plan, keep)
    try:
        staging = buffers.get(plan.keys, live, ring_from=plan.ring_from)
        work = stage(plan, staging, ring=buffers.ring_items)
    except BaseException:
        if release is not None:
            release()
        raise
    handle = PendingSave(plan.shown, _joining(_in_turn(turn, work), warm), then=then,
                         release=release)
    handle.staging = _report(plan, buffers, warm, device_bytes=snap.device_bytes)
    return handle


def _drain(plan: SavePlan, values: list[Any], tickets: list[Ticket], snap: DeviceSnapshot,
           turn: ordering.Turn, keep: Background | None,
           report: StagingReport) -> Callable[[], Any]:
    """The background part of a save snapshotted in device memory (``values``, landing
    as ``tickets`` complete): waits for the snapshot, stages it through the owner's
    pinned buffers (or ring; ``engine.detached()``: after nothing the caller queued
    since), gives the snapshot buffers back once it left the device, then writes and
    commits in the plan's turn."""
    def work() -> Any:
        done: Callable[[], None] | None = None
        try:
            try:
                TicketGroup(tickets).wait()  # all of them, also after an error
                if keep is not None:
                    keep.ready()
                    buffers = keep.buffers
                else:
                    buffers, done = lease_shared(plan.max_pinned_bytes)
                with contextlib.ExitStack() as scope:
                    for eng in {v.engine for v in values if isinstance(v, DeviceArray)}:
                        scope.enter_context(eng.detached())
                    staging = buffers.get(plan.keys, values, copy_host=False,
                                          ring_from=plan.ring_from)
                    report.pinned_bytes = buffers.pinned_bytes
                    finish = stage(plan.with_values(values), staging, ring=buffers.ring_items)
            finally:
                snap.unhold()
            with turn.held():
                return finish()
        finally:
            turn.end()
            values.clear()  # hold no view of the device buffers once done (release frees)
            if done is not None:
                done()

    return work


def run(plan: SavePlan, *, blocking: bool = True, max_async_bytes: int | None = None,
        keep: Background | None = None,
        then: Callable[[BaseException | None], Any] | None = None) -> PendingSave | None:
    """A numbered save's choice (a manager's): ``start(plan, keep=, then=)`` and its
    handle, or ``write(plan)`` and None (``then`` not called). In the background only
    when ``blocking`` is False, this worker's bytes fit ``max_async_bytes`` (None: no
    limit) and the plan can run in the background (``SavePlan.can_background``).
    With several workers and ``blocking`` False this is collective: the workers
    check that they save the same checkpoint (its directory's name; ValueError on
    all otherwise) and save in the background only if every one of them can."""
    fits = not blocking and plan.can_background and (
        max_async_bytes is None or plan.nbytes <= max_async_bytes)
    comm = plan.comm
    if comm is not None and comm.world_size > 1 and not blocking:
        fits = background.agree(comm, plan.path.rstrip("/").rpartition("/")[2], fits)
    if fits:
        return start(plan, keep=keep, then=then)
    write(plan)
    return None


def _in_turn(turn: ordering.Turn, work: Callable[[], Any]) -> Callable[[], Any]:
    """``work`` run in ``turn``: once the earlier saves to its place ended (their
    commits, not their callbacks: ordering.py), ending the turn when it ends."""
    def in_order() -> Any:
        with turn.held():
            return work()

    return in_order


def _start_multi(plan: SavePlan, get: Callable[[list[str], list[Any]], list[np.ndarray]],
                 keep: Background | None
                 ) -> tuple[Callable[[], Any], Callable[[], Any] | None]:
    """Collective, in the caller's thread: stages this worker's values and plans the
    save with the others; returns the background part and what removes a failed
    attempt's files (rank 0's job; node-local: every worker's, in its own directory)."""
    comm, store, path = plan.comm, plan.store, plan.path
    assert comm is not None
    keys, live, objs = plan.keys, plan.live, [it.obj for it in plan.items]

    def staged() -> list[tuple[str, Any]]:
        bufs = get(keys, live)
        stage_values(live, bufs)
        return list(zip(keys, background.planned(objs, bufs)))

    if plan.route is Route.WORKERS:
        bg = background.prepare(comm, store, path, staged, tree=plan.tree, graph=plan.graph,
                                metadata=plan.metadata, incremental=plan.incremental,
                                base=plan.base)
        attempt = bg.attempt  # (the cleanup keeps the id only, not the staged copies)
        if comm.rank != 0:
            return bg.run, None
        return bg.run, lambda: background.discard(store, path, attempt)
    assert keep is not None, "node-local saves keep their background communicator"
    channel = keep.background_comm(comm)
    nl = NodeLocalSave(channel, store, path, plan_save(comm, store, path, staged,
                                                       plan.metadata, DEFAULT),
                       tree=plan.tree, graph=plan.graph, replicate=plan.node_local or 0,
                       options=DEFAULT)
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


# -- copies of a committed checkpoint: a tier's persist ------------------------------------
@dataclasses.dataclass(frozen=True)
class CopyPlan:
    """A committed checkpoint to copy to another place (a tier's persist, ``pyckpt cp``).

    - ``source``, ``source_path``, ``source_options``: the committed checkpoint (its
      store, its path there and the options it is read with);
    - ``store``, ``path``, ``options``: the destination checkpoint directory;
    - ``progress``: called between the copy's windows (``copy``: with the bytes done
      and the total; ``upload``: with the bytes of the window), where a persist yields
      to the saves running meanwhile;
    - ``base``: a checkpoint beside the destination (``base_at``) whose data the copy
      references instead of copying it (an incremental run's persist); None: the copy
      holds all its data.

    A copy takes no turn (ordering.py): a persist writes a checkpoint directory of the
    durable tier, which only its keeper writes to, under its writer lease; ``pyckpt
    cp`` writes where the user points it, as a save of another process would."""

    source: Store
    source_path: str
    source_options: dict | None
    store: Store
    path: str
    options: dict | None
    progress: Callable[..., Any] | None = None
    base: Base | None = None


def copy(plan: CopyPlan) -> str:
    """Copies the plan's source to its destination, every chunk verified, under a new
    attempt id, and commits the copy last (engine/copy.py: ``copy_checkpoint``);
    returns the copy's URL."""
    return copy_checkpoint(plan.source.url(plan.source_path), plan.store.url(plan.path),
                           src_options=plan.source_options, dst_options=plan.options,
                           progress=plan.progress, base=plan.base)


def upload(plan: CopyPlan, rank: int, window: int) -> None:
    """Copies the data files of the plan's source that worker ``rank`` wrote (by their
    names) into the destination under the same names, every chunk verified,
    ``window`` bytes at a time (``plan.progress`` called after each); commits nothing:
    ``commit_upload`` does, once every worker's upload is done."""
    copy_files(plan.source.url(plan.source_path), plan.source_options, plan.store, plan.path,
               lambda file: node_local.writer_rank(file) == rank, plan.progress, window=window)


def commit_upload(plan: CopyPlan) -> None:
    """Commits at the destination the index of the plan's source, whose data files the
    workers uploaded there (``upload``); CheckpointError when the source's index is
    gone or references other checkpoints' files."""
    commit_copied(plan.source, plan.source_path, plan.store, plan.path)


@dataclasses.dataclass(frozen=True)
class FromPeers:
    """The checkpoint of a node-local run directory that the nodes can restore together
    from their copies (``name``; None: none can), and what every node holds of the
    directory's checkpoints (``inventories``, by rank)."""

    comm: Communicator
    store: Store
    directory: str
    name: str | None
    inventories: list[dict[str, Any]]

    def fetch(self) -> int:
        """Collective: sends every node the files of ``name`` it lacks, from the nodes
        holding them, and commits its index on the nodes that had none; returns the
        bytes this worker received."""
        assert self.name is not None, "no checkpoint to fetch"
        return node_local.fetch_missing(self.comm, self.store,
                                        self.store.join(self.directory, self.name), self.name,
                                        self.inventories)


def from_peers(comm: Communicator, store: Store, directory: str, names: Sequence[str],
               step_of: Callable[[str], int]) -> FromPeers:
    """Collective: the workers tell each other which of their committed checkpoints
    ``names`` (of ``directory``) they hold; the newest (by ``step_of``) whose index
    every holder has from the same attempt of this job's size, and each of whose data
    files some node holds whole, is the one to restore (``FromPeers.name``)."""
    invs = comm.all_gather(node_local.inventory(store, directory, names))
    order = sorted({n for inv in invs for n in inv}, key=lambda n: -step_of(n))
    return FromPeers(comm, store, directory,
                     node_local.restore_plan(invs, order, comm.world_size), invs)
