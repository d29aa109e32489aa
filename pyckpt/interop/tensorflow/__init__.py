"""TensorFlow checkpoints in and out, without TensorFlow (docs/TF_FORMAT.md).

Reading: ``TensorFlowCheckpoint`` is the checkpoint source of a TensorBundle
(``<prefix>.index`` + ``<prefix>.data-NNNNN-of-MMMMM``), registered in
``pyckpt.sources`` so that ``load_checkpoint``, ``list_variables``,
``load_variable``, ``load`` and ``Checkpoint.restore`` open TensorFlow prefixes
transparently (``sources.open_source`` resolves run directories first, reading
TensorFlow's ``checkpoint`` state file: ``engine/run.py``).

Writing: ``save(src, prefix)`` writes a pyckpt checkpoint, any source or a
tree as a TensorFlow checkpoint that ``tf.train.load_checkpoint`` and
``tf.train.Checkpoint.restore`` read; ``to_checkpoint`` / ``from_checkpoint``
are the two directions of ``pyckpt cp``.
"""

from __future__ import annotations

from ...engine.options import DEFAULT, IOOptions
from ...format.source import CheckpointSource
from ...storage import Store
from .bundle import DTYPES, TF_DTYPE_NAMES, TensorFlowCheckpoint, UnsupportedTensorError
from .convert import from_checkpoint, is_prefix, open_any, save, to_checkpoint

__all__ = ["TensorFlowCheckpoint", "UnsupportedTensorError", "DTYPES", "TF_DTYPE_NAMES",
           "detect", "open_path", "is_prefix", "open_any", "save", "to_checkpoint",
           "from_checkpoint"]


def detect(store: Store, path: str) -> bool:
    """Cheap test for ``open_path``: ``path`` is a TensorFlow prefix (``path.index``
    exists and ``path`` is no directory) or its ``.index`` file. Run directories are
    ``sources.open_source``'s to resolve, before any format is asked."""
    if not path or path.endswith(".safetensors") or path.endswith("/"):
        return False
    if store.exists(path + ".index"):
        return not store.isdir(path)
    return path.endswith(".index") and store.exists(path) and not store.isdir(path)


def open_path(store: Store, path: str, options: IOOptions = DEFAULT) -> CheckpointSource:
    """The TensorFlow checkpoint at a path ``detect`` accepted (a prefix or its
    ``.index`` file)."""
    if path.endswith(".index") and not store.exists(path + ".index"):
        path = path[:-len(".index")]
    return TensorFlowCheckpoint(store, path, options)
