"""Choosing and renaming checkpoint keys: ``select`` (exact keys, subtree prefixes,
glob patterns) and ``key_map`` (a dict or a callable; None drops a key), shared by
``pyckpt.load`` and the exports (``interop.safetensors.export_hf``)."""

from __future__ import annotations

import fnmatch
from typing import Any, Callable, Iterable, Mapping

from .errors import CheckpointKeyError
from .tree import validate_key

__all__ = ["select_keys", "map_keys"]


def _is_pattern(s: str) -> bool:
    return any(c in s for c in "*?[")


def select_keys(keys: list[str], select: Any) -> list[str]:
    """Keys matching ``select``: exact keys (an exact match wins over reading an entry
    as a pattern, so a key with ``*``, ``?`` or ``[`` in it can be picked by name),
    subtree prefixes or glob patterns."""
    if isinstance(select, str):
        select = [select]
    wanted: set[str] = set()
    missing = []
    exact = set(keys)
    for s in select:
        if not isinstance(s, str):
            raise TypeError(f"select entries must be strings, got {s!r}")
        if s in exact:  # an exact key wins, glob characters in it or not
            hits = [s]
        elif _is_pattern(s):
            hits = [k for k in keys if fnmatch.fnmatchcase(k, s)]
        else:
            prefix = s.rstrip("/") + "/"
            hits = [k for k in keys if k.startswith(prefix)]
        if not hits:
            missing.append(s)
        wanted.update(hits)
    if missing:
        raise CheckpointKeyError(f"select matched no key for: {', '.join(map(repr, missing))}")
    return [k for k in keys if k in wanted]


def map_keys(keys: Iterable[str], key_map: Any) -> dict[str, str]:
    """checkpoint key -> target key (keys mapped to None are dropped)."""
    out: dict[str, str] = {}
    if key_map is None:
        return {k: k for k in keys}
    fn: Callable[[str], Any]
    if isinstance(key_map, Mapping):
        fn = lambda k: key_map.get(k, k)  # noqa: E731
    elif callable(key_map):
        fn = key_map
    else:
        raise TypeError("key_map must be a dict or a callable")
    targets: dict[str, str] = {}
    for k in keys:
        t = fn(k)
        if t is None:
            continue
        validate_key(t)
        if t in targets:
            raise ValueError(f"key_map maps both {targets[t]!r} and {k!r} to {t!r}")
        targets[t] = k
        out[k] = t
    return out
