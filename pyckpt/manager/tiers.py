"""Tiered checkpoints (docs/API.md section 13, docs/PROTOCOL.md section 7): every
save goes to a fast local directory; some of them are then copied, in the
background, to the durable directory (S3, GCS, any store).

Two run-directory keepers (``keeper.RunKeeper``) do the work, one per tier, each
with its own state file, writer lease and retention, driven through their public
methods; this module only decides which local checkpoint to persist and when,
runs the copy, and merges what both tiers hold.

Persist sequence (one background job, ``jobs.py``, at most one persist in flight):
 1. ``save`` commits ``<name>-<N>`` in the local tier (blocking or async, as any
    manager save); if the cadence says it is due and no persist is running, the
    checkpoint is *pinned* (local retention skips it) and the persist starts;
 2. the job waits for the local commit (an async local save), then copies the
    committed local checkpoint to ``<durable>/<name>-<N>`` through ``saving.copy``
    (a ``saving.CopyPlan``): read back from the local files with every chunk verified,
    written under a new attempt id, index last (the store's commit protocol);
 3. the durable manager records it and applies its own retention;
 4. the pin is released. An error is kept and raised by the next ``save``,
    ``wait_until_finished`` or ``close``; the next save persists again.
A persist never blocks the caller: when the next one is due while one is still
running, it is deferred to the first save after that one ends, or to
``wait_until_finished``/``close``, which persist the newest local checkpoint then.
It yields to saves: while a local save runs (``saving``), the copy pauses between
its windows (``CopyPlan.progress``), so that the training loop's stall is the local
save's alone and the upload uses the time between saves.
"""

from __future__ import annotations

import contextlib
import threading
import time
import warnings
from typing import Any, Callable, Iterator

from .. import jobs, saving
from ..checkpoint_reader import load_checkpoint
from ..errors import CheckpointError, CorruptCheckpointError, add_note
from .keeper import RunKeeper

