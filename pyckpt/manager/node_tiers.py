"""Tiered checkpoints of a multi-worker job (docs/API.md section 13, docs/PROTOCOL.md
section 7): every worker has a local tier of its own (a node's disk), the durable
tier is shared.

- **Save.** Every worker saves its part into its own local directory and commits
  the same index there, after keeping the replicas of ``replicate`` other workers'
  parts (``saving``'s node-local route); each worker's local manager keeps its own
  state file and retention. ``blocking=False``: the local manager runs all of that after
  staging, in the background (its ``PendingSave``), on a background communicator.
- **Persist.** When due (rank 0 decides, for all), each worker uploads (once its
  local save committed) the files it wrote itself from its local directory to the
  durable checkpoint directory, in a background job (``jobs.py``), verifying every
  chunk, under the same names (``saving.upload``). No collective runs in the
  background, and the upload pauses while a save runs: the next save (or
  ``wait_until_finished``, ``close``) all-gathers the workers' upload status; once
  every upload is done rank 0 commits the index in the durable tier
  (``saving.commit_upload``) and records it (a failed upload is reported there, as a
  background error, and its files removed). A save never waits for an upload.
- **Restore.** Collective: the workers all-gather what their local tiers hold;
  the newest checkpoint whose files some node still holds (own part or replica)
  wins if it is at least as new as the durable tier's; every node receives the
  files it lacks (``saving.from_peers``; every worker reads every part: the object
  graph reads a PerWorker value's rows whole) and restores from its local copy,
  every chunk read checked. If any worker fails that, all restore from the durable
  tier instead (which assigns every value again).
"""

from __future__ import annotations

import warnings
from typing import Any

from .. import jobs, saving
from ..errors import CheckpointError, add_note
from ..workers.comm import Communicator, comm_scope
from .keeper import RunKeeper
from .tiers import Tiers

PERSIST_WINDOW = 16 << 20  # the upload checks for a save to yield to this often
SKIPPED = "skipped"  # an upload's status when its local save failed


