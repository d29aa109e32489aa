"""Inspection of checkpoints (API.md section 4): the seeds' tf.train.load_checkpoint,
list_variables, load_variable and latest_checkpoint."""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from .engine.reader import OpenCheckpoint, open_checkpoint
from .format import run
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
        return dict(sorted(zip(m.keys, m.shapes)))  # keys are unique: shapes never compared

    def get_variable_to_dtype_map(self) -> dict[str, np.dtype]:
        m = self._ck.manifest
        return {m.keys[i]: m.dtype(i) for i in _sorted_order(m.keys)}

    def get_tensor(self, key: str) -> np.ndarray:
        from .flat import read_values

        return read_values(self._ck, [key])[key]

    def nbytes(self) -> int:
        m = self._ck.manifest
        return sum(math.prod(s) * m.dtype(i).itemsize for i, s in enumerate(m.shapes))

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
    return sorted(zip(m.keys, m.shapes))  # keys are unique: shapes are never compared


def load_variable(path: Any, key: str, *, storage_options: dict | None = None) -> np.ndarray:
    return load_checkpoint(path, storage_options=storage_options).get_tensor(key)


def _sorted_order(keys: list[str]) -> list[int]:
    return sorted(range(len(keys)), key=keys.__getitem__)


def latest_checkpoint(directory: Any, *, storage_options: dict | None = None) -> str | None:
    """The latest committed checkpoint in directory, or None.

    In a manager's directory it is the checkpoint saved last, as the state file
    records it (TensorFlow's rule; ``CheckpointManager.latest_checkpoint`` agrees).
    Elsewhere it is the committed ``ckpt-<N>`` with the highest N, else the
    committed ``<prefix>-<N>`` of any prefix (``Checkpoint.save`` prefixes).
    """
    store, d = resolve(directory, storage_options)
    found = run.latest(store, d)
    return None if found is None else store.url(found)
