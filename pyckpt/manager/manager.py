"""``pyckpt.CheckpointManager`` (docs/API.md sections 3 and 13): the public face of
a run directory's keeper (``keeper.py``: numbering, writer lease, records,
retention, crash recovery; the save sequence is docs/PROTOCOL.md section 3), or,
with ``local_dir``, of two keepers composed by ``tiers.py`` (one worker) or
``node_tiers.py`` (several workers, each with a node-local tier). Every save
mode is ``saving``'s: blocking or in the background, one worker or many.
"""

from __future__ import annotations

import time
from typing import Any, Callable

from ..device.buffers import check_budget
from ..workers.comm import Communicator, resolve_comm
from .keeper import RunKeeper
from .node_tiers import NodeTiers
from .tiers import Tiers


def _check_options(checkpoint: Any, max_to_keep: int | None, checkpoint_interval: int | None,
                   step_counter: Any, full_save_every: int | None) -> None:
    if not hasattr(checkpoint, "save_counter") or not hasattr(checkpoint, "write"):
        raise TypeError("CheckpointManager needs a pyckpt.Checkpoint")
    if max_to_keep is not None and max_to_keep < 1:
        raise ValueError("max_to_keep must be None or at least 1")
    if checkpoint_interval is not None and step_counter is None:
        raise ValueError("checkpoint_interval needs a step_counter")
    if full_save_every is not None and (type(full_save_every) is not int
                                        or full_save_every < 1):
        raise ValueError(f"full_save_every must be None or an integer >= 1, not "
                         f"{full_save_every!r}")


def _check_incremental(comm: Communicator | None, local_dir: Any) -> None:
    """Incremental saves exist for every mode but node-local tiers (so far)."""
    c = resolve_comm(comm)
    if local_dir is not None and c is not None and c.world_size > 1:
        raise NotImplementedError(
            "incremental=True is not supported yet with local_dir in a multi-worker job "
            "(node-local tiers): use one or the other (docs/API.md section 18)")


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
    - ``max_pinned_bytes``: device values are staged through a ring of at most this
      much pinned memory per device, not a pinned copy of the whole state
      (docs/API.md section 10; single-process saves to local files).
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
    - ``incremental``: each save writes only the tensors that changed since the
      checkpoint saved last and references that one's data for the rest (docs/API.md
      section 18); ``full_save_every``: every how many saves one is full (None: only
      when most of the data changed).

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
                 persist_interval_seconds: float | None = None, replicate: int = 0,
                 incremental: bool = False, full_save_every: int | None = 10,
                 max_pinned_bytes: int | None = None) -> None:
        _check_options(checkpoint, max_to_keep, checkpoint_interval, step_counter,
                       full_save_every)
        check_budget(max_pinned_bytes)
        if incremental:
            _check_incremental(comm, local_dir)
        self._checkpoint = checkpoint
        self._init_fn = init_fn
        durable: dict[str, Any] = dict(keep_checkpoint_every_n_hours=keep_checkpoint_every_n_hours,
                       checkpoint_name=checkpoint_name, best_fn=best_fn, best_mode=best_mode,
                       storage_options=storage_options, lease_seconds=lease_seconds,
                       clock=clock, comm=comm)
        self._tiers: Tiers | None = None
        if local_dir is None:
            if persist_every is not None or persist_interval_seconds is not None or replicate:
                raise ValueError("persist_every, persist_interval_seconds and replicate need a "
                                 "local_dir")
            self._keeper: RunKeeper | Tiers = RunKeeper(
                checkpoint, directory, max_to_keep, step_counter=step_counter,
                checkpoint_interval=checkpoint_interval, max_async_bytes=max_async_bytes,
                incremental=incremental, full_save_every=full_save_every,
                max_pinned_bytes=max_pinned_bytes, **durable)
            return
        if local_max_to_keep is not None and local_max_to_keep < 1:
            raise ValueError("local_max_to_keep must be None or at least 1")
        c = resolve_comm(comm)
        world = 1 if c is None else c.world_size
        several = world > 1
        if several and not 0 <= replicate < world:
            raise ValueError(f"replicate must be between 0 and {world - 1} "
                             f"(the other workers), not {replicate}")
        if replicate and not several:
            raise ValueError("replicate needs a multi-worker job (comm)")
        local = RunKeeper(checkpoint, local_dir, local_max_to_keep,
                          checkpoint_name=checkpoint_name, step_counter=step_counter,
                          checkpoint_interval=checkpoint_interval,
                          max_async_bytes=max_async_bytes, lease_seconds=lease_seconds,
                          clock=clock, comm=comm, node_local=replicate if several else None,
                          incremental=incremental, full_save_every=full_save_every,
                          max_pinned_bytes=max_pinned_bytes)
        # the durable tier only receives copies: no staging buffers
        kept = RunKeeper(checkpoint, directory, max_to_keep, max_async_bytes=0,
                         incremental=incremental, full_save_every=full_save_every, **durable)
        self._tiers = (NodeTiers(local, kept, persist_every, persist_interval_seconds, c)
                       if several and c is not None
                       else Tiers(local, kept, persist_every, persist_interval_seconds))
        self._keeper = self._tiers

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
