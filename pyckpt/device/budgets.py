"""The checks of the two device-memory budgets a save takes: ``max_pinned_bytes``
(pinned host memory, ``buffers.py``/``ring.py``) and ``max_device_snapshot_bytes``
(device memory for a snapshot, ``snapshot.py``); options and plans call them once."""

from __future__ import annotations

from typing import Any

__all__ = ["check_budget", "check_device_budget"]


def check_budget(max_pinned_bytes: Any) -> int | None:
    """``max_pinned_bytes`` itself: None or a positive int; ValueError otherwise."""
    if max_pinned_bytes is not None and (isinstance(max_pinned_bytes, bool) or
                                         not isinstance(max_pinned_bytes, int) or
                                         max_pinned_bytes <= 0):
        raise ValueError(f"max_pinned_bytes must be a positive int (bytes) or None, got "
                         f"{max_pinned_bytes!r}")
    return max_pinned_bytes


def check_device_budget(max_device_snapshot_bytes: Any) -> int | None:
    """``max_device_snapshot_bytes`` itself: None or an int >= 0; ValueError otherwise."""
    v = max_device_snapshot_bytes
    if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v < 0):
        raise ValueError(f"max_device_snapshot_bytes must be None (automatic), 0 (never) or a "
                         f"number of bytes, not {v!r}")
    return v
