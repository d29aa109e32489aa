"""TensorFlow checkpoints in and out, without TensorFlow (docs/TF_FORMAT.md); the
format's codec is ``pyckpt.codecs.tensorflow``, re-exported here.

Reading: ``TensorFlowCheckpoint`` is the checkpoint source of a TensorBundle
(``<prefix>.index`` + ``<prefix>.data-NNNNN-of-MMMMM``), registered in
``pyckpt.sources`` so that ``load_checkpoint``, ``list_variables``,
``load_variable``, ``load`` and ``Checkpoint.restore`` open TensorFlow prefixes
transparently (``sources.open_source`` resolves run directories first, reading
TensorFlow's ``checkpoint`` state file: ``run_directory.py``).

Writing: ``save(src, prefix)`` writes a pyckpt checkpoint, any source or a
tree as a TensorFlow checkpoint that ``tf.train.load_checkpoint`` and
``tf.train.Checkpoint.restore`` read; ``to_checkpoint`` / ``from_checkpoint``
are the two directions of ``pyckpt cp``.
"""

from __future__ import annotations

from ...codecs.tensorflow import (DTYPES, TF_DTYPE_NAMES, TensorFlowCheckpoint,
                                  UnsupportedTensorError, detect, open_path)
from .convert import from_checkpoint, is_prefix, open_any, save, to_checkpoint

__all__ = ["TensorFlowCheckpoint", "UnsupportedTensorError", "DTYPES", "TF_DTYPE_NAMES",
           "detect", "open_path", "is_prefix", "open_any", "save", "to_checkpoint",
           "from_checkpoint"]
