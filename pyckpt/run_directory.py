"""A run directory: numbered checkpoints ``<name>-<N>`` and the manager's state
file ``pyckpt-manager.json`` (docs/PROTOCOL.md, "Manager state"). This module is
the one home of run-directory knowledge (step names, "latest", the manager's and
TensorFlow's state files), in a layer of its own below the engine, which uses it
and owns none of it. It is the one step scanner: the manager, the reader and
``latest_checkpoint`` find a directory's checkpoints and its latest one here
(``pyckpt ls`` lists every entry of a directory itself, committed, uncommitted or
corrupt, and takes only ``step_of`` from here), and whether a checkpoint is
committed at a path is answered here too (``committed_manifest``).

The state file is kept in the directory and always replaced atomically. Paths
in it are relative to the directory, so a copied or moved directory keeps
working.

The file is input from storage like any other: the manager deletes what its
``deleting`` list names. So every name in it must be ``<checkpoint_name>-<N>``,
a checkpoint directly inside the directory; anything else (``../victim``, an
absolute path, ``""``, ``.``) makes ``read_state`` raise
CorruptCheckpointError before anything is read or deleted.

TensorFlow checkpoints count too (docs/TF_FORMAT.md section 6): a prefix
``<name>-<N>`` whose ``<name>-<N>.index`` file lies in the directory is a
committed checkpoint of that step, and without pyckpt's state file the
latest checkpoint is the one TensorFlow's ``checkpoint`` state file names
(reduced to a name directly inside the directory: ``format/tf_state.py``)."""

from __future__ import annotations

import dataclasses
import json
import time
import warnings
from typing import Any, Callable, Iterator

from .errors import CorruptCheckpointError
from .storage import Store
from .format import INDEX_NAME, Manifest, decode_index
from .format import tf_state

STATE_NAME = "pyckpt-manager.json"
STATE_VERSION = 1
DEFAULT_NAME = "ckpt"
TF_INDEX = ".index"  # a TensorFlow checkpoint <prefix> is committed once <prefix>.index exists


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


def committed_manifest(store: Store, path: str) -> Manifest | None:
    """The manifest committed at ``path`` (a checkpoint directory), or None when its
    index is missing or cannot be read or decoded."""
    index = store.join(path, INDEX_NAME)
    try:
        return decode_index(store.read_bytes(index), store.url(index))
    except (FileNotFoundError, ValueError, OSError):
        return None


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




def committed_steps(store: Store, directory: str, name: str,
                    tensorflow: bool = False) -> dict[str, int]:
    """``{"<name>-<N>": N}`` for every committed checkpoint directly in directory
    (``tensorflow``: TensorFlow's ``<name>-<N>.index`` prefixes included)."""
    out = {}
    entries = store.listdir(directory)
    for entry in entries:
        step = parse_step(entry, name)
        if step is not None and store.exists(store.join(directory, entry, INDEX_NAME)):
            out[entry] = step
    if tensorflow:
        for entry in entries:
            stem = entry[:-len(TF_INDEX)]
            step = parse_step(stem, name) if entry.endswith(TF_INDEX) else None
            if step is not None and stem not in out:
                out[stem] = step
    return out


def is_tensorflow(store: Store, directory: str, name: str) -> bool:
    """Whether ``<directory>/<name>`` is a TensorFlow checkpoint (its ``.index`` file
    exists, and no pyckpt checkpoint of that name does)."""
    return (store.exists(store.join(directory, name + TF_INDEX))
            and not store.exists(store.join(directory, name, INDEX_NAME)))


def tensorflow_files(store: Store, directory: str, name: str) -> list[str]:
    """The files of TensorFlow checkpoint ``name`` in directory, index first: ``.index``,
    ``.data-NNNNN-of-MMMMM`` and a TF1 Saver's ``.meta`` (as TensorFlow removes them)."""
    check_checkpoint_name(name, "checkpoint")
    rest = sorted(e for e in store.listdir(directory)
                  if e == name + ".meta" or (e.startswith(name + ".data-") and "-of-" in e))
    return [store.join(directory, e) for e in [name + TF_INDEX] + rest]


def delete_checkpoint(store: Store, directory: str, name: str) -> None:
    """Removes checkpoint ``name`` of directory, un-committing it first: pyckpt's
    (its index, then the directory; a symbolic link: the link only) and any
    TensorFlow checkpoint of that name (``.index``, then its data and ``.meta``
    files). Parts already gone are skipped, so an interrupted deletion can be
    finished by calling it again."""
    check_checkpoint_name(name, "checkpoint")
    path = store.join(directory, name)
    tf_files = tensorflow_files(store, directory, name)
    if store.is_link(path):
        store.remove(directory, [path])
    else:
        store.remove(directory, [store.join(path, INDEX_NAME)])
        store.sync_dir(path)
        store.remove_tree(directory, path)
    if len(tf_files) > 1 or store.exists(tf_files[0]):
        store.remove(directory, tf_files[:1])
        store.sync_dir(directory)
        store.remove(directory, tf_files[1:])


