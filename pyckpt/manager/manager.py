"""``pyckpt.CheckpointManager`` (docs/API.md section 3): numbered checkpoints of a
training run in one directory, retention, crash recovery, async saves.

Save sequence: the 7 steps of docs/PROTOCOL.md section 3, in short:
 1. wait for the previous async save (raising its error, if any; with several
    workers they also agree on its outcome, so that all raise or none);
 2. skip the save (return None) while ``checkpoint_interval`` says so;
 3. take or renew the writer lease (a newer manager of this process takes it
    over from an older one, after that one's save in flight; a lease taken anew
    re-reads the state file); on the first save, clean up leftovers of
    crashed runs (uncommitted ``<name>-<N>`` directories, half-done deletions);
 4. bump ``save_counter``: the checkpoint is ``<name>-<N>`` (a number at or below
    an existing checkpoint warns);
 5. write and commit ``<directory>/<name>-<N>`` (in the background when
    ``blocking=False``, from a staging copy made before returning; with several
    workers the collectives run here and the background part talks through the
    store only: docs/PROTOCOL.md section 6b, ``workers/background.py``);
 6. check the lease again and record it in the state file (atomic replace);
 7. apply retention: a checkpoint to delete is first marked ``deleting`` in the
    state file, then its index is removed (it stops being a checkpoint), then
    its files.
The newest committed checkpoint is never deleted.

With ``local_dir`` the manager is tiered (docs/API.md section 13): it holds one
manager per tier and ``tiers.py`` persists local checkpoints to ``directory``.
"""

from __future__ import annotations

import atexit
import errno
import json
import time
import warnings
import weakref
from typing import Any, Callable

from .. import saving
from ..workers import background
from ..workers.comm import Communicator, comm_scope, resolve_comm
from ..workers.save import DistributedSaveError, NodeLocalSave, plan_save
from ..engine.options import DEFAULT
from ..errors import CheckpointError, CheckpointIOError, add_note
from ..format import INDEX_NAME
from ..graph.checkpoint import write_graph
from ..graph.object_graph import LiveGraph, traverse
from ..storage import resolve
from ..device.staging import has_device_values, stage_values
from .async_save import AsyncSaver
from .lock import WriterLease
from .node_tiers import NodeTiers
from .tiers import Tiers
from .retention import check_mode, preserve, select_removals
from ..engine.copy import copy_checkpoint
from ..engine.run import (Entry, ManagerState, check_checkpoint_name, check_step_name,
                          committed_steps, parse_step, read_state, recover_state,
                          delete_checkpoint as run_delete_checkpoint,
                          write_state)

_LIVE: "weakref.WeakSet[CheckpointManager]" = weakref.WeakSet()


@atexit.register
def _finish_pending_saves() -> None:  # an async save in flight at exit still commits
    for m in list(_LIVE):
        try:
            m._async.wait()
        except BaseException:
            pass
        try:
            m._lease.release()
        except BaseException:  # storage clients may already be shut down at exit
            pass


