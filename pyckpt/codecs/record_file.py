"""What every codec does first: read a format's small record file (TensorFlow's
``.index``, DCP's ``.metadata``) whole, refusing one larger than the reader accepts
before reading it."""

from __future__ import annotations

from ..errors import CheckpointNotFoundError, CorruptCheckpointError
from ..storage import Store

__all__ = ["read_record_file"]


def read_record_file(store: Store, path: str, limit: int, what: str, checkpoint: str) -> bytes:
    """The bytes of ``path`` (``what``: "TensorFlow index"); CorruptCheckpointError when
    it exceeds ``limit`` bytes, CheckpointNotFoundError naming ``checkpoint`` (the
    checkpoint's own description) when it does not exist."""
    url = store.url(path)
    try:
        size = store.size(path)
        if size > limit:
            raise CorruptCheckpointError(f"{what} {url} has {size} bytes, more than the "
                                         f"{limit} this reader accepts")
        return store.read_bytes(path)
    except FileNotFoundError:
        raise CheckpointNotFoundError(f"no {checkpoint} ({url} does not exist)") from None
