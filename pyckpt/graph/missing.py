"""``MISSING``: the marker of an absent child in the graph protocol
(``_pyckpt_get_child``), distinct from every value, None included."""

from __future__ import annotations

from typing import Any

__all__ = ["MISSING"]


class _Missing:
    def __repr__(self) -> str:
        return "MISSING"


MISSING: Any = _Missing()
