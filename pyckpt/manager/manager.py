"""``pyckpt.CheckpointManager`` (docs/API.md sections 3 and 13): the public face of
a run directory's keeper (``keeper.py``: numbering, writer lease, records,
retention, crash recovery; the save sequence is docs/PROTOCOL.md section 3), or,
with a local tier, of two keepers composed by ``tiers.py`` (one worker) or
``node_tiers.py`` (several workers, each with a node-local tier). Every save
mode is ``saving``'s: blocking or in the background, one worker or many. Its
options beyond the positional signature are ``options.py``'s objects.
"""

from __future__ import annotations

from typing import Any, Callable

from ..workers.comm import resolve_comm
from .keeper import RunKeeper
from .node_tiers import NodeTiers
from .options import CheckpointManagerOptions, from_keywords
from .tiers import Tiers


def _check_options(checkpoint: Any, max_to_keep: int | None, checkpoint_interval: int | None,
                   step_counter: Any) -> None:
    if not hasattr(checkpoint, "save_counter") or not hasattr(checkpoint, "write"):
        raise TypeError("CheckpointManager needs a pyckpt.Checkpoint")
    if max_to_keep is not None and max_to_keep < 1:
        raise ValueError("max_to_keep must be None or at least 1")
    if checkpoint_interval is not None and step_counter is None:
        raise ValueError("checkpoint_interval needs a step_counter")


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
    - ``options``: a ``CheckpointManagerOptions`` (``pyckpt.CheckpointManagerOptions``):
      background saves and device staging (``AsyncOptions``), a fast local tier in
      front of ``directory`` (``LocalTierOptions``), incremental saves
      (``IncrementalOptions``), the writer lease, the clock and the communicator of a
      multi-worker run. ``manager.options`` is the options in effect.
    - ``old_keywords``: the keyword-only arguments of earlier versions
      (``max_async_bytes``, ``max_pinned_bytes``, ``lease_seconds``, ``clock``,
      ``comm``, ``local_dir``, ``local_max_to_keep``, ``persist_every``,
      ``persist_interval_seconds``, ``replicate``, ``incremental``,
      ``full_save_every``) still work: each is deprecated (a DeprecationWarning
      naming the options field that replaces it) and sets that field;
      ``ValueError`` when ``options`` sets the same field too.

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
                 storage_options: dict | None = None, *,
                 options: CheckpointManagerOptions | None = None, **old_keywords: Any) -> None:
        _check_options(checkpoint, max_to_keep, checkpoint_interval, step_counter)
        if options is not None and not isinstance(options, CheckpointManagerOptions):
            raise TypeError(f"options must be a pyckpt.CheckpointManagerOptions, not "
                            f"{options!r}")
        if old_keywords or options is None:
            options = from_keywords(options, old_keywords)
        self._options = options
        self._checkpoint = checkpoint
        self._init_fn = init_fn
        staging = options.async_options
        inc = options.incremental  # None: full saves (full_save_every then means nothing)
        incremental: dict[str, Any] = dict(
            incremental=inc is not None, full_save_every=10 if inc is None else inc.full_save_every)
        durable: dict[str, Any] = dict(keep_checkpoint_every_n_hours=keep_checkpoint_every_n_hours,
                       checkpoint_name=checkpoint_name, best_fn=best_fn, best_mode=best_mode,
                       storage_options=storage_options, lease_seconds=options.lease_seconds,
                       clock=options.clock, comm=options.comm)
        self._tiers: Tiers | None = None
        tier = options.local_tier
        if tier is None:
            self._keeper: RunKeeper | Tiers = RunKeeper(
                checkpoint, directory, max_to_keep, step_counter=step_counter,
                checkpoint_interval=checkpoint_interval,
                max_async_bytes=staging.max_async_bytes,
                max_pinned_bytes=staging.max_pinned_bytes,
                max_device_snapshot_bytes=staging.max_device_snapshot_bytes, **incremental,
                **durable)
            return
        c = resolve_comm(options.comm)
        world = 1 if c is None else c.world_size
        options.check_world(world)
        several = world > 1
        local = RunKeeper(checkpoint, tier.directory, tier.max_to_keep,
                          checkpoint_name=checkpoint_name, step_counter=step_counter,
                          checkpoint_interval=checkpoint_interval,
                          max_async_bytes=staging.max_async_bytes,
                          lease_seconds=options.lease_seconds, clock=options.clock,
                          comm=options.comm, node_local=tier.replicate if several else None,
                          max_pinned_bytes=staging.max_pinned_bytes,
                          max_device_snapshot_bytes=staging.max_device_snapshot_bytes,
                          **incremental)
        # the durable tier only receives copies: no staging buffers
        kept = RunKeeper(checkpoint, directory, max_to_keep, max_async_bytes=0, **incremental,
                         **durable)
        every, interval = tier.persist_every, tier.persist_interval_seconds
        self._tiers = (NodeTiers(local, kept, every, interval, c) if several and c is not None
                       else Tiers(local, kept, every, interval))
        self._keeper = self._tiers

    @property
    def options(self) -> CheckpointManagerOptions:
        """The options in effect (``options=`` with any deprecated keywords folded in)."""
        return self._options

    @property
    def directory(self) -> str:
        """The URL of the managed directory (tiered: the durable one)."""
        return self._keeper.directory

    @property
    def checkpoint(self) -> Any:
        """The Checkpoint this manager saves."""
        return self._checkpoint

    @property
    def checkpoints(self) -> list[str]:
        """Paths of the kept checkpoints subject to retention, oldest first (tiered:
        of both tiers, by number; at one number the durable copy first)."""
        return self._keeper.checkpoints

    @property
    def preserved_checkpoints(self) -> list[str]:
        """Paths kept forever by ``keep_checkpoint_every_n_hours``."""
        return self._keeper.preserved_checkpoints

    @property
    def latest_checkpoint(self) -> str | None:
        """The checkpoint saved last (TensorFlow's rule; ``pyckpt.latest_checkpoint``
        of the directory says the same). Tiered: the newest of either tier."""
        return self._keeper.latest_checkpoint

    def save(self, checkpoint_number: Any = None, check_interval: bool = True,
             blocking: bool = True, metrics: dict | None = None) -> str | None:
        """Saves a new numbered checkpoint; returns its path, or None when the step
        interval says it is too soon. With ``blocking=False`` it returns once the
        state is copied to host memory and finishes in the background."""
        return self._keeper.save(checkpoint_number, check_interval, blocking, metrics)

    @property
    def last_staging(self) -> Any:
        """How the last ``save(blocking=False)`` copied the state aside (a
        ``StagingReport``: route, device and pinned bytes held, seconds the call
        blocked; tiered: the local tier's), or None before one."""
        keeper = self._tiers.local if self._tiers is not None else self._keeper
        return getattr(keeper, "last_staging", None)

    def wait_until_finished(self) -> None:
        """Waits for an async save (tiered: and the persist in flight); raises its error
        if it failed."""
        self._keeper.wait_until_finished()

    def restore_or_initialize(self) -> str | None:
        """Restores the latest checkpoint and returns its path; else runs init_fn
        (if any) and returns None. Tiered: the newest checkpoint of either tier that
        verifies, falling back to older ones and to the other tier."""
        restored = self._keeper.restore(self._checkpoint)
        if restored is None and self._init_fn is not None:
            self._init_fn()
        return restored

    def close(self) -> None:
        """Waits for pending work, frees the staging buffers of async saves (pinned
        memory for device values) and gives up the writer lease."""
        self._keeper.close()

    def __enter__(self) -> "CheckpointManager":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __repr__(self) -> str:
        if self._tiers is not None:
            return (f"<CheckpointManager {self.directory!r} with local tier "
                    f"{self._tiers.local.directory!r}: latest {self.latest_checkpoint!r}>")
        return (f"<CheckpointManager {self.directory!r}: {len(self.checkpoints)} kept, "
                f"latest {self.latest_checkpoint!r}>")