class CheckpointManager:
    """Keeps the numbered checkpoints ``<directory>/<checkpoint_name>-<N>`` of one
    training run of a ``pyckpt.Checkpoint`` (docs/API.md sections 3 and 13), like
    ``tf.train.CheckpointManager``: retention, crash recovery, one writer per
    directory, background saves, and optionally a fast local tier.

    Arguments:

    - ``checkpoint``: the ``pyckpt.Checkpoint`` to save (TypeError otherwise).
    - ``directory``: the run directory, a local path or an fsspec URL.
    - ``max_to_keep``: checkpoints kept by retention (None keeps all; >= 1).
    - ``keep_checkpoint_every_n_hours``: a checkpoint leaving the kept set is kept
      forever when at least that long passed since the last one kept so.
    - ``checkpoint_name``: the name prefix (``ckpt``); a plain name, not a path.
    - ``step_counter``, ``checkpoint_interval``: with both, ``save()`` skips
      (returns None) until the counter advanced by the interval since the last save.
    - ``init_fn``: called by ``restore_or_initialize`` when there is nothing to restore.
    - ``best_fn``, ``best_mode``: ``best_fn(metrics) -> float`` keeps the best
      ``max_to_keep`` by that score (``"max"`` or ``"min"``) instead of the newest.
    - ``storage_options``: fsspec options (endpoint_url, key, secret, token...), and
      ``{"pyckpt": {...}}`` for pyckpt's own limits (deadline, stall_timeout...).
    - ``max_async_bytes``: a ``save(blocking=False)`` of more bytes than this is made
      blocking (no staging copy of the state).
    - ``lease_seconds``: how long another host's writer lease counts as live without
      a heartbeat.
    - ``clock``: the time source (tests of ``keep_checkpoint_every_n_hours``).
    - ``comm``: the communicator of a multi-worker run (``pyckpt.dist``); by default
      an initialized torch.distributed group, else one process.
    - ``local_dir``: a fast local tier in front of ``directory``: every save goes
      there, some are persisted to ``directory`` in the background.
    - ``local_max_to_keep``: checkpoints kept in the local tier.
    - ``persist_every``: persist every N-th save; ``persist_interval_seconds``: at
      most one persist per that many seconds (neither: every save).
    - ``replicate``: with several workers and ``local_dir``, each worker's files are
      also written to the local tiers of the next ``replicate`` workers.

    ``save()`` returns the new checkpoint's path (None when skipped);
    ``restore_or_initialize()``, ``wait_until_finished()``, ``close()`` (also as a
    context manager), ``checkpoints``, ``latest_checkpoint`` and ``directory`` are
    the rest of its surface.
    """

    def __init__(self, checkpoint: Any, directory: Any, max_to_keep: int | None = 5,
                 keep_checkpoint_every_n_hours: float | None = None,
                 checkpoint_name: str = "ckpt", step_counter: Any = None,
                 checkpoint_interval: int | None = None, init_fn: Callable[[], Any] | None = None,
                 best_fn: Callable[[dict], float] | None = None, best_mode: str = "max",
                 storage_options: dict | None = None, *, max_async_bytes: int | None = None,
                 lease_seconds: float = 600.0, clock: Callable[[], float] = time.time,
                 comm: Communicator | None = None, local_dir: Any = None,
                 local_max_to_keep: int | None = 2, persist_every: int | None = None,
                 persist_interval_seconds: float | None = None, replicate: int = 0) -> None:
        if not hasattr(checkpoint, "save_counter") or not hasattr(checkpoint, "write"):
            raise TypeError("CheckpointManager needs a pyckpt.Checkpoint")
        if max_to_keep is not None and max_to_keep < 1:
            raise ValueError("max_to_keep must be None or at least 1")
        if checkpoint_interval is not None and step_counter is None:
            raise ValueError("checkpoint_interval needs a step_counter")
        check_checkpoint_name(checkpoint_name)
        self._checkpoint = checkpoint
        # names of local checkpoints a tiered manager is persisting: retention skips them
        self._pinned: set[str] = set()
        self._tiers: Tiers | None = None
        if local_dir is not None:  # tiered (docs/API.md section 13): one manager per tier
            if local_max_to_keep is not None and local_max_to_keep < 1:
                raise ValueError("local_max_to_keep must be None or at least 1")
            local = CheckpointManager(checkpoint, local_dir, local_max_to_keep,
                                      checkpoint_name=checkpoint_name, step_counter=step_counter,
                                      checkpoint_interval=checkpoint_interval,
                                      max_async_bytes=max_async_bytes,
                                      lease_seconds=lease_seconds, clock=clock, comm=comm)
            durable = CheckpointManager(checkpoint, directory, max_to_keep,
                                        keep_checkpoint_every_n_hours,
                                        checkpoint_name=checkpoint_name, best_fn=best_fn,
                                        best_mode=best_mode, storage_options=storage_options,
                                        max_async_bytes=0,  # it only copies: no staging
                                        lease_seconds=lease_seconds, clock=clock, comm=comm)
            c = resolve_comm(comm)
            if c is not None and c.world_size > 1:  # every worker: a node-local tier of its own
                if replicate < 0 or replicate >= c.world_size:
                    raise ValueError(f"replicate must be between 0 and {c.world_size - 1} "
                                     f"(the other workers), not {replicate}")
                local._node_local = replicate
                self._tiers = NodeTiers(local, durable, persist_every, persist_interval_seconds,
                                        c)
            else:
                if replicate:
                    raise ValueError("replicate needs a multi-worker job (comm)")
                self._tiers = Tiers(local, durable, persist_every, persist_interval_seconds)
            self._init_fn = init_fn
            self._comm = comm
            return
        if persist_every is not None or persist_interval_seconds is not None or replicate:
            raise ValueError("persist_every, persist_interval_seconds and replicate need a "
                             "local_dir")
        self._store, self._dir = resolve(directory, storage_options)
        self._storage_options = storage_options
        self._max_to_keep = max_to_keep
        self._every_n_hours = keep_checkpoint_every_n_hours
        self._name = checkpoint_name
        self._step_counter = step_counter
        self._interval = checkpoint_interval
        self._init_fn = init_fn
        self._best_fn = best_fn
        self._best_mode = check_mode(best_mode)
        self._max_async_bytes = max_async_bytes
        self._clock = clock
        self._comm = comm
        # a multi-worker tiered manager's local tier: this worker's own directory, saved
        # with this many replicas (workers/node_local.py); None: a plain manager
        self._node_local: int | None = None
        self._lease = WriterLease(self._store, self._dir, lease_seconds, clock)
        self._async = AsyncSaver()
        self._warm_staging()
        self._last_step: int | None = None
        self._cleaned = False
        # multi-worker async saves (docs/PROTOCOL.md section 6b): whether one was started
        # since the workers last agreed on the outcome; rank 0: the failed attempt whose
        # files wait for removal, and the last commit (name, number, metrics)
        self._unsettled = False
        self._failed_attempt: tuple[str, str] | None = None
        # node-local async saves: the communicator their background parts use
        self._bg_comm: Communicator | None = None
        self._last_commit: tuple[str, int, dict | None] | None = None
        self._state = self._recover()
        _LIVE.add(self)

    # -- recovery ---------------------------------------------------------------------
    def _recover(self) -> ManagerState:
        return recover_state(self._store, self._dir, self._name, self._clock, tensorflow=True)

    def _cleanup_leftovers(self) -> None:
        """Finishes interrupted deletions and removes never-committed checkpoints."""
        committed = committed_steps(self._store, self._dir, self._name, tensorflow=True)
        for name in list(self._state.deleting):
            self._delete(name)
        keep = {e.name for e in self._state.active} | {e.name for e in self._state.preserved}
        for entry in self._store.listdir(self._dir):
            if parse_step(entry, self._name) is not None and entry not in committed \
                    and entry not in keep:
                self._store.rmtree(self._store.join(self._dir, entry))
            elif entry.startswith(".pyckpt-manager.") and ".tmp-" in entry:
                # temp file of a state/lock write interrupted by a crash (we hold the lease)
                self._store.delete([self._store.join(self._dir, entry)])
        self._cleaned = True

    # -- properties ---------------------------------------------------------------------
    @property
    def directory(self) -> str:
        """The URL of the managed directory (tiered: the durable one)."""
        if self._tiers is not None:
            return self._tiers.durable.directory
        return self._store.url(self._dir)

    @property
    def checkpoint(self) -> Any:
        """The Checkpoint this manager saves."""
        return self._checkpoint

    @property
    def checkpoints(self) -> list[str]:
        """Paths of the kept checkpoints subject to retention, oldest first (tiered:
        of both tiers, by number; at one number the durable copy first)."""
        if self._tiers is not None:
            return [c[2] for c in reversed(self._tiers.candidates())]
        return [self._url(e.name) for e in self._state.active]

    @property
    def preserved_checkpoints(self) -> list[str]:
        """Paths kept forever by ``keep_checkpoint_every_n_hours``."""
        if self._tiers is not None:
            return self._tiers.durable.preserved_checkpoints
        return [self._url(e.name) for e in self._state.preserved]

    @property
    def latest_checkpoint(self) -> str | None:
        """The checkpoint saved last (TensorFlow's rule; ``pyckpt.latest_checkpoint``
        of the directory says the same). Tiered: the newest of either tier."""
        if self._tiers is not None:
            found = self._tiers.candidates()
            return found[0][2] if found else None
        latest = self._state.latest
        return None if latest is None else self._url(latest)

    def _url(self, name: str) -> str:
        return self._store.url(self._store.join(self._dir, name))

    # -- saving ---------------------------------------------------------------------------
    def save(self, checkpoint_number: Any = None, check_interval: bool = True,
             blocking: bool = True, metrics: dict | None = None) -> str | None:
        """Saves a new numbered checkpoint; returns its path, or None when the step
        interval says it is too soon. With ``blocking=False`` it returns once the
        state is copied to host memory and finishes in the background."""
        if self._tiers is not None:  # tiered: save locally, maybe persist in the background
            self._tiers.before_save()
            with self._tiers.saving():  # the persist in flight yields to this save
                saved = self._tiers.local.save(checkpoint_number, check_interval, blocking,
                                               metrics)
            if saved is not None:
                self._tiers.after_save(saved)
            return saved
        comm = resolve_comm(self._comm)
        multi = comm is not None and comm.world_size > 1
        if comm is not None and multi and self._unsettled:
            self._settle(comm)
        else:
            self._async.wait()
        if self._interval is not None:
            step = int(self._step_counter)
            if self._last_step is not None:
                if step == self._last_step or (check_interval and step < self._last_step + self._interval):
                    return None
            self._last_step = step
        if metrics is not None:
            json.dumps(metrics, allow_nan=False)  # must be storable in the state file
        # the coordinator keeps the state and retention (node-local: each worker its own)
        lead = not multi or (comm is not None and comm.rank == 0) or self._node_local is not None
        if lead:
            self._store.makedirs(self._dir)
            self._begin_writing()
        handed_off = False  # the lease's save-in-flight mark passes to the background save
        try:
            if lead and not self._cleaned:
                self._cleanup_leftovers()
            url = self._save_numbered(checkpoint_number, metrics, blocking, comm, multi, lead)
            if isinstance(url, str):
                return url
            work, finish_url = url
            handed_off = True
            try:
                self._async.start(work)
            except BaseException:
                handed_off = False
                raise
            return finish_url
        finally:
            if lead and not handed_off:
                self._lease.end()

    def _begin_writing(self) -> None:
        """Step 3: checks or takes the writer lease and marks a save in flight. A lease
        taken now (from nobody, a dead holder or an older manager of this process)
        means another manager may have saved since this one read the directory: the
        state is read again (keeping this manager's keep_checkpoint_every_n_hours
        anchor when the directory has no state of its name yet)."""
        begun = self._lease.begin()
        if begun == "held":
            return
        try:
            fresh = self._recover()
            stored = read_state(self._store, self._dir)
            if stored is None or stored.checkpoint_name != self._name:
                fresh.last_preserved_time = self._state.last_preserved_time
            self._state = fresh
            if begun == "taken over":
                warnings.warn(
                    f"CheckpointManager of {self.directory} takes the directory over from an "
                    "older CheckpointManager of this process that still exists (still "
                    "referenced: by a variable, a list, a notebook's output history...). Its "
                    "saves now raise ConcurrentWriterError. close() the old manager, or create "
                    "managers with `with`, to end it cleanly.", stacklevel=3)
        except BaseException:  # (also a warning turned into an error) no save is in flight
            self._lease.end()
            raise

    def _save_numbered(self, checkpoint_number: Any, metrics: dict | None, blocking: bool,
                       comm: Communicator | None, multi: bool,
                       lead: bool) -> str | tuple[Callable[[], None], str]:
        """Steps 4-7: the path of a finished save, or (background work, path) of an
        async one whose copy is made."""
        counter = self._checkpoint.save_counter
        with saving.numbered(counter) as counted:  # a failure below gives the number back
            number = int(checkpoint_number) if checkpoint_number is not None else counted
            name = f"{self._name}-{number}"
            path = self._store.join(self._dir, name)
            url = self._store.url(path)
            self._warn_if_below(number)
            live = None if blocking else traverse(self._checkpoint)
            sync = live is None or not self._async_fits(live)
            if not sync and multi and self._node_local is not None:
                assert comm is not None
                sync = not comm.background_capable  # its collectives run in the background
            if comm is not None and multi and live is not None:
                sync = not self._agree(comm, name, not sync)
            try:
                if sync and self._node_local is not None:
                    write_graph(self._checkpoint, url, storage_options=self._storage_options,
                                comm=comm, node_local=self._node_local)
                elif sync:
                    self._checkpoint.write(url, storage_options=self._storage_options, comm=comm)
                elif comm is not None and multi:
                    assert live is not None
                    bg: background.BackgroundSave | NodeLocalSave = (
                        self._stage_multi(comm, path, live) if self._node_local is None
                        else self._stage_node_local(comm, path, live))
                else:
                    assert live is not None
                    work = self._stage_async(path, live)
            except BaseException as e:
                if lead:
                    self._roll_back(path, name, e)
                raise
        if sync:
            if comm is not None and multi and self._node_local is None:
                self._record_collectively(comm, name, number, metrics)
            else:
                self._record(name, number, metrics)
            return url
        if multi:
            self._unsettled = True
            return self._finish_multi(bg, counter, counted, name, number, metrics, lead), url

        def finish() -> None:
            try:
                try:
                    work()
                except BaseException as e:
                    if int(counter) == counted:  # untouched since: give the number back
                        counter.assign_sub(1)
                    self._roll_back(path, name, e)
                    raise
                self._record(name, number, metrics)
            finally:
                self._lease.end()  # a newer manager waiting to take over may go on

        return finish, url

    # -- multi-worker async saves (docs/PROTOCOL.md section 6b) ------------------------------
    def _agree(self, comm: Communicator, name: str, fits: bool) -> bool:
        """Collective: every worker saves the same checkpoint, and in the background
        only if every worker's state fits ``max_async_bytes``."""
        views = comm.all_gather((name, bool(fits)))
        names = sorted({v[0] for v in views})
        if len(names) > 1:
            raise ValueError(f"the workers would save different checkpoints ({', '.join(names)}): "
                             "their save counters or checkpoint_number differ")
        return all(v[1] for v in views)

    def _stager(self, live: LiveGraph) -> Callable[[], list[tuple[str, Any]]]:
        """The staging step of a multi-worker async save: copies this worker's values
        into the staging buffers and returns them as (key, planned value) items."""
        keys = live.value_keys()
        srcs = [live.array_of(n) for n in live.values]
        objs = [live.objects[n] for n in live.values]

        def stage() -> list[tuple[str, Any]]:
            bufs = self._async.buffers(keys, srcs)
            stage_values(srcs, bufs)
            return list(zip(keys, background.planned(objs, bufs)))

        return stage

    def _stage_multi(self, comm: Communicator, path: str,
                     live: LiveGraph) -> background.BackgroundSave:
        """Collective, in the caller's thread: copies this worker's values into the
        staging buffers, then plans the save with the other workers (no collective
        is left for the background part)."""
        return background.prepare(comm, self._store, path, self._stager(live),
                                  graph=live.to_json())

    def _stage_node_local(self, comm: Communicator, path: str, live: LiveGraph) -> NodeLocalSave:
        """Collective, in the caller's thread: stages and plans as ``_stage_multi``; the
        background part (write, replicas, commit records: workers/node_local.py) runs its
        collectives on a communicator of its own, made at the first such save, and
        made anew by all after one failed anywhere (its collectives may be out of step)."""
        if any(comm.all_gather(self._bg_comm is None)):
            self._bg_comm = comm.background()
        assert self._bg_comm is not None
        planned = plan_save(comm, self._store, path, self._stager(live), None, DEFAULT)
        return NodeLocalSave(self._bg_comm, self._store, path, planned, graph=live.to_json(),
                             replicate=self._node_local or 0, options=DEFAULT)

    def _finish_multi(self, bg: background.BackgroundSave | NodeLocalSave, counter: Any,
                      counted: int, name: str, number: int, metrics: dict | None,
                      lead: bool) -> Callable[[], None]:
        """The background part of one worker: write, publish, and on rank 0 commit,
        record and retire; on the others, wait for the commit and track it (node-local:
        every worker commits its own copy, records it and retires)."""
        def finish() -> None:
            try:
                try:
                    bg.run()
                except BaseException as e:
                    if int(counter) == counted:  # untouched since: give the number back
                        counter.assign_sub(1)
                    if lead:
                        self._failed_attempt = (bg.path, bg.attempt)
                    if isinstance(bg, NodeLocalSave):
                        self._bg_comm = None
                    add_note(e, f"{self._url(name)} was not saved by this call: nothing of it "
                                "was committed (its files are removed at the next save)")
                    raise
                if lead:
                    self._last_commit = (name, number, metrics)
                self._record(name, number, metrics, write=lead)
            finally:
                if lead:
                    self._lease.end()  # a newer manager waiting to take over may go on

        return finish

    def _settle(self, comm: Communicator) -> None:
        """Collective, at the next save after a multi-worker async save: each worker
        waits for its background part, then all learn every worker's outcome and
        raise together (or go on together), so that their collectives stay in step.
        Rank 0 then removes what a failed attempt left (every worker is done with
        it), and a worker that missed rank 0's commit (it stopped waiting) catches up
        with rank 0's save counter and list."""
        err: BaseException | None = None
        try:
            self._async.wait()
        except BaseException as e:  # raised below, after the others heard of it
            err = e
        self._unsettled = False
        mine = None if err is None else f"{type(err).__name__}: {err}"[-4000:]
        reports = comm.gather(mine)
        truth = None
        if comm.rank == 0:
            self._discard_failed()
            truth = (reports, int(self._checkpoint.save_counter), self._last_commit)
        reports, count, last = comm.broadcast(truth)
        self._last_commit = None
        if self._node_local is not None:  # every worker keeps its own directory and state
            if comm.rank != 0:
                self._discard_failed()
        elif comm.rank != 0:
            counter = self._checkpoint.save_counter
            if int(counter) != count:
                counter.assign(count)
            if last is not None and last[0] not in {e.name for e in self._state.active}:
                name, number, metrics = last
                self._record(name, number, metrics, write=False)
        if err is not None:
            raise err
        failed = [f"rank {r}: {m}" for r, m in enumerate(reports) if m is not None]
        if failed:
            raise DistributedSaveError("the background save before this call failed on "
                                       "another worker; this save did not start:\n"
                                       + "\n".join(failed))

    def _discard_failed(self) -> None:
        """Rank 0: removes the files of a failed multi-worker async save."""
        if self._failed_attempt is None:
            return
        path, attempt = self._failed_attempt
        self._failed_attempt = None
        try:
            background.discard(self._store, path, attempt)
        except OSError as e:
            warnings.warn(f"could not remove the files of a failed save under "
                          f"{self._store.url(path)}: {e}")

    def _persist_copy(self, source: str, name: str, number: int, metrics: dict | None,
                      progress: Callable[[int, int], Any] | None = None) -> None:
        """Tiered managers' durable tier: copies the committed checkpoint ``source`` (the
        local tier's) to ``<directory>/<name>`` and records it, as a save would (lease,
        first-save cleanup, commit, state file, retention; a failed copy is rolled back)."""
        self._store.makedirs(self._dir)
        self._begin_writing()
        try:
            if not self._cleaned:
                self._cleanup_leftovers()
            path = self._store.join(self._dir, name)
            try:
                copy_checkpoint(source, self._store.url(path), dst_options=self._storage_options,
                                progress=progress)
            except BaseException as e:
                self._roll_back(path, name, e)
                raise
            self._record(name, number, metrics)
        finally:
            self._lease.end()

    def _warn_if_below(self, number: int) -> None:
        """Numbering at or below an existing checkpoint is allowed (TensorFlow does it),
        but it is almost always a run that forgot to restore first."""
        steps = [e.step for e in self._state.active + self._state.preserved]
        if steps and number <= max(steps):
            warnings.warn(
                f"CheckpointManager of {self.directory} saves {self._name}-{number} although "
                f"{self._name}-{max(steps)} exists: it becomes the latest checkpoint and the "
                "older ones are retired first. Restore before training on "
                "(manager.restore_or_initialize()) to continue the run's numbering.",
                stacklevel=4)  # save -> _save_numbered -> here

    def _roll_back(self, path: str, name: str, error: BaseException) -> None:
        """After a failed save: the checkpoint does not count. Removes its directory
        unless a committed checkpoint of that name already existed (a re-save)."""
        committed = self._store.exists(self._store.join(path, INDEX_NAME))
        if not committed:
            try:
                self._store.rmtree(path)
            except OSError:
                pass
        add_note(error, f"{self._url(name)} was not saved by this call: "
                  + ("a committed checkpoint of that name exists and was left in place"
                     if committed else "nothing of it was left on storage"))

    def _stage_async(self, path: str, live: LiveGraph) -> Callable[[], Any]:
        """Copies the state aside (returning once it may change again) and returns
        the work that writes and commits it (saving.stage)."""
        keys = live.value_keys()
        srcs = [live.array_of(n) for n in live.values]
        return saving.stage(self._store, path, keys, srcs, self._async.buffers(keys, srcs),
                            graph=live.to_json())

    def _warm_staging(self) -> None:
        """With values in device memory already tracked, allocates (pins) the async
        saves' staging buffers in the background now, off the first save's path
        (not with ``max_async_bytes=0``: no save is ever async, e.g. a durable tier)."""
        if self._max_async_bytes == 0:
            return
        try:
            live = traverse(self._checkpoint)
            srcs = [live.array_of(n) for n in live.values]
        except Exception:  # noqa: BLE001 - only an optimisation: the save reports problems
            return
        if has_device_values(srcs):
            self._async.warm(live.value_keys(), srcs)

    def _async_fits(self, live: LiveGraph) -> bool:
        if self._max_async_bytes is None:
            return True
        total = sum(live.array_of(n).nbytes for n in live.values)
        return total <= self._max_async_bytes

    def _record_collectively(self, comm: Communicator, name: str, number: int, metrics: dict | None) -> None:
        """Multi-worker: rank 0 records and deletes; every worker updates its list the
        same way and returns only after rank 0 is done (or raises its error)."""
        outcome = None
        try:
            self._record(name, number, metrics, write=comm.rank == 0)
        except BaseException as e:
            outcome = f"{type(e).__name__}: {e}"
        outcome = comm.broadcast(outcome)
        if outcome is not None:
            raise CheckpointError(f"recording {name} failed on rank 0: {outcome}")

    def _record(self, name: str, number: int, metrics: dict | None, write: bool = True) -> None:
        """After a commit: list it, then apply retention (``write``: also update the
        state file and delete; other workers of a multi-worker run only track)."""
        if write:
            self._lease.refresh()
        st = self._state
        st.active = [e for e in st.active if e.name != name]
        st.active.append(Entry(name, number, self._clock(), metrics))
        for e in select_removals(st.active, self._max_to_keep, self._best_fn, self._best_mode):
            if e.name in self._pinned:  # being persisted (tiers): retired at a later save
                continue
            st.active.remove(e)
            if preserve(e, st.last_preserved_time or 0.0, self._every_n_hours):
                st.preserved.append(e)
                st.last_preserved_time = e.time
            else:
                st.deleting.append(e.name)
        if not write:
            st.deleting.clear()
            return
        try:
            write_state(self._store, self._dir, st)
            if st.deleting:
                for n in list(st.deleting):
                    self._delete(n)
                write_state(self._store, self._dir, st)
        except (OSError, CheckpointError) as e:
            raise CheckpointIOError(
                getattr(e, "errno", None) or errno.EIO,
                f"{self._url(name)} was committed and counts: it is the latest checkpoint. "
                f"Recording it in the manager state or retiring old checkpoints failed "
                f"({type(e).__name__}: {e}); the next save or a new manager finishes that."
            ) from e

    def _delete(self, name: str) -> None:
        """Un-commits (index first) and removes one checkpoint; forgets the mark."""
        check_step_name(name, self._name)  # never a path: see engine/run.py
        run_delete_checkpoint(self._store, self._dir, name)  # pyckpt's or TensorFlow's
        if name in self._state.deleting:
            self._state.deleting.remove(name)

    # -- other calls -----------------------------------------------------------------------
    def wait_until_finished(self) -> None:
        """Waits for an async save (tiered: and the persist in flight); raises its error
        if it failed."""
        if self._tiers is not None:
            self._tiers.local.wait_until_finished()
            self._tiers.flush()
            return
        self._async.wait()

    def restore_or_initialize(self) -> str | None:
        """Restores the latest checkpoint and returns its path; else runs init_fn
        (if any) and returns None. Tiered: the newest checkpoint of either tier that
        verifies, falling back to older ones and to the other tier."""
        if self._tiers is not None:
            self._tiers.local.wait_until_finished()
            restored = self._tiers.restore(self._checkpoint)
            if restored is None and self._init_fn is not None:
                self._init_fn()
            return restored
        self._async.wait()
        latest = self.latest_checkpoint
        if latest is not None:
            with comm_scope(self._comm):  # PerWorker values: this worker's row
                self._checkpoint.restore(latest, storage_options=self._storage_options)
            return latest
        if self._init_fn is not None:
            self._init_fn()
        return None

    def close(self) -> None:
        """Waits for pending work, frees the staging buffers of async saves (pinned
        memory for device values) and gives up the writer lease."""
        if self._tiers is not None:
            try:
                self._tiers.local.wait_until_finished()
                self._tiers.flush()
            finally:
                try:
                    self._tiers.local.close()
                finally:
                    self._tiers.durable.close()
            return
        try:
            self._async.wait()
        finally:
            try:
                self._async.release()
            finally:
                self._lease.release()

    def __del__(self) -> None:
        lease = self.__dict__.get("_lease")
        if lease is not None and lease.held:
            lease.release()

    def __enter__(self) -> "CheckpointManager":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __repr__(self) -> str:
        if self._tiers is not None:
            return (f"<CheckpointManager {self.directory!r} with local tier "
                    f"{self._tiers.local.directory!r}: latest {self.latest_checkpoint!r}>")
        return (f"<CheckpointManager {self.directory!r}: {len(self._state.active)} kept, "
                f"latest {self.latest_checkpoint!r}>")
