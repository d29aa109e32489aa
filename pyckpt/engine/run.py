"""A run directory: numbered checkpoints ``<name>-<N>`` and the manager's state
file ``pyckpt-manager.json`` (docs/PROTOCOL.md, "Manager state"). This module is
the one step scanner: the manager, the reader, ``latest_checkpoint`` and
``pyckpt ls`` find a directory's checkpoints and its latest one here.

The state file is kept in the directory and always replaced atomically. Paths
in it are relative to the directory, so a copied or moved directory keeps
working.

The file is input from storage like any other: the manager deletes what its
``deleting`` list names. So every name in it must be ``<checkpoint_name>-<N>``,
a checkpoint directly inside the directory; anything else (``../victim``, an
absolute path, ``""``, ``.``) makes ``read_state`` raise
CorruptCheckpointError before anything is read or deleted."""

from __future__ import annotations

import dataclasses
import json
import time
from typing import Any, Callable

from ..errors import CorruptCheckpointError
from ..storage import Store
from ..format import INDEX_NAME

STATE_NAME = "pyckpt-manager.json"
STATE_VERSION = 1
DEFAULT_NAME = "ckpt"


def check_checkpoint_name(name: object, what: str = "checkpoint_name") -> str:
    """A ``<name>`` of ``<name>-<N>`` checkpoints: one plain directory entry, never a
    path (so that ``<name>-<N>`` always stays directly inside its directory)."""
    if (not isinstance(name, str) or not name or name in (".", "..") or "/" in name
            or "\\" in name or "\0" in name):
        raise ValueError(f"invalid {what} {name!r}: it must be a plain name, not a path")
    return name


def parse_step(name: str, prefix: str) -> int | None:
    """N for a name ``<prefix>-<N>``, else None."""
    if not name.startswith(prefix + "-"):
        return None
    tail = name[len(prefix) + 1:]
    if not tail.isdigit() or not tail.isascii():
        return None
    return int(tail)


@dataclasses.dataclass
class Entry:
    """One checkpoint the manager knows about."""

    name: str                     # "<checkpoint_name>-<N>", relative to the directory
    step: int                     # N
    time: float                   # commit time (seconds since the epoch)
    metrics: dict | None = None   # as given to save(metrics=...)

    def to_json(self) -> dict:
        """The entry as the state file stores it (``metrics`` only when set)."""
        d: dict[str, Any] = {"name": self.name, "step": self.step, "time": self.time}
        if self.metrics is not None:
            d["metrics"] = self.metrics
        return d

    @classmethod
    def from_json(cls, d: Any, checkpoint_name: str) -> "Entry":
        """Raises ValueError unless d is an entry naming ``<checkpoint_name>-<step>``."""
        if not isinstance(d, dict):
            raise ValueError(f"entry {d!r} is not an object")
        name, step, t = d.get("name"), d.get("step"), d.get("time")
        if not isinstance(name, str) or type(step) is not int or not isinstance(t, (int, float)):
            raise ValueError(f"entry {d!r} lacks a string name, an integer step or a time")
        check_step_name(name, checkpoint_name)
        if parse_step(name, checkpoint_name) != step:
            raise ValueError(f"entry {name!r} has step {step}")
        metrics = d.get("metrics")
        return cls(name, step, float(t), metrics if isinstance(metrics, dict) else None)


def check_step_name(name: Any, checkpoint_name: str, where: str = "name") -> str:
    """``name`` if it is ``<checkpoint_name>-<N>``; else ValueError."""
    if not isinstance(name, str) or parse_step(name, checkpoint_name) is None:
        raise ValueError(f"{where} {name!r} is not a checkpoint of this run (expected "
                         f"'{checkpoint_name}-<N>' directly inside the directory)")
    return name


@dataclasses.dataclass
class ManagerState:
    """The contents of the state file: the checkpoints under retention (``active``,
    oldest first), those kept forever (``preserved``), names whose deletion is under
    way (``deleting``) and when a checkpoint was last preserved."""

    checkpoint_name: str
    active: list[Entry] = dataclasses.field(default_factory=list)      # retention applies
    preserved: list[Entry] = dataclasses.field(default_factory=list)   # kept forever
    deleting: list[str] = dataclasses.field(default_factory=list)      # names being deleted
    last_preserved_time: float | None = None

    @property
    def latest(self) -> str | None:
        """Name of the checkpoint saved last: TensorFlow's rule (the newest entry of the
        list, whatever its number), else the newest preserved one."""
        if self.active:
            return self.active[-1].name
        if self.preserved:
            return max(self.preserved, key=lambda e: e.time).name
        return None

    def to_json(self) -> dict:
        """The state file document (format ``pyckpt-manager``, version ``STATE_VERSION``)."""
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
    def from_json(cls, doc: dict) -> "ManagerState":
        """Validates a state document (ValueError naming the first bad field)."""
        name = check_checkpoint_name(doc.get("checkpoint_name"))

        def entries(field: str) -> list[Entry]:
            raw = doc.get(field, [])
            if not isinstance(raw, list):
                raise ValueError(f"'{field}' is not a list")
            try:
                return [Entry.from_json(x, name) for x in raw]
            except ValueError as e:
                raise ValueError(f"'{field}': {e}") from None

        deleting = doc.get("deleting", [])
        if not isinstance(deleting, list):
            raise ValueError("'deleting' is not a list")
        lpt = doc.get("last_preserved_time")
        return cls(
            checkpoint_name=name,
            active=entries("checkpoints"),
            preserved=entries("preserved"),
            deleting=[check_step_name(d, name, "'deleting'") for d in deleting],
            last_preserved_time=float(lpt) if isinstance(lpt, (int, float)) else None,
        )


