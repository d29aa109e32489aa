"""Counting the calls of a function for the length of one test."""

from __future__ import annotations

from typing import Any


def count_calls(monkeypatch: Any, owner: Any, name: str) -> list[int]:
    """Replaces ``owner.name`` (undone by pytest's ``monkeypatch``) with a wrapper that
    appends 1 to the returned list at every call, then calls the original."""
    real = getattr(owner, name)
    calls: list[int] = []

    def counted(*args: Any, **kwargs: Any) -> Any:
        calls.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(owner, name, counted)
    return calls
