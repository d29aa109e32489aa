"""The CheckpointManager's state file ``pyckpt-manager.json`` (docs/PROTOCOL.md,
"Manager state"), kept in the manager's directory and always replaced
atomically. Paths in it are relative to the directory, so a copied or moved
directory keeps working."""

from __future__ import annotations

import dataclasses
import json
from typing import Any

from ..storage import Store

STATE_NAME = "pyckpt-manager.json"
STATE_VERSION = 1


@dataclasses.dataclass
class Entry:
    """One checkpoint the manager knows about."""

    name: str                     # "<checkpoint_name>-<N>", relative to the directory
    step: int                     # N
    time: float                   # commit time (seconds since the epoch)
    metrics: dict | None = None   # as given to save(metrics=...)

    def to_json(self) -> dict:
        d: dict[str, Any] = {"name": self.name, "step": self.step, "time": self.time}
        if self.metrics is not None:
            d["metrics"] = self.metrics
        return d

    @classmethod
    def from_json(cls, d: Any) -> "Entry | None":
        if not isinstance(d, dict):
            return None
        name, step, t = d.get("name"), d.get("step"), d.get("time")
        if not isinstance(name, str) or type(step) is not int or not isinstance(t, (int, float)):
            return None
        metrics = d.get("metrics")
        return cls(name, step, float(t), metrics if isinstance(metrics, dict) else None)


@dataclasses.dataclass
class ManagerState:
    checkpoint_name: str
    active: list[Entry] = dataclasses.field(default_factory=list)      # retention applies
    preserved: list[Entry] = dataclasses.field(default_factory=list)   # kept forever
    deleting: list[str] = dataclasses.field(default_factory=list)      # names being deleted
    last_preserved_time: float | None = None

    def to_json(self) -> dict:
        return {
            "format": "pyckpt-manager",
            "version": STATE_VERSION,
            "checkpoint_name": self.checkpoint_name,
            "checkpoints": [e.to_json() for e in self.active],
            "preserved": [e.to_json() for e in self.preserved],
            "deleting": list(self.deleting),
            "last_preserved_time": self.last_preserved_time,
        }

    @classmethod
    def from_json(cls, doc: dict, default_name: str) -> "ManagerState":
        def entries(raw: Any) -> list[Entry]:
            out = [Entry.from_json(x) for x in raw] if isinstance(raw, list) else []
            return [e for e in out if e is not None]

        name = doc.get("checkpoint_name")
        lpt = doc.get("last_preserved_time")
        deleting = doc.get("deleting")
        return cls(
            checkpoint_name=name if isinstance(name, str) and name else default_name,
            active=entries(doc.get("checkpoints")),
            preserved=entries(doc.get("preserved")),
            deleting=[d for d in deleting if isinstance(d, str)] if isinstance(deleting, list) else [],
            last_preserved_time=float(lpt) if isinstance(lpt, (int, float)) else None,
        )


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


def write_state(store: Store, directory: str, state: ManagerState) -> None:
    body = json.dumps(state.to_json(), indent=1, allow_nan=False).encode("utf-8")
    store.write_atomic(store.join(directory, STATE_NAME), body)


def read_checkpoint_name(store: Store, directory: str) -> str | None:
    state = read_state(store, directory)
    name = state.get("checkpoint_name") if state else None
    return name if isinstance(name, str) and name else None