class Tiers:
    """The local and the durable keeper of one tiered ``CheckpointManager``, and
    the background persist between them (see the module doc). It answers the calls
    of a ``CheckpointManager`` as one keeper does. ``persist_every`` and
    ``persist_interval_seconds``: the cadence, as the manager's ``LocalTierOptions``
    holds it (checked there, once: tiers are built from it only); neither: every
    save is persisted."""

    def __init__(self, local: RunKeeper, durable: RunKeeper,
                 persist_every: int | None, persist_interval_seconds: float | None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        if persist_every is None and persist_interval_seconds is None:
            persist_every = 1
        self.local = local
        self.durable = durable
        self._every = persist_every
        self._interval = persist_interval_seconds
        self._clock = clock
        self._since = 0  # local saves since the last persist started
        self._last_start = clock()
        self._job: jobs.Job | None = None  # the persist in flight (or ended, not joined)
        self._error: BaseException | None = None
        self._lock = threading.Lock()
        self._idle = threading.Event()  # set while no local save runs
        self._idle.set()

    # -- cadence ----------------------------------------------------------------------
    def _due(self) -> bool:
        if self._every is not None and self._since >= self._every:
            return True
        return self._interval is not None and self._clock() - self._last_start >= self._interval

    def busy(self) -> bool:
        """Whether a persist is running."""
        return self._job is not None and not self._job.done()

    @contextlib.contextmanager
    def saving(self) -> Iterator[None]:
        """While the block runs (a local save), the persist in flight pauses."""
        self._idle.clear()
        try:
            yield
        finally:
            self._idle.set()

    def yield_to_saves(self, *_: Any) -> None:
        """Called by the persist between windows: waits while a local save runs, its
        background part (``blocking=False``) included (bounded: a save that takes over
        10 minutes does not hold the persist)."""
        self._idle.wait(timeout=600)
        self.local.join(timeout=600)

    def before_save(self) -> None:
        """Called before each save: raises the error of a finished persist."""
        self.raise_error()

    def after_save(self, url: str) -> None:
        """Called once the local save of ``url`` returned (committed, or in flight in
        the background): starts its persist when the cadence says so."""
        self._since += 1
        if self.busy() or not self._due():
            return  # deferred: the first save after the running persist ends
        self.start(url)

    def start(self, url: str) -> None:
        """Pins the local checkpoint ``url`` and persists it in the background."""
        self.join()
        name = url.rstrip("/").rsplit("/", 1)[-1]
        self._since = 0
        self._last_start = self._clock()
        self.local.pin(name)

        def run() -> None:
            try:
                self._persist(name)
            except BaseException as e:  # surfaced at the next call on the manager
                self._since = self._every or 0  # due again at the next save
                self._last_start = float("-inf")
                add_note(e, f"persisting {url} to {self.durable.directory} failed (in the "
                            "background): the local checkpoint is intact; the next save "
                            "persists again")
                with self._lock:
                    self._error = e
            finally:
                self.local.unpin(name)

        # a job (jobs.py): a persist in flight at interpreter exit completes
        self._job = jobs.submit(run, "pyckpt-persist", lane=self)

    def _persist(self, name: str) -> None:
        """The background part: wait for the local commit, then copy and record."""
        self.local.join()  # an async local save in flight: its error stays there
        entry = self.local.entry(name)
        if entry is None:  # the local save failed: the local keeper reports it
            return
        d = self.durable
        d.check_not_held(name)
        # incremental runs: the durable tier references what its newest checkpoint holds
        base = d.base_for(name) if d.incremental else None
        local = self.local
        d.adopt(name, entry.step, entry.metrics, lambda path: saving.copy(saving.CopyPlan(
            local.store, local.store.join(local.path, name), local.storage_options,
            d.store, path, d.storage_options, progress=self.yield_to_saves, base=base)))

    def flush(self) -> None:
        """Waits for the persist in flight; then persists the newest local checkpoint
        if a persist came due while that one ran (it was deferred), and waits again.
        Raises the error of either."""
        self.wait()
        latest = self.local.latest_name
        if latest is None or not self._due() or self._since == 0:
            return
        if self.durable.entry(latest) is not None:
            return
        self.start(self.local.url(latest))
        self.wait()

    def join(self) -> None:
        """Waits for the persist in flight, keeping its error."""
        job = self._job
        if job is not None:
            job.join()
            self._job = None

    def raise_error(self) -> None:
        """Re-raises (once) the error of a finished persist."""
        with self._lock:
            err, self._error = self._error, None
        if err is not None:
            raise err

    def wait(self) -> None:
        """Waits for the persist in flight; raises its error."""
        self.join()
        self.raise_error()

    # -- the calls of a CheckpointManager ---------------------------------------------
    def save(self, checkpoint_number: Any = None, check_interval: bool = True,
             blocking: bool = True, metrics: dict | None = None) -> str | None:
        """Saves in the local tier; maybe persists in the background."""
        self.before_save()
        with self.saving():  # the persist in flight yields to this save
            saved = self.local.save(checkpoint_number, check_interval, blocking, metrics)
        if saved is not None:
            self.after_save(saved)
        return saved

    @property
    def directory(self) -> str:
        return self.durable.directory

    @property
    def checkpoints(self) -> list[str]:
        """Both tiers', by number, oldest first; at one number the durable copy first."""
        return [c[2] for c in reversed(self.candidates())]

    @property
    def preserved_checkpoints(self) -> list[str]:
        return self.durable.preserved_checkpoints

    @property
    def latest_checkpoint(self) -> str | None:
        found = self.candidates()
        return found[0][2] if found else None

    def wait_until_finished(self) -> None:
        """Waits for the local save and the persist in flight; raises their error."""
        self.local.wait_until_finished()
        self.flush()

    def close(self) -> None:
        try:
            self.wait_until_finished()
        finally:
            try:
                self.local.close()
            finally:
                self.durable.close()

    # -- both tiers -------------------------------------------------------------------
    def candidates(self) -> list[tuple[int, str, str]]:
        """(step, tier, url) of every checkpoint of both tiers, newest first; at one
        step the local copy comes first (it is faster to read)."""
        out = []
        for tier, m in (("local", self.local), ("durable", self.durable)):
            for e in m.entries():
                out.append((e.step, tier, m.url(e.name)))
        out.sort(key=lambda c: (-c[0], c[1] != "local"))
        return out

    def restore(self, checkpoint: Any) -> str | None:
        """Restores the newest checkpoint of either tier that verifies; falls back to
        the next one (the other tier's copy first) when one is missing or corrupt.
        Returns its path, or None when no tier holds one."""
        self.local.wait_until_finished()
        errors = []
        for _, tier, url in self.candidates():
            options = (self.local if tier == "local" else self.durable).storage_options
            try:
                if tier == "local":  # local reads are cheap: verify all before changing values
                    load_checkpoint(url, storage_options=options).verify()
                checkpoint.restore(url, storage_options=options)
                return url
            except (CorruptCheckpointError, OSError) as e:  # not a mismatch with the objects
                errors.append(f"{url}: {type(e).__name__}: {e}")
                warnings.warn(f"cannot restore {url} ({type(e).__name__}: {e}); "
                              "trying the next checkpoint", stacklevel=3)
        if errors:
            raise CheckpointError("no checkpoint of either tier could be restored:\n"
                                  + "\n".join(errors))
        return None
