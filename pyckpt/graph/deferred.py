"""Restore-on-create: values of a restore whose objects do not exist yet.

When a restore finds a checkpoint edge ``name`` under a live object that has
no such attribute/element yet, it records a pending entry on that object.
The moment a value is assigned under that name (attribute assignment on a
Trackable, append / item assignment on a tracked list or dict), the pending
checkpoint subtree is matched against the new value and restored.

Memory policy: a pending entry holds the restore session (the checkpoint's
manifest and location, or the Snapshot it came from), never copies of
tensor data; checkpoint values are read at the moment their object appears.
Entries are dropped once applied, when a newer restore registers the same
name on the same object (the newest restore wins), and with the object that
holds them. A Snapshot used for a restore stays alive while values of it are
pending.
"""

from __future__ import annotations

from typing import Any

_ATTR = "_pyckpt_pending"


def _table(obj: Any, create: bool) -> dict | None:
    try:
        table = obj.__dict__.get(_ATTR)
    except AttributeError:
        return None
    if table is None and create:
        table = {}
        obj.__dict__[_ATTR] = table
    return table


def add(obj: Any, name: str, session: Any, node: int) -> tuple[Any, str, Any] | None:
    """Registers a pending value subtree; returns what ``undo`` needs to take it back
    (the entry it replaced included), or None when obj cannot hold one."""
    table = _table(obj, create=True)
    if table is None:
        return None
    before = table.get(name)
    table[name] = (session, node)
    return obj, name, before


def undo(added: list[tuple[Any, str, Any]]) -> None:
    """Takes back entries ``add`` registered (newest first), putting back those they
    replaced: a restore that failed leaves nothing pending of its own."""
    for obj, name, before in reversed(added):
        table = _table(obj, create=False)
        if table is None:
            continue
        if before is None:
            table.pop(name, None)
        else:
            table[name] = before


def apply(obj: Any, name: str, value: Any) -> None:
    """Called after ``value`` was assigned under ``name``: restores what is pending."""
    table = _table(obj, create=False)
    if not table:
        return
    entry = table.pop(name, None)
    if entry is not None:
        session, node = entry
        try:
            session.restore_subtree(value, node, parent=obj, name=name)
        except BaseException:  # not restored (a shape mismatch...): still pending, for
            table.setdefault(name, entry)  # a value that fits, assigned later
            raise


def pending(obj: Any) -> dict:
    """``{name: (session, stored node)}`` of what is pending on obj (empty when nothing)."""
    return _table(obj, create=False) or {}


def discard(obj: Any, session: Any) -> None:
    """Forgets the entries of one session (when it is superseded)."""
    table = _table(obj, create=False)
    if table:
        for name in [n for n, (s, _) in table.items() if s is session]:
            del table[name]
