"""Tiered checkpoints of a multi-worker job (docs/API.md section 13, docs/PROTOCOL.md
section 7): every worker has a local tier of its own (a node's disk), the durable
tier is shared.

- **Save.** Every worker saves its part into its own local directory and commits
  the same index there, after keeping the replicas of ``replicate`` other workers'
  parts (``workers/node_local.py``); each worker's local manager keeps its own state
  file and retention. ``blocking=False``: the local manager runs all of that after
  staging, in its background thread, on a background communicator.
- **Persist.** When due (rank 0 decides, for all), each worker uploads (once its
  local save committed) the files it wrote itself from its local directory to the
  durable checkpoint directory, in a background thread, verifying every chunk,
  under the same names. No
  collective runs in the background, and the upload pauses while a save runs:
  the next save (or ``wait_until_finished``,
  ``close``) all-gathers the workers' upload status; once every upload is done
  rank 0 commits the index in the durable tier and records it (a failed upload is
  reported there, as a background error, and its files removed). A save never
  waits for an upload.
- **Restore.** Collective: the workers all-gather what their local tiers hold;
  the newest checkpoint whose files some node still holds (own part or replica)
  wins if it is at least as new as the durable tier's; every node receives the
  files it lacks (every worker reads every part: the object graph reads a
  PerWorker value's rows whole) and restores from its local copy, every chunk
  read checked. If any worker fails that, all
  restore from the durable tier instead (which assigns every value again).
"""

from __future__ import annotations

import threading
import warnings
from typing import TYPE_CHECKING, Any

from ..workers import node_local
from ..workers.comm import Communicator, comm_scope
from ..engine import writer
from ..engine.commit import read_previous
from ..engine.copy import copy_file
from ..engine.reader import open_checkpoint
from ..engine.run import parse_step
from ..errors import CheckpointError, add_note
from .tiers import Tiers

PERSIST_WINDOW = 16 << 20  # the upload checks for a save to yield to this often
SKIPPED = "skipped"  # an upload's status when its local save failed

if TYPE_CHECKING:
    from .manager import CheckpointManager