def recover_state(store: Store, directory: str, name: str,
                  clock: Callable[[], float] = time.time,
                  tensorflow: bool = False) -> ManagerState:
    """The manager state of directory as it is on storage (read only): the state file's
    lists minus what is no longer committed, plus committed checkpoints the file
    does not list yet (the process died between commit and state update), which
    are newer than every listed one (``tensorflow``: TensorFlow's checkpoints of
    that name count too, adopted in step order)."""
    state = read_state(store, directory)
    if state is None or state.checkpoint_name != name:
        state = ManagerState(name)
    committed = committed_steps(store, directory, name, tensorflow)
    state.active = [e for e in state.active if e.name in committed]
    state.preserved = [e for e in state.preserved if e.name in committed]
    known = {e.name for e in state.active} | {e.name for e in state.preserved} | set(state.deleting)
    for entry in sorted((n for n in committed if n not in known), key=lambda n: committed[n]):
        mtime = store.mtime(store.join(directory, entry, INDEX_NAME)) \
            or store.mtime(store.join(directory, entry + TF_INDEX))
        state.active.append(Entry(entry, committed[entry], mtime or clock()))
    if state.last_preserved_time is None:
        state.last_preserved_time = clock()
    return state


def latest(store: Store, directory: str) -> str | None:
    """Path of the latest committed checkpoint of a run directory, or None.

    With a manager state file: the checkpoint saved last (TensorFlow's rule, the
    same answer as ``CheckpointManager.latest_checkpoint``). Without one: the
    checkpoint TensorFlow's ``checkpoint`` state file names, if it is committed
    (else the newest committed one it lists); else the committed ``ckpt-<N>``
    with the highest N, else the committed ``<prefix>-<N>`` of any prefix with
    the highest N (``Checkpoint.save`` prefixes). TensorFlow's checkpoints
    (``<prefix>.index``) count like pyckpt's where there is no manager state.

    A pyckpt checkpoint whose index cannot be decoded (garbage, truncated) is
    passed over with a warning naming it and the error, for the next newest
    of the same rule, as the tiered manager's restore does."""
    for name in _candidates(store, directory):
        index = store.join(directory, name, INDEX_NAME)
        try:
            decode_index(store.read_bytes(index), store.url(index))
        except FileNotFoundError:
            pass  # a TensorFlow prefix (checked by its reader)
        except CorruptCheckpointError as e:
            warnings.warn(f"{store.url(store.join(directory, name))} is not used as the latest "
                          f"checkpoint of {store.url(directory)}: {e}. The next newest "
                          "committed checkpoint is used instead",
                          stacklevel=3)
            continue
        return store.join(directory, name)
    return None


def _candidates(store: Store, directory: str) -> Iterator[str]:
    """The committed checkpoints of ``latest``'s rule, newest first (names)."""
    state = read_state(store, directory)
    if state is not None:
        rec = recover_state(store, directory, state.checkpoint_name, tensorflow=True)
        if rec.active:
            yield from (e.name for e in reversed(rec.active))
        yield from (e.name for e in sorted(rec.preserved, key=lambda e: e.time, reverse=True))
        return
    tf_names = _tensorflow_state_names(store, directory)
    if tf_names:
        yield from tf_names
        return
    rec = recover_state(store, directory, DEFAULT_NAME, tensorflow=True)
    if rec.active:
        yield from (e.name for e in reversed(rec.active))
        return
    yield from _any_prefix_names(store, directory)


def step_of(name: str) -> int | None:
    """N for a name ``<prefix>-<N>`` of any prefix (``ls``, latest of any prefix)."""
    head, sep, _ = name.rpartition("-")
    return parse_step(name, head) if sep and head else None


def _committed(store: Store, directory: str, name: str) -> bool:
    return (store.exists(store.join(directory, name, INDEX_NAME))
            or store.exists(store.join(directory, name + TF_INDEX)))


def read_tensorflow_state(store: Store, directory: str) -> tf_state.TFState | None:
    """TensorFlow's ``checkpoint`` state file of directory, parsed, or None."""
    path = store.join(directory, tf_state.STATE_NAME)
    try:
        if store.isdir(path):
            return None
        data = store.read_bytes(path)
    except FileNotFoundError:
        return None
    return tf_state.parse_state(data, store.url(path))


def _tensorflow_state_names(store: Store, directory: str) -> list[str]:
    """The committed checkpoints TensorFlow's state file names, its latest first, then
    the others it lists, newest first; empty without one."""
    state = read_tensorflow_state(store, directory)
    if state is None:
        return []
    url = store.url(store.join(directory, tf_state.STATE_NAME))
    listed = list(state.all_model_checkpoint_paths)
    if state.model_checkpoint_path is not None:
        listed.append(state.model_checkpoint_path)
    out: list[str] = []
    for path in reversed(listed):
        name = tf_state.checkpoint_name(path, url)
        if name not in out and _committed(store, directory, name):
            out.append(name)
    return out


def _any_prefix_names(store: Store, directory: str) -> list[str]:
    """Committed ``<prefix>-<N>`` checkpoints of any prefix, highest N (then newest
    index) first."""
    found: list[tuple[int, float, str]] = []
    for entry in store.listdir(directory):
        name, index = entry, store.join(directory, entry, INDEX_NAME)
        if entry.endswith(TF_INDEX):
            name, index = entry[:-len(TF_INDEX)], store.join(directory, entry)
        step = step_of(name)
        if step is None or not store.exists(index):
            continue
        found.append((step, store.mtime(index) or 0.0, name))
    found.sort(key=lambda t: t[:2], reverse=True)
    return [t[2] for t in found]
