"""TensorFlow checkpoints in and out, without TensorFlow (docs/TF_FORMAT.md).

Reading: ``TensorFlowCheckpoint`` is the checkpoint source of a TensorBundle
(``<prefix>.index`` + ``<prefix>.data-NNNNN-of-MMMMM``), registered in
``pyckpt.sources`` so that ``load_checkpoint``, ``list_variables``,
``load_variable``, ``load`` and ``Checkpoint.restore`` open TensorFlow prefixes
transparently; ``latest_checkpoint`` reads TensorFlow's ``checkpoint`` state
file (``engine/run.py``).

Writing: ``save(src, prefix)`` writes a pyckpt checkpoint, any source or a
tree as a TensorFlow checkpoint that ``tf.train.load_checkpoint`` and
``tf.train.Checkpoint.restore`` read; ``to_checkpoint`` / ``from_checkpoint``
are the two directions of ``pyckpt cp``.
"""

from __future__ import annotations

from ...engine import run
from ...engine.options import DEFAULT, IOOptions
from ...engine.reader import OpenCheckpoint
from ...format import INDEX_NAME
from ...format.source import CheckpointSource
from ...storage import Store, resolve
from .bundle import DTYPES, TF_DTYPE_NAMES, TensorFlowCheckpoint, UnsupportedTensorError
from .convert import from_checkpoint, is_prefix, open_any, save, to_checkpoint

__all__ = ["TensorFlowCheckpoint", "UnsupportedTensorError", "DTYPES", "TF_DTYPE_NAMES",
           "detect", "open_path", "tensorflow_source", "is_prefix", "open_any", "save", "to_checkpoint",
           "from_checkpoint"]


def detect(store: Store, path: str) -> bool:
    """Cheap test for ``open_path``: ``path`` is a TensorFlow prefix (``path.index``
    exists), its ``.index`` file, or a directory that is not itself a pyckpt
    checkpoint (a run directory, which may hold TensorFlow checkpoints and
    TensorFlow's ``checkpoint`` state file: ``open_path`` resolves it)."""
    if not path or path.endswith(".safetensors"):
        return False
    if store.exists(store.join(path, INDEX_NAME)):
        return False
    if store.exists(path + ".index"):
        return True
    if path.endswith(".index") and store.exists(path) and not store.isdir(path):
        return True
    return store.isdir(path)


def open_path(store: Store, path: str, options: IOOptions = DEFAULT) -> CheckpointSource:
    """The checkpoint at a path ``detect`` accepted: a TensorFlow prefix, or the
    latest checkpoint of a run directory (``engine.run.latest``), whichever its
    format; a directory without any raises CheckpointNotFoundError."""
    if path.endswith(".index") and not store.exists(path + ".index") and not store.isdir(path):
        path = path[:-len(".index")]
    if store.exists(path + ".index") and not store.isdir(path):
        return TensorFlowCheckpoint(store, path, options)
    latest = run.latest(store, path)
    if latest is not None and not store.exists(store.join(latest, INDEX_NAME)) \
            and store.exists(latest + ".index"):
        return TensorFlowCheckpoint(store, latest, options)
    return OpenCheckpoint.open(store, latest if latest is not None else path, options)


def tensorflow_source(path: str, storage_options: dict | None = None) -> TensorFlowCheckpoint | None:
    """The TensorFlow checkpoint ``path`` designates (a prefix, its ``.index`` file, or
    a run directory whose latest checkpoint is TensorFlow's), opened; None for
    anything else (pyckpt checkpoints, safetensors files, missing paths)."""
    store, p = resolve(path, storage_options)
    if not detect(store, p):
        return None
    if p.endswith(".index") and not store.exists(p + ".index") and not store.isdir(p):
        p = p[:-len(".index")]
    if store.exists(p + ".index") and not store.isdir(p):
        return TensorFlowCheckpoint(store, p)
    latest = run.latest(store, p)
    if latest is not None and not store.exists(store.join(latest, INDEX_NAME)) \
            and store.exists(latest + ".index"):
        return TensorFlowCheckpoint(store, latest)
    return None
