"""Multi-worker saves over an existing distributed engine (API.md section 6)."""

from __future__ import annotations

from typing import Any


def resolve_comm(comm: Any) -> Any:
    """The communicator to use: the one given, else None (single process)."""
    return comm
