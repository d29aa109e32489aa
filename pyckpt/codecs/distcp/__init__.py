"""torch.distributed.checkpoint (DCP) directories, read without torch: the
``.metadata`` pickle and the ``torch.save`` archives inside ``*.distcp`` files are
read by restricted readers (``unpickler``, with the allow-lists of ``allowed``)
that run nothing stored in them; ``metadata`` checks DCP's records, ``archive``
reads one tensor item, and ``DCPCheckpoint`` is the checkpoint source
(registered in ``pyckpt.sources`` as format "dcp").
"""

from __future__ import annotations

from ...format import INDEX_NAME
from ...storage import Store
from .archive import UnsupportedDCPError
from .checkpoint import METADATA_NAME, DCPCheckpoint

__all__ = ["DCPCheckpoint", "UnsupportedDCPError", "METADATA_NAME", "detect"]


def detect(store: Store, path: str) -> bool:
    """A directory holding DCP's ``.metadata`` (and no pyckpt index: pyckpt's own
    checkpoints are never taken for DCP's)."""
    return bool(path) and store.exists(store.join(path, METADATA_NAME)) and \
        not store.exists(store.join(path, INDEX_NAME))
