"""What a run directory's keeper records: its list of checkpoints (the state file
``pyckpt-manager.json``, through ``run_directory.py``), retention, the writer lease,
recovery after a crash, and the commits that arrive from elsewhere (a tier's persist).
``keeper.py`` adds the saving on top (docs/PROTOCOL.md section 3, steps 3, 6 and 7)."""

from __future__ import annotations

import errno
import warnings
from typing import Any, Callable

from ..engine.references import held_files, retire, uncommit
from ..errors import CheckpointError, CheckpointIOError, add_note
from ..format import INDEX_NAME
from ..run_directory import (Entry, ManagerState, check_checkpoint_name, check_step_name,
                             committed_manifest, committed_steps, parse_step, read_state,
                             recover_state, write_state)
from ..storage import Store
from ..workers.comm import Communicator
from .lock import WriterLease
from .retention import check_mode, preserve, select_removals


class Records:
    """The recorded checkpoints of ``<store>/<path>`` named ``<name>-<N>``."""

    def __init__(self, store: Store, path: str, name: str, lease: WriterLease, *,
                 max_to_keep: int | None, every_n_hours: float | None,
                 best_fn: Callable[[dict], float] | None, best_mode: str,
                 clock: Callable[[], float], storage_options: dict | None) -> None:
        check_checkpoint_name(name)
        self.store, self.path, self.name, self.lease = store, path, name, lease
        self.storage_options = storage_options
        self._max_to_keep = max_to_keep
        self._every_n_hours = every_n_hours
        self._best_fn = best_fn
        self._best_mode = check_mode(best_mode)
        self._clock = clock
        self.cleaned = False  # leftovers of crashed runs removed (first save)
        self._pinned: set[str] = set()  # being persisted by a tier: retention skips them
        # references read from kept checkpoints' indexes, by name (engine/references.py)
        self._refs: dict[str, frozenset[tuple[str, str]]] = {}
        # held data this keeper collected, with the files it kept: retired again only
        # once fewer of them are referenced
        self._retired: dict[str, frozenset[str]] = {}
        self._state = self.recover()

    # -- what is recorded -------------------------------------------------------------
    @property
    def directory(self) -> str:
        """The URL of the run directory."""
        return self.store.url(self.path)

    @property
    def checkpoints(self) -> list[str]:
        """Paths of the kept checkpoints subject to retention, oldest first."""
        return [self.url(e.name) for e in self._state.active]

    @property
    def preserved_checkpoints(self) -> list[str]:
        """Paths kept forever by ``keep_checkpoint_every_n_hours``."""
        return [self.url(e.name) for e in self._state.preserved]

    @property
    def latest_checkpoint(self) -> str | None:
        """The checkpoint saved last (TensorFlow's rule)."""
        latest = self._state.latest
        return None if latest is None else self.url(latest)

    @property
    def latest_name(self) -> str | None:
        return self._state.latest

    def entries(self) -> list[Entry]:
        """Every recorded checkpoint, kept or preserved."""
        return self._state.active + self._state.preserved

    def entry(self, name: str) -> Entry | None:
        return next((e for e in self.entries() if e.name == name), None)

    def url(self, name: str) -> str:
        return self.store.url(self.store.join(self.path, name))

    def step_of(self, name: str) -> int:
        return parse_step(name, self.name) or 0

    def pin(self, name: str) -> None:
        """Retention skips ``name`` until ``unpin`` (a tier is persisting it)."""
        self._pinned.add(name)

    def unpin(self, name: str) -> None:
        self._pinned.discard(name)

    # -- recovery ---------------------------------------------------------------------
    def recover(self) -> ManagerState:
        self._refs, self._retired = {}, {}  # another writer may have saved since
        return recover_state(self.store, self.path, self.name, self._clock, tensorflow=True)

    def reload(self) -> None:
        """Reads the list again from the directory (after another writer changed it)."""
        self._state = self.recover()

    def cleanup_leftovers(self) -> None:
        """Finishes interrupted deletions and removes never-committed checkpoints."""
        committed = committed_steps(self.store, self.path, self.name, tensorflow=True)
        uncommit(self.store, self.path, self._state.deleting)  # all first: engine/references.py
        for name in list(self._state.deleting):
            self._delete(name)
        keep = {e.name for e in self.entries()}
        # a save or persist that died before any of its objects was complete left only
        # unfinished uploads there: that directory is never committed too
        entries = sorted(set(self.store.listdir(self.path)) | set(self.store.unfinished(self.path)))
        for entry in entries:
            if parse_step(entry, self.name) is not None and entry not in committed \
                    and entry not in keep and entry not in self._state.deleting:
                # never committed, or held data whose record was lost: data that kept
                # checkpoints reference stays (then it is collected like held data)
                if not retire(self.store, self.path, entry, self.held()):
                    self._state.deleting.append(entry)
            elif entry.startswith(".pyckpt-manager.") and ".tmp-" in entry:
                # temp file of a state/lock write interrupted by a crash (we hold the lease)
                self.store.remove(self.path, [self.store.join(self.path, entry)])
        self.cleaned = True

    def begin_writing(self) -> None:
        """Step 3: checks or takes the writer lease and marks a save in flight. A lease
        taken now (from nobody, a dead holder or an older keeper of this process)
        means another one may have saved since this one read the directory: the
        state is read again (keeping this keeper's keep_checkpoint_every_n_hours
        anchor when the directory has no state of its name yet)."""
        begun = self.lease.begin()
        if begun == "held":
            return
        try:
            fresh = self.recover()
            stored = read_state(self.store, self.path)
            if stored is None or stored.checkpoint_name != self.name:
                fresh.last_preserved_time = self._state.last_preserved_time
            self._state = fresh
            if begun == "taken over":
                warnings.warn(
                    f"CheckpointManager of {self.directory} takes the directory over from an "
                    "older CheckpointManager of this process that still exists (still "
                    "referenced: by a variable, a list, a notebook's output history...). Its "
                    "saves now raise ConcurrentWriterError. close() the old manager, or create "
                    "managers with `with`, to end it cleanly.", stacklevel=4)
        except BaseException:  # (also a warning turned into an error) no save is in flight
            self.lease.end()
            raise

    def warn_if_below(self, number: int) -> None:
        """Numbering at or below an existing checkpoint is allowed (TensorFlow does it),
        but it is almost always a run that forgot to restore first."""
        steps = [e.step for e in self.entries()]
        if steps and number <= max(steps):
            warnings.warn(
                f"CheckpointManager of {self.directory} saves {self.name}-{number} although "
                f"{self.name}-{max(steps)} exists: it becomes the latest checkpoint and the "
                "older ones are retired first. Restore before training on "
                "(manager.restore_or_initialize()) to continue the run's numbering.",
                stacklevel=5)  # CheckpointManager.save -> save -> _save_numbered -> here

    def roll_back(self, name: str, error: BaseException) -> None:
        """After a failed save: the checkpoint does not count. Removes its directory
        unless a committed checkpoint of that name already existed (a re-save)."""
        path = self.store.join(self.path, name)
        if not self.store.answering():  # no request now: the next save removes it
            if self.entry(name) is None and name not in self._state.deleting:
                self._state.deleting.append(name)
            add_note(error, f"{self.url(name)} was not saved by this call; the store stopped "
                            "answering, so whatever the save left there is removed after "
                            "the next save that succeeds")
            return
        try:  # best effort: the save's own error is what the caller sees
            committed = self.store.exists(self.store.join(path, INDEX_NAME))
        except OSError as e:
            add_note(error, f"{self.url(name)} was not saved by this call; whether a "
                            f"committed checkpoint of that name exists could not be checked "
                            f"({e}): it is left as it is")
            return
        if not committed:
            try:
                self.store.remove_tree(self.path, path)
            except OSError:
                pass
        add_note(error, f"{self.url(name)} was not saved by this call: "
                 + ("a committed checkpoint of that name exists and was left in place"
                    if committed else "nothing of it was left on storage"))

    def remove_uncommitted(self, name: str) -> None:
        """Best effort: removes ``<name>`` (files uploaded by a failed persist) unless a
        checkpoint of that name is committed. While the store is not answering, no
        request: what is left there is removed by the next persist of that name (its
        commit's sweep) or the next manager's first cleanup."""
        path = self.store.join(self.path, name)
        if not self.store.answering():
            return
        try:
            if committed_manifest(self.store, path) is None:
                self.store.remove_tree(self.path, path)
        except OSError:
            pass

    # -- commits from elsewhere (tiers) ---------------------------------------------------
    def adopt(self, name: str, number: int, metrics: dict | None,
              commit: Callable[[str], Any], uploaded: bool = False) -> None:
        """Records ``<name>`` once ``commit(path)`` committed it here, under the lease, as a
        save would; a failed commit is rolled back. A copy of a local tier's checkpoint
        is made after the first-save cleanup; ``uploaded``: its files are here already
        (every worker uploaded its own), so the cleanup follows the commit."""
        self.store.makedirs(self.path)
        self.begin_writing()
        try:
            if not self.cleaned and not uploaded:
                self.cleanup_leftovers()
            try:
                commit(self.store.join(self.path, name))
            except BaseException as e:
                self.roll_back(name, e)
                raise
            if name in self._state.deleting:  # marked by an earlier failed try: committed now
                self._state.deleting.remove(name)
            if not self.cleaned:
                self.cleanup_leftovers()
            self.record(name, number, metrics)
        finally:
            self.lease.end()

    # -- recording and retiring -----------------------------------------------------------
    def record_collectively(self, comm: Communicator, name: str, number: int,
                            metrics: dict | None) -> None:
        """Multi-worker: rank 0 records and deletes; every worker updates its list the
        same way and returns only after rank 0 is done (or raises its error)."""
        outcome = None
        try:
            self.record(name, number, metrics, write=comm.rank == 0)
        except BaseException as e:
            outcome = f"{type(e).__name__}: {e}"
        outcome = comm.broadcast(outcome)
        if outcome is not None:
            raise CheckpointError(f"recording {name} failed on rank 0: {outcome}")

    def record(self, name: str, number: int, metrics: dict | None, write: bool = True) -> None:
        """After a commit: list it, then apply retention (``write``: also update the
        state file and delete; other workers of a multi-worker run only track)."""
        if write:
            self.lease.refresh()
        self._refs.pop(name, None)  # a re-save: its references are read anew
        st = self._state
        if name in st.deleting:  # committed anew (check_not_held let it): not being deleted
            st.deleting.remove(name)
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
            write_state(self.store, self.path, st)
            if st.deleting:
                uncommit(self.store, self.path, st.deleting)  # all first: engine/references.py
                for n in list(st.deleting):
                    self._delete(n)
                write_state(self.store, self.path, st)
        except (OSError, CheckpointError) as e:
            raise CheckpointIOError(
                getattr(e, "errno", None) or errno.EIO,
                f"{self.url(name)} was committed and counts: it is the latest checkpoint. "
                f"Recording it in the manager state or retiring old checkpoints failed "
                f"({type(e).__name__}: {e}); the next save or a new manager finishes that."
            ) from e

    def held(self) -> dict[str, set[str]]:
        """The files of other directories that kept checkpoints reference
        (engine/references.py): retention leaves them."""
        return held_files(self.store, self.path, [e.name for e in self.entries()], self._refs)

    def check_not_held(self, name: str) -> None:
        """Refuses to save over ``name`` while kept checkpoints reference its files."""
        if self.entry(name) is None and name not in self._state.deleting:
            return
        held = self.held().get(name)
        if held:
            raise ValueError(
                f"{self.url(name)} holds data that kept checkpoints of {self.directory} "
                f"reference ({len(held)} files, e.g. {sorted(held)[0]}): saving over it "
                "would change them. Save under a new number.")

    def _delete(self, name: str) -> None:
        """Un-commits (index first) and removes one checkpoint, except the files kept
        checkpoints reference (held data: the name stays marked, and each later
        retention collects what is no longer referenced); forgets the mark once
        nothing is left."""
        check_step_name(name, self.name)  # never a path: see run_directory.py
        self._refs.pop(name, None)
        held = self.held()
        keep = frozenset(held.get(name, ()))
        if keep and self._retired.get(name) == keep:
            return  # held data already collected down to what is still referenced
        if retire(self.store, self.path, name, held):  # pyckpt's or TensorFlow's
            self._retired.pop(name, None)
            if name in self._state.deleting:
                self._state.deleting.remove(name)
        else:
            self._retired[name] = keep