class NodeTiers(Tiers):
    """``Tiers`` of a multi-worker job (see the module doc). Every method that talks
    to the other workers is called by all of them, in the same order."""

    def __init__(self, local: "CheckpointManager", durable: "CheckpointManager",
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
        self.local._pinned.add(name)
        self._inflight = (name, parse_step(name, self.local._name) or 0, None)
        self._upload_error = None
        rank = self.comm.rank

        def run() -> None:
            self.local._async.join()  # an async local save: its error stays there
            entry = next((e for e in self.local._state.active + self.local._state.preserved
                          if e.name == name), None)
            if entry is None:  # the local save failed (on every worker): nothing to persist
                self._upload_error = SKIPPED
                return
            self._inflight = (name, entry.step, entry.metrics)
            try:
                ck = open_checkpoint(self.local._url(name), self.local._storage_options)
                dstore = self.durable._store
                dpath = dstore.join(self.durable._dir, name)
                dstore.makedirs(dpath)
                for f, file in enumerate(ck.manifest.files):
                    if node_local.writer_rank(file.name) == rank:
                        copy_file(ck, f, dstore, dstore.join(dpath, file.name),
                                  self.yield_to_saves, window=PERSIST_WINDOW)
            except BaseException as e:  # noqa: BLE001 - reported at the next settle
                self._upload_error = f"{type(e).__name__}: {e}"

        # not a daemon: an upload in flight at interpreter exit completes
        self._thread = threading.Thread(target=run, name="pyckpt-persist")
        self._thread.start()

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
        running = self._thread is not None and self._thread.is_alive()
        status = "running" if running else self._upload_error
        statuses = self.comm.all_gather(status)
        if "running" in statuses:
            return
        self.join()
        name, number, metrics = self._inflight
        self._inflight = None
        self.local._pinned.discard(name)
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
                self.durable._record(name, number, metrics, write=False)
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
        dpath = d._store.join(d._dir, name)
        if failed:
            _remove_uncommitted(d, dpath)
            return "\n".join(failed)
        d._store.makedirs(d._dir)
        d._begin_writing()
        try:
            manifest = read_previous(self.local._store, self.local._store.join(
                self.local._dir, name))
            if manifest is None:
                raise CheckpointError(f"the local index of {name} is gone")
            writer.commit(writer.Commit(d._store, dpath, manifest, delete_replaced=False,
                                        sweep=False))
            if not d._cleaned:
                d._cleanup_leftovers()
                d._cleaned = True
            d._record(name, number, metrics)
            return None
        except BaseException as e:  # noqa: BLE001 - reported to every worker
            _remove_uncommitted(d, dpath)
            return f"rank 0 (commit): {type(e).__name__}: {e}"
        finally:
            d._lease.end()

    def flush(self) -> None:
        """Collective: waits for the persist in flight and commits it; then persists the
        newest local checkpoint if one came due meanwhile. Raises the error of either."""
        self.settle(block=True)
        self.raise_error()
        latest = self.local._state.latest
        durable = {e.name for e in self.durable._state.active + self.durable._state.preserved}
        due = latest is not None and self._since > 0 and self._due() and latest not in durable
        name = self.comm.broadcast(latest if due else None)  # rank 0 decides for all
        if name is not None:
            self.start(self.local._url(name))
            self.settle(block=True)
            self.raise_error()

    # -- restore ----------------------------------------------------------------------
    def restore(self, checkpoint: Any) -> str | None:
        """Collective: restores the newest checkpoint the nodes can restore together from
        their local tiers (receiving the files a node lacks from the nodes holding
        them), unless the durable tier holds a newer one; falls back to the durable
        tier's checkpoints, newest first. Returns the path restored, or None."""
        comm, local = self.comm, self.local
        local._state = local._recover()
        names = [e.name for e in local._state.active + local._state.preserved]
        invs = comm.all_gather(node_local.inventory(local._store, local._dir, names))
        order = sorted({n for inv in invs for n in inv},
                       key=lambda n: -(parse_step(n, local._name) or 0))
        chosen = node_local.restore_plan(invs, order, comm.world_size)
        durable = sorted(self.durable._state.active + self.durable._state.preserved,
                         key=lambda e: -e.step)
        errors = []
        newest_durable = durable[0].step if durable else -1
        if chosen is not None and (parse_step(chosen, local._name) or 0) >= newest_durable:
            url = local._url(chosen)
            problem = None
            try:
                node_local.fetch_missing(comm, local._store, local._store.join(local._dir, chosen),
                                         chosen, invs)
                # every value read is checked; a failure anywhere sends every worker to
                # the durable tier, whose restore assigns every value again
                with comm_scope(comm):
                    checkpoint.restore(url, storage_options=local._storage_options)
            except (CheckpointError, OSError) as exc:
                problem = f"{type(exc).__name__}: {exc}"
            problems = comm.all_gather(problem)
            if all(p is None for p in problems):
                local._state = local._recover()
                return url
            errors += [f"{chosen} (local tier) on rank {r}: {p}" for r, p in enumerate(problems)
                       if p is not None]
            warnings.warn(f"cannot restore {chosen} from the local tiers ({'; '.join(errors)}); "
                          "trying the durable tier", stacklevel=3)
        for e in durable:
            url = self.durable._url(e.name)
            problem = None
            try:
                with comm_scope(comm):
                    checkpoint.restore(url, storage_options=self.durable._storage_options)
            except (CheckpointError, OSError) as exc:
                problem = f"{type(exc).__name__}: {exc}"
            problems = comm.all_gather(problem)
            if all(p is None for p in problems):
                return url
            errors += [f"{url} on rank {r}: {p}" for r, p in enumerate(problems) if p is not None]
        if errors:
            raise CheckpointError("no checkpoint of either tier could be restored:\n"
                                  + "\n".join(errors))
        return None


def _remove_uncommitted(d: "CheckpointManager", path: str) -> None:
    """Best effort: removes an uploaded checkpoint directory that was not committed."""
    try:
        if read_previous(d._store, path) is None:
            d._store.rmtree(path)
    except OSError:
        pass
