"""One run directory's keeper: the numbered checkpoints ``<directory>/<name>-<N>``
of a training run, their state file, the writer lease and retention (docs/API.md
section 3). ``CheckpointManager`` is one keeper, or two composed by ``tiers.py``.

A keeper numbers, leases, records and retires; ``saving`` writes and commits, in
every mode: the keeper builds one ``saving.SavePlan`` per save (``graph_plan``: the
plan reads the incremental base and decides the route) and hands it to
``saving.run``, which writes it blocking or starts it in the background. Save
sequence: the 7 steps of docs/PROTOCOL.md section 3, in short:
 1. wait for the previous background save (raising its error, if any; with
    several workers they also agree on its outcome, so that all raise or none:
    ``_settle``);
 2. skip the save (return None) while ``checkpoint_interval`` says so;
 3. take or renew the writer lease (a newer keeper of this process takes it over
    from an older one, after that one's save in flight; a lease taken anew
    re-reads the state file); on the first save, clean up leftovers of crashed
    runs (uncommitted ``<name>-<N>`` directories, half-done deletions);
 4. bump ``save_counter``: the checkpoint is ``<name>-<N>`` (a number at or below
    an existing checkpoint warns);
 5. write and commit ``<directory>/<name>-<N>`` (``blocking=False``: from a
    staging copy made before returning, unless it exceeds ``max_async_bytes``;
    with several workers they agree on it, the collectives run here and the
    background part talks through the store only: docs/PROTOCOL.md section 6b);
 6. check the lease again and record it in the state file (atomic replace);
 7. apply retention: a checkpoint to delete is first marked ``deleting`` in the
    state file, then its index is removed (it stops being a checkpoint), then
    its files.
The newest committed checkpoint is never deleted.
"""

from __future__ import annotations

import json
import time
import weakref
from typing import Any, Callable

from .. import jobs, saving
from ..errors import DistributedSaveError, add_note
from ..graph.checkpoint import graph_items, graph_plan
from ..storage import resolve
from ..workers.comm import Communicator, comm_scope, resolve_comm
from .lock import WriterLease
from .run_state import Records

_LIVE: "weakref.WeakSet[RunKeeper]" = weakref.WeakSet()


@jobs.at_shutdown
def _release_leases() -> None:
    """At exit, once every background save and persist ended (``jobs.shutdown``):
    gives up the writer leases this process holds."""
    for k in list(_LIVE):
        try:
            k.lease.release()
        except BaseException:  # noqa: BLE001 - storage clients may be shut down at exit
            pass


