"""Which checkpoints a manager keeps (docs/PROTOCOL.md, "Retention").

- By recency (TensorFlow's rule): the newest ``max_to_keep`` stay active.
- ``keep_checkpoint_every_n_hours``: a checkpoint leaving the active set is
  preserved forever when at least that long passed since the last preserved one.
- By metric (``best_fn``, like orbax): the ``max_to_keep`` best scores stay,
  ``best_mode`` "max" or "min"; checkpoints saved without metrics rank below
  every scored one (oldest first). The newest checkpoint is always kept, even
  when its score is poor, so a restart resumes from the latest state: up to
  ``max_to_keep + 1`` checkpoints can then be active.
"""

from __future__ import annotations

from typing import Any, Callable

from ..run_directory import Entry


def select_removals(active: list[Entry], max_to_keep: int | None,
                    best_fn: Callable[[dict], float] | None, best_mode: str) -> list[Entry]:
    """Entries of ``active`` (oldest first) that leave the active set."""
    if max_to_keep is None or len(active) <= max_to_keep:
        return []
    newest = active[-1]
    if best_fn is None:
        return active[: len(active) - max_to_keep]

    def score(e: Entry) -> tuple[int, float]:
        if e.metrics is None:
            return (0, 0.0)
        s = float(best_fn(e.metrics))
        return (1, s if best_mode == "max" else -s)

    ranked = sorted(active, key=lambda e: (score(e), e.step), reverse=True)
    keep = {id(e) for e in ranked[:max_to_keep]} | {id(newest)}
    return [e for e in active if id(e) not in keep]


def preserve(entry: Entry, last_preserved_time: float, every_n_hours: float | None) -> bool:
    """TensorFlow's rule: preserved when saved at least n hours after the last
    preserved checkpoint (the manager's creation time when there is none yet)."""
    if every_n_hours is None:
        return False
    return entry.time - every_n_hours * 3600.0 >= last_preserved_time


def check_mode(best_mode: Any) -> str:
    """``best_mode`` when it is "max" or "min"; else ValueError."""
    if best_mode not in ("max", "min"):
        raise ValueError(f"best_mode must be 'max' or 'min', got {best_mode!r}")
    return best_mode
