"""Inspection of checkpoints (docs/API.md section 4): the seeds' tf.train.load_checkpoint,
list_variables, load_variable and latest_checkpoint."""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from . import run_directory
from .format.read_plan import ReadPlan
from .format.source import CheckpointSource
from .format.values import text_values
from .sources import open_source
from .storage import resolve

__all__ = ["CheckpointReader", "load_checkpoint", "list_variables", "load_variable",
           "latest_checkpoint"]


class CheckpointReader:
    """Read access to one committed checkpoint, of any format ``open_source`` opens.
    Only the index is read when it is opened; ``get_tensor`` reads just that
    tensor's bytes."""

    def __init__(self, src: CheckpointSource) -> None:
        self._src = src
        self._ck = src  # the name tests and debugging sessions of 0.1 know

    @property
    def path(self) -> str:
        """The resolved checkpoint path (a directory argument resolves to its latest)."""
        return self._src.url

    @property
    def source(self) -> CheckpointSource:
        """The opened checkpoint behind this reader (the format interface)."""
        return self._src

    @property
    def metadata(self) -> dict:
        """The user metadata given to save."""
        return self._src.metadata

    @property
    def object_graph(self) -> dict | None:
        """The stored object graph of an object-based checkpoint (docs/FORMAT.md)."""
        return self._src.graph

    def text_values(self) -> dict[str, Any]:
        """``{path: value}`` of the str, None and bytes values the checkpoint keeps
        outside its tensors (in its tree or object graph; ``load`` returns them in
        place), by their ``/``-joined paths."""
        return text_values(self._src.tree, self._src.graph)

    def keys(self) -> list[str]:
        """Every key, sorted."""
        return sorted(self._src.keys)

    def has_tensor(self, key: str) -> bool:
        """Whether the checkpoint holds a tensor under ``key``."""
        return key in self._src.index

    def __contains__(self, key: object) -> bool:
        return key in self._src.index

    def get_variable_to_shape_map(self) -> dict[str, tuple[int, ...]]:
        """``{key: shape}`` of every tensor, in key order (as TensorFlow's reader gives)."""
        src = self._src
        return {src.keys[i]: src.shape(i) for i in _sorted_order(src.keys)}

    def get_variable_to_dtype_map(self) -> dict[str, np.dtype]:
        """``{key: numpy dtype}`` of every tensor, in key order (dtypes as stored)."""
        src = self._src
        return {src.keys[i]: src.dtype(i) for i in _sorted_order(src.keys)}

    def get_tensor(self, key: str) -> np.ndarray:
        """The verified value of one tensor (reads only its bytes)."""
        return ReadPlan(self._src, [self._src.index_of(key)]).execute()[0]

    def nbytes(self) -> int:
        """Bytes of every value."""
        return self._src.nbytes()

    def verify(self) -> None:
        """Reads every stored byte and checks every checksum; raises
        CorruptCheckpointError (naming key, file and byte range) on the first failure."""
        self._src.verify()

    def __repr__(self) -> str:
        return f"<CheckpointReader {self.path!r}: {len(self._src.keys)} tensors>"


def load_checkpoint(path: Any, *, storage_options: dict | None = None) -> CheckpointReader:
    """A reader of the checkpoint at path (a directory resolves to its latest): pyckpt's
    format, a ``.safetensors`` file or a TensorFlow checkpoint prefix (``dir/ckpt-5``
    where ``dir/ckpt-5.index`` exists; TensorFlow's keys, dtypes and values)."""
    return CheckpointReader(open_source(path, storage_options))


def list_variables(path: Any, *, storage_options: dict | None = None) -> list[tuple[str, tuple[int, ...]]]:
    """(key, shape) of every tensor, sorted by key."""
    src = open_source(path, storage_options)
    return [(src.keys[i], src.shape(i)) for i in _sorted_order(src.keys)]


def load_variable(path: Any, key: str, *, storage_options: dict | None = None) -> np.ndarray:
    """The value of one tensor."""
    return load_checkpoint(path, storage_options=storage_options).get_tensor(key)


def _sorted_order(keys: Sequence[str]) -> list[int]:
    return sorted(range(len(keys)), key=keys.__getitem__)


def latest_checkpoint(directory: Any, *, storage_options: dict | None = None) -> str | None:
    """The latest committed checkpoint in directory, or None.

    In a manager's directory it is the checkpoint saved last, as the state file
    records it (TensorFlow's rule; ``CheckpointManager.latest_checkpoint`` agrees).
    In a directory TensorFlow wrote, it is the checkpoint TensorFlow's ``checkpoint``
    state file names (a prefix ``dir/ckpt-5``; names in that file never lead outside
    the directory, docs/TF_FORMAT.md section 6). Elsewhere it is the committed
    ``ckpt-<N>`` with the highest N, else the committed ``<prefix>-<N>`` of any
    prefix (``Checkpoint.save`` prefixes), TensorFlow's ``<prefix>.index`` included.
    """
    store, d = resolve(directory, storage_options)
    found = run_directory.latest(store, d)
    return None if found is None else store.url(found)