class RunKeeper(Records):
    """The checkpoints of one run directory (module doc). ``node_local=k``: a
    multi-worker job's node-local tier, this worker's own directory, saved with k
    replicas (workers/node_local.py)."""

    def __init__(self, checkpoint: Any, directory: Any, max_to_keep: int | None = 5,
                 keep_checkpoint_every_n_hours: float | None = None,
                 checkpoint_name: str = "ckpt", step_counter: Any = None,
                 checkpoint_interval: int | None = None,
                 best_fn: Callable[[dict], float] | None = None, best_mode: str = "max",
                 storage_options: dict | None = None, *, max_async_bytes: int | None = None,
                 lease_seconds: float = 600.0, clock: Callable[[], float] = time.time,
                 comm: Communicator | None = None, node_local: int | None = None,
                 incremental: bool = False, full_save_every: int | None = 10,
                 max_pinned_bytes: int | None = None,
                 max_device_snapshot_bytes: int | None = None) -> None:
        store, path = resolve(directory, storage_options)
        lease = WriterLease(store, path, lease_seconds, clock)
        super().__init__(store, path, checkpoint_name, lease, max_to_keep=max_to_keep,
                         every_n_hours=keep_checkpoint_every_n_hours, best_fn=best_fn,
                         best_mode=best_mode, clock=clock, storage_options=storage_options)
        self.checkpoint = checkpoint
        self._step_counter = step_counter
        self._interval = checkpoint_interval
        self._max_async_bytes = max_async_bytes
        self._comm = comm
        self.node_local = node_local
        self.incremental = incremental
        self._full_every = full_save_every
        self.max_pinned_bytes = max_pinned_bytes
        # staging buffers kept between saves (a ring within max_pinned_bytes, if given)
        # and the device snapshot buffers (within max_device_snapshot_bytes)
        self.background = saving.Background(max_pinned_bytes, max_device_snapshot_bytes)
        #: how the last background save copied the state aside (``saving.StagingReport``,
        #: its ``blocked_seconds`` the whole ``save`` call; the device route's
        #: ``pinned_bytes`` is set once its drain took the buffers); None before one
        self.last_staging: saving.StagingReport | None = None
        self._pending: saving.PendingSave | None = None
        # a failed multi-worker background save whose error was already raised (by
        # wait_until_finished): its files are removed at the next settle
        self._failed: saving.PendingSave | None = None
        self._last_step: int | None = None
        # multi-worker async saves (docs/PROTOCOL.md section 6b): whether one was started
        # since the workers last agreed on the outcome; rank 0: the last commit
        self._unsettled = False
        self._last_commit: tuple[str, int, dict | None] | None = None
        self._warm_staging()
        _LIVE.add(self)

    # -- saving ---------------------------------------------------------------------------
    def save(self, checkpoint_number: Any = None, check_interval: bool = True,
             blocking: bool = True, metrics: dict | None = None) -> str | None:
        """Steps 1-7 (module doc): the new checkpoint's path, or None when skipped."""
        t0 = time.perf_counter()
        comm = resolve_comm(self._comm)
        multi = comm is not None and comm.world_size > 1
        if comm is not None and multi and self._unsettled:
            self._settle(comm)
        else:
            self.wait_until_finished()
        if self._skipped(check_interval):
            return None
        if metrics is not None:
            json.dumps(metrics, allow_nan=False)  # must be storable in the state file
        # the coordinator keeps the state and retention (node-local: each worker its own)
        lead = not multi or (comm is not None and comm.rank == 0) or self.node_local is not None
        if lead:
            self.store.makedirs(self.path)
            self.begin_writing()
        pending = None  # the lease's save-in-flight mark passes to the background save
        try:
            if lead and not self.cleaned:
                self.cleanup_leftovers()
            url, pending = self._save_numbered(checkpoint_number, metrics, blocking, comm,
                                               multi, lead)
            self._pending = pending
            if pending is not None and pending.staging is not None:
                pending.staging.blocked_seconds = time.perf_counter() - t0  # the whole call
                self.last_staging = pending.staging
            return url
        finally:
            if lead and pending is None:
                self.lease.end()

    def _skipped(self, check_interval: bool) -> bool:
        """Step 2: whether ``checkpoint_interval`` says it is too soon."""
        if self._interval is None:
            return False
        step = int(self._step_counter)
        if self._last_step is not None:
            if step == self._last_step or (check_interval
                                           and step < self._last_step + self._interval):
                return True
        self._last_step = step
        return False

    def _save_numbered(self, checkpoint_number: Any, metrics: dict | None, blocking: bool,
                       comm: Communicator | None, multi: bool,
                       lead: bool) -> tuple[str, saving.PendingSave | None]:
        """Steps 4-7: the path, and the handle of a background save (None: finished)."""
        counter = self.checkpoint.save_counter
        with saving.numbered(counter) as counted:  # a failure below gives the number back
            number = int(checkpoint_number) if checkpoint_number is not None else counted
            name = f"{self.name}-{number}"
            url = self.url(name)
            self.warn_if_below(number)
            if lead:
                self.check_not_held(name)
            prev = self.previous(name) if self.incremental else None
            after = self._after(counter, counted, name, number, metrics, lead, multi)
            try:  # one plan (saving reads the base and takes the route), written or started
                plan = graph_plan(self.checkpoint, url, storage_options=self.storage_options,
                                  comm=comm, node_local=self.node_local,
                                  incremental=self.incremental,
                                  base=None if prev is None else self.url(prev),
                                  full_save_every=self._full_every,
                                  max_pinned_bytes=self.max_pinned_bytes)
                pending = saving.run(plan, blocking=blocking,
                                     max_async_bytes=self._max_async_bytes,
                                     keep=self.background, then=after)
            except BaseException as e:
                if lead:
                    self.roll_back(name, e)
                raise
        if pending is not None:
            self._unsettled = multi
        elif comm is not None and multi and self.node_local is None:
            self.record_collectively(comm, name, number, metrics)
        else:
            self.record(name, number, metrics)
        return url, pending

    def _after(self, counter: Any, counted: int, name: str, number: int,
               metrics: dict | None, lead: bool,
               multi: bool) -> Callable[[BaseException | None], None]:
        """What the background thread does once the save ended: record the commit (rank
        0 of several workers: record and retire; the others: track it; node-local:
        every worker its own), or give the number back and say what was left."""
        def after(error: BaseException | None) -> None:
            try:
                if error is not None:
                    if int(counter) == counted:  # untouched since: give the number back
                        counter.assign_sub(1)
                    if not multi:
                        self.roll_back(name, error)
                    else:
                        add_note(error, f"{self.url(name)} was not saved by this call: nothing "
                                        "of it was committed (its files are removed at the "
                                        "next save)")
                    return
                if multi and lead:
                    self._last_commit = (name, number, metrics)
                self.record(name, number, metrics, write=lead)
            finally:
                if lead:
                    self.lease.end()  # a newer manager waiting to take over may go on

        return after

    def previous(self, name: str) -> str | None:
        """The name of the checkpoint saved last, if other than ``name``: what an
        incremental save (or a tier's persist) of ``name`` references."""
        latest = self.latest_name
        return None if latest == name else latest

    def base_for(self, name: str) -> "saving.Base | None":
        """The base of an incremental copy into ``name`` (a tier's persist): the
        ``previous`` checkpoint, if it is a committed pyckpt checkpoint (None: a full
        copy)."""
        prev = self.previous(name)
        if prev is None:
            return None
        return saving.base_at(self.store, self.store.join(self.path, prev), self._full_every)

    def _warm_staging(self) -> None:
        """Allocates (pins) the async saves' staging buffers of the values already
        tracked in device memory in the background now, off the first save's path
        (``saving.Background.warm``; not with ``max_async_bytes=0``: no save is ever
        async, e.g. a durable tier)."""
        if self._max_async_bytes == 0:
            return
        try:
            items, _ = graph_items(self.checkpoint)
        except Exception:  # noqa: BLE001 - only an optimisation: the save reports problems
            return
        self.background.warm([it.key for it in items], [it.array for it in items])

    # -- multi-worker async saves (docs/PROTOCOL.md section 6b) ------------------------------
    def _settle(self, comm: Communicator) -> None:
        """Collective, at the next save after a multi-worker async save: each worker
        waits for its background part, then all learn every worker's outcome and
        raise together (or go on together), so that their collectives stay in step.
        Rank 0 (node-local: every worker) then removes what a failed attempt left
        (every worker is done with it), and a worker that missed rank 0's commit (it
        stopped waiting) catches up with rank 0's save counter and list."""
        pending = self._pending
        err = None
        if pending is not None:
            pending.join()  # the handle stays until the save ended (close() may follow)
            err = pending.error
        self._pending = None
        leftover, self._failed = (pending if err is not None else self._failed), None
        self._unsettled = False
        mine = None if err is None else f"{type(err).__name__}: {err}"[-4000:]
        reports = comm.gather(mine)
        truth = None
        if comm.rank == 0:
            if leftover is not None:
                leftover.discard()
            truth = (reports, int(self.checkpoint.save_counter), self._last_commit)
        reports, count, last = comm.broadcast(truth)
        self._last_commit = None
        if self.node_local is not None:  # every worker keeps its own directory and state
            if comm.rank != 0 and leftover is not None:
                leftover.discard()
        elif comm.rank != 0:
            self._catch_up(count, last)
        if err is not None:
            raise err
        failed = [f"rank {r}: {m}" for r, m in enumerate(reports) if m is not None]
        if failed:
            raise DistributedSaveError("the background save before this call failed on "
                                       "another worker; this save did not start:\n"
                                       + "\n".join(failed))

    def _catch_up(self, count: int, last: tuple[str, int, dict | None] | None) -> None:
        counter = self.checkpoint.save_counter
        if int(counter) != count:
            counter.assign(count)
        if last is not None and self.entry(last[0]) is None:
            self.record(*last, write=False)

    # -- other calls -----------------------------------------------------------------------
    def join(self, timeout: float | None = None) -> None:
        """Waits (at most ``timeout`` seconds) for the background save in flight,
        keeping its error for the next call."""
        pending = self._pending
        if pending is not None:
            pending.join(timeout)

    def wait_until_finished(self) -> None:
        """Waits for the background save in flight; raises its error (once). The handle
        is kept until the save ended: an interrupted wait leaves it for ``close``."""
        pending = self._pending
        if pending is None:
            return
        pending.join()
        self._pending = None
        if pending.error is not None:
            if self._unsettled:  # several workers: its files go at the next settle
                self._failed = pending
            raise pending.error

    def restore(self, checkpoint: Any) -> str | None:
        """Restores the latest checkpoint; returns its path, or None when there is none."""
        self.wait_until_finished()
        latest = self.latest_checkpoint
        if latest is not None:
            with comm_scope(self._comm):  # PerWorker values: this worker's row
                checkpoint.restore(latest, storage_options=self.storage_options)
        return latest

    def close(self) -> None:
        """Waits for pending work, frees the staging buffers of async saves (pinned
        memory for device values) and gives up the writer lease."""
        try:
            self.wait_until_finished()
        finally:
            try:
                self.background.release()
            finally:
                self.lease.release()

    def __del__(self) -> None:
        lease = self.__dict__.get("lease")
        if lease is not None and lease.held:
            lease.release()
