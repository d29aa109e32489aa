"""The CheckpointManager's small state file, kept in the manager's directory
(docs/PROTOCOL.md, "Manager state"). Only the parts other modules need to read
live here; the manager owns writing it."""

from __future__ import annotations

import json

from .storage import Store

STATE_NAME = "pyckpt-manager.json"


def read_state(store: Store, directory: str) -> dict | None:
    try:
        data = store.read_bytes(store.join(directory, STATE_NAME))
    except (FileNotFoundError, OSError):
        return None
    try:
        doc = json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, ValueError):
        return None
    return doc if isinstance(doc, dict) else None


def read_checkpoint_name(store: Store, directory: str) -> str | None:
    state = read_state(store, directory)
    name = state.get("checkpoint_name") if state else None
    return name if isinstance(name, str) and name else None
