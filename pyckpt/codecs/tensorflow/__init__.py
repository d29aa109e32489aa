"""The TensorFlow TensorBundle codec, without TensorFlow (docs/TF_FORMAT.md): its
protobuf wire codec (``wire``, ``messages``), the LevelDB table reader and writer
(``table``), string tensors (``strings``), the object graph mapped onto pyckpt's
stored graph (``object_graph``), ``TensorFlowCheckpoint`` (the checkpoint source of
``<prefix>.index`` + ``<prefix>.data-NNNNN-of-MMMMM``, registered in
``pyckpt.sources``) and the bundle writer (``writer``). The conversions to and
from pyckpt checkpoints are ``pyckpt.interop.tensorflow``.
"""

from __future__ import annotations

from ...engine.options import DEFAULT, IOOptions
from ...format.source import CheckpointSource
from ...storage import Store
from .bundle import DTYPES, TF_DTYPE_NAMES, TensorFlowCheckpoint, UnsupportedTensorError

__all__ = ["TensorFlowCheckpoint", "UnsupportedTensorError", "DTYPES", "TF_DTYPE_NAMES",
           "detect", "open_path"]


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
