"""Inspection of checkpoints (API.md section 4): the seeds' tf.train.load_checkpoint,
list_variables, load_variable and latest_checkpoint."""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from .engine.reader import OpenCheckpoint, find_latest, open_checkpoint
from .manager.state import read_checkpoint_name
from .storage import resolve

__all__ = ["CheckpointReader", "load_checkpoint", "list_variables", "load_variable",
           "latest_checkpoint"]


class CheckpointReader:
    """Read access to one committed checkpoint. Only the index is read when it is
    opened; ``get_tensor`` reads just that tensor's bytes."""

    def __init__(self, ck: OpenCheckpoint) -> None:
        self._ck = ck

    @property
    def path(self) -> str:
        """The resolved checkpoint path (a directory argument resolves to its latest)."""
        return self._ck.url

    @property
    def metadata(self) -> dict:
        """The user metadata given to save."""
        return self._ck.manifest.metadata

    @property
    def object_graph(self) -> dict | None:
        """The stored object graph of an object-based checkpoint (docs/FORMAT.md)."""
        return self._ck.manifest.graph

    def keys(self) -> list[str]:
        return sorted(self._ck.manifest.keys)

    def has_tensor(self, key: str) -> bool:
        return key in self._ck.manifest.index

    def __contains__(self, key: object) -> bool:
        return key in self._ck.manifest.index

    def get_variable_to_shape_map(self) -> dict[str, tuple[int, ...]]:
        m = self._ck.manifest
        return {k: m.shapes[i] for k, i in sorted(m.index.items())}

    def get_variable_to_dtype_map(self) -> dict[str, np.dtype]:
        m = self._ck.manifest
        return {k: m.dtype(i) for k, i in sorted(m.index.items())}

    def get_tensor(self, key: str) -> np.ndarray:
        from .flat import read_values

        return read_values(self._ck, [key])[key]

    def nbytes(self) -> int:
        m = self._ck.manifest
        return sum(math.prod(m.shapes[i]) * m.dtype(i).itemsize for i in range(len(m.keys)))

    def verify(self) -> None:
        """Reads every stored byte and checks every checksum; raises
        CorruptCheckpointError (naming key, file and byte range) on the first failure."""
        self._ck.verify()

    def __repr__(self) -> str:
        return f"<CheckpointReader {self.path!r}: {len(self._ck.manifest.tensors)} tensors>"


def load_checkpoint(path: Any, *, storage_options: dict | None = None) -> CheckpointReader:
    return CheckpointReader(open_checkpoint(path, storage_options))


def list_variables(path: Any, *, storage_options: dict | None = None) -> list[tuple[str, tuple[int, ...]]]:
    m = open_checkpoint(path, storage_options).manifest
    return [(k, m.shapes[i]) for k, i in sorted(m.index.items())]


def load_variable(path: Any, key: str, *, storage_options: dict | None = None) -> np.ndarray:
    return load_checkpoint(path, storage_options=storage_options).get_tensor(key)


def latest_checkpoint(directory: Any, *, storage_options: dict | None = None) -> str | None:
    """The committed ``<name>-<N>`` in directory with the highest N, or None.

    ``<name>`` comes from the manager's state file in the directory, else it is
    ``ckpt``; when neither names a committed checkpoint and there is no state
    file, any ``<prefix>-<N>`` checkpoint counts (``Checkpoint.save`` prefixes).
    """
    store, d = resolve(directory, storage_options)
    name = read_checkpoint_name(store, d)
    found = find_latest(store, d, name or "ckpt")
    if found is None and name is None:
        found = _latest_any_prefix(store, d)
    if found is None:
        return None
    return store.url(found)


def _latest_any_prefix(store: Any, d: str) -> str | None:
    from .engine import naming
    from .format import INDEX_NAME

    best: tuple[int, float, str] | None = None
    for entry in store.listdir(d):
        head, sep, tail = entry.rpartition("-")
        if not sep or not head or not tail.isdigit():
            continue
        step = naming.parse_step(entry, head)
        path = store.join(d, entry)
        index = store.join(path, INDEX_NAME)
        if step is None or not store.exists(index):
            continue
        key = (step, store.mtime(index) or 0.0, path)
        if best is None or key[:2] > best[:2]:
            best = key
    return best[2] if best else None