def read_state(store: Store, directory: str) -> ManagerState | None:
    """The validated state of the manager directory, or None when there is none.
    A state file that is not valid raises CorruptCheckpointError (nothing is
    deleted on its word)."""
    path = store.join(directory, STATE_NAME)
    try:
        data = store.read_bytes(path)
    except FileNotFoundError:
        return None
    try:
        doc = json.loads(data.decode("utf-8"))
        if not isinstance(doc, dict):
            raise ValueError("it is not a JSON object")
        return ManagerState.from_json(doc)
    except ValueError as e:  # UnicodeDecodeError and JSONDecodeError included
        raise CorruptCheckpointError(
            f"invalid manager state file {store.url(path)}: {e}. Nothing was deleted. "
            "Repair the file or remove it: the committed checkpoints of the directory "
            "are then adopted again.") from None


def write_state(store: Store, directory: str, state: ManagerState) -> None:
    """Replaces the state file of ``directory`` with ``state``, atomically."""
    body = json.dumps(state.to_json(), indent=1, allow_nan=False).encode("utf-8")
    store.write_atomic(store.join(directory, STATE_NAME), body)




def committed_steps(store: Store, directory: str, name: str) -> dict[str, int]:
    """``{"<name>-<N>": N}`` for every committed checkpoint directly in directory."""
    out = {}
    for entry in store.listdir(directory):
        step = parse_step(entry, name)
        if step is not None and store.exists(store.join(directory, entry, INDEX_NAME)):
            out[entry] = step
    return out


def recover_state(store: Store, directory: str, name: str,
                  clock: Callable[[], float] = time.time) -> ManagerState:
    """The manager state of directory as it is on storage (read only): the state file's
    lists minus what is no longer committed, plus committed checkpoints the file
    does not list yet (the process died between commit and state update), which
    are newer than every listed one."""
    state = read_state(store, directory)
    if state is None or state.checkpoint_name != name:
        state = ManagerState(name)
    committed = committed_steps(store, directory, name)
    state.active = [e for e in state.active if e.name in committed]
    state.preserved = [e for e in state.preserved if e.name in committed]
    known = {e.name for e in state.active} | {e.name for e in state.preserved} | set(state.deleting)
    for entry in sorted((n for n in committed if n not in known), key=lambda n: committed[n]):
        mtime = store.mtime(store.join(directory, entry, INDEX_NAME))
        state.active.append(Entry(entry, committed[entry], mtime or clock()))
    if state.last_preserved_time is None:
        state.last_preserved_time = clock()
    return state


def latest(store: Store, directory: str) -> str | None:
    """Path of the latest committed checkpoint of a run directory, or None.

    With a manager state file: the checkpoint saved last (TensorFlow's rule, the
    same answer as ``CheckpointManager.latest_checkpoint``). Without one: the
    committed ``ckpt-<N>`` with the highest N, else the committed ``<prefix>-<N>``
    of any prefix with the highest N (``Checkpoint.save`` prefixes)."""
    state = read_state(store, directory)
    name = state.checkpoint_name if state else DEFAULT_NAME
    found = recover_state(store, directory, name).latest
    if found is None and state is None:
        found = _latest_any_prefix(store, directory)
    return None if found is None else store.join(directory, found)


def step_of(name: str) -> int | None:
    """N for a name ``<prefix>-<N>`` of any prefix (``ls``, latest of any prefix)."""
    head, sep, _ = name.rpartition("-")
    return parse_step(name, head) if sep and head else None


def _latest_any_prefix(store: Store, directory: str) -> str | None:
    best: tuple[int, float, str] | None = None
    for entry in store.listdir(directory):
        step = step_of(entry)
        index = store.join(directory, entry, INDEX_NAME)
        if step is None or not store.exists(index):
            continue
        key = (step, store.mtime(index) or 0.0, entry)
        if best is None or key[:2] > best[:2]:
            best = key
    return best[2] if best else None