class NodeTiers(Tiers):
    """``Tiers`` of a multi-worker job (see the module doc). Every method that talks
    to the other workers is called by all of them, in the same order."""

    def __init__(self, local: RunKeeper, durable: RunKeeper,
                 persist_every: int | None, persist_interval_seconds: float | None,
                 comm: Communicator) -> None:
        super().__init__(local, durable, persist_every, persist_interval_seconds)
        self.comm = comm
        # the persist started and not yet settled: (name, number, metrics)
        self._inflight: tuple[str, int, dict | None] | None = None
        self._upload_error: str | None = None

    # -- persist ----------------------------------------------------------------------
    def before_save(self) -> None:
        self.settle(block=False)
        self.raise_error()

    def busy(self) -> bool:
        return self._inflight is not None

    def after_save(self, url: str) -> None:
        self._since += 1
        due = self.comm.broadcast(self._inflight is None and self._due())
        if due:
            self.start(url)

    def start(self, url: str) -> None:
        """Pins the local checkpoint ``url`` and uploads this worker's files of it in
        the background, once its local save (async or not) committed; ``settle`` commits
        it once every worker's upload is done."""
        self.join()
        name = url.rstrip("/").rsplit("/", 1)[-1]
        self._since = 0
        self._last_start = self._clock()
        self.local.pin(name)
        self._inflight = (name, self.local.step_of(name), None)
        self._upload_error = None
        rank = self.comm.rank

        def run() -> None:
            try:  # whatever fails here is this worker's upload error: never a silent "done"
                self.local.join()  # an async local save: its error stays there
                entry = self.local.entry(name)
                if entry is None:  # the local save failed (on every worker): nothing to do
                    self._upload_error = SKIPPED
                    return
                self._inflight = (name, entry.step, entry.metrics)
                saving.upload(self._copy_plan(name), rank, PERSIST_WINDOW)
            except BaseException as e:  # noqa: BLE001 - reported at the next settle
                self._upload_error = f"{type(e).__name__}: {e}"

        # a job (jobs.py): an upload in flight at interpreter exit completes
        self._job = jobs.submit(run, "pyckpt-persist", lane=self)

    def settle(self, block: bool) -> None:
        """Collective: when every worker's upload of the persist in flight is done, rank
        0 commits it in the durable tier and every worker records it; an upload that
        failed anywhere is reported (kept for ``raise_error``) and its files removed.
        ``block``: wait for this worker's upload first; else an upload still running
        anywhere defers this to a later call."""
        if self._inflight is None:
            return
        if block:
            self.join()
        running = self._job is not None and not self._job.done()
        status = "running" if running else self._upload_error
        statuses = self.comm.all_gather(status)
        if "running" in statuses:
            return
        self.join()
        name, number, metrics = self._inflight
        self._inflight = None
        self.local.unpin(name)
        if SKIPPED in statuses:  # its local save failed: reported by that save, due again
            self._since = self._every or 0
            self._last_start = float("-inf")
            return
        failed = [f"rank {r}: {s}" for r, s in enumerate(statuses) if s is not None]
        outcome = None
        if self.comm.rank == 0:
            outcome = self._commit_durable(name, number, metrics, failed)
        outcome = self.comm.broadcast(outcome)
        if outcome is None:
            if self.comm.rank != 0:
                self.durable.record(name, number, metrics, write=False)
            return
        self._since = self._every or 0  # due again at the next save
        self._last_start = float("-inf")
        err = CheckpointError(f"persisting {name} to {self.durable.directory} failed:\n{outcome}")
        add_note(err, "the local checkpoints are intact; the next save persists again")
        with self._lock:
            self._error = err

    def _commit_durable(self, name: str, number: int, metrics: dict | None,
                        failed: list[str]) -> str | None:
        """Rank 0: commits the uploaded checkpoint (the index of its local copy) in the
        durable tier and records it; on any failure removes what was uploaded. Returns
        the error text, or None."""
        d = self.durable
        if failed:
            d.remove_uncommitted(name)
            return "\n".join(failed)
        try:
            d.adopt(name, number, metrics,
                    lambda path: saving.commit_upload(self._copy_plan(name, path)),
                    uploaded=True)
            return None
        except BaseException as e:  # noqa: BLE001 - reported to every worker
            d.remove_uncommitted(name)
            return f"rank 0 (commit): {type(e).__name__}: {e}"

    def _copy_plan(self, name: str, path: str | None = None) -> saving.CopyPlan:
        """The copy of the local checkpoint ``name`` to the durable tier's ``path``
        (default: ``<durable>/<name>``), yielding to saves between its windows."""
        local, d = self.local, self.durable
        return saving.CopyPlan(local.store, local.store.join(local.path, name),
                               local.storage_options, d.store,
                               d.store.join(d.path, name) if path is None else path,
                               d.storage_options, progress=self.yield_to_saves)

    def flush(self) -> None:
        """Collective: waits for the persist in flight and commits it; then persists the
        newest local checkpoint if one came due meanwhile. Raises the error of either."""
        self.settle(block=True)
        self.raise_error()
        latest = self.local.latest_name
        due = (latest is not None and self._since > 0 and self._due()
               and self.durable.entry(latest) is None)
        name = self.comm.broadcast(latest if due else None)  # rank 0 decides for all
        if name is not None:
            self.start(self.local.url(name))
            self.settle(block=True)
            self.raise_error()

    # -- restore ----------------------------------------------------------------------
    def restore(self, checkpoint: Any) -> str | None:
        """Collective: restores the newest checkpoint the nodes can restore together from
        their local tiers (receiving the files a node lacks from the nodes holding
        them), unless the durable tier holds a newer one; falls back to the durable
        tier's checkpoints, newest first. Returns the path restored, or None."""
        comm, local = self.comm, self.local
        local.wait_until_finished()
        local.reload()
        peers = saving.from_peers(comm, local.store, local.path,
                                  [e.name for e in local.entries()], local.step_of)
        chosen = peers.name
        durable = sorted(self.durable.entries(), key=lambda e: -e.step)
        errors: list[str] = []
        if chosen is not None and local.step_of(chosen) >= (durable[0].step if durable else -1):
            # fetch: the files this node lacks, from the nodes holding them
            if self._restore_together(checkpoint, local, chosen, errors, peers.fetch):
                local.reload()
                return local.url(chosen)
            warnings.warn(f"cannot restore {chosen} from the local tiers ({'; '.join(errors)}); "
                          "trying the durable tier", stacklevel=3)
        for e in durable:
            if self._restore_together(checkpoint, self.durable, e.name, errors):
                return self.durable.url(e.name)
        if errors:
            raise CheckpointError("no checkpoint of either tier could be restored:\n"
                                  + "\n".join(errors))
        return None

    def _restore_together(self, checkpoint: Any, keeper: RunKeeper, name: str,
                          errors: list[str], fetch: Any = None) -> bool:
        """Collective: every worker restores ``name`` of ``keeper`` (after ``fetch()``);
        False, with every worker's error added to ``errors``, when that failed anywhere.
        Every value read is checked; the next checkpoint tried assigns every value again."""
        url, problem = keeper.url(name), None
        try:
            if fetch is not None:
                fetch()
            with comm_scope(self.comm):
                checkpoint.restore(url, storage_options=keeper.storage_options)
        except (CheckpointError, OSError) as exc:
            problem = f"{type(exc).__name__}: {exc}"
        problems = self.comm.all_gather(problem)
        errors += [f"{url} on rank {r}: {p}" for r, p in enumerate(problems) if p is not None]
        return all(p is None for p in problems)
