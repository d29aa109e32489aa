"""pyckpt as the storage of ``torch.distributed.checkpoint`` (DCP).

``dcp.save(sd, storage_writer=pyckpt.dcp.StorageWriter(url))``,
``dcp.async_save(...)`` and ``dcp.load(sd, storage_reader=pyckpt.dcp.StorageReader(url))``
run unchanged with DCP's planners: DCP decides who writes and reads which bytes
(deduplication, resharding), pyckpt stores them. What is written is an ordinary
pyckpt checkpoint (docs/API.md, "torch.distributed.checkpoint"):

- its keys are DCP's fully qualified names, each tensor's blocks are those the
  ranks wrote (a sharded tensor is a multi-worker tensor of pyckpt's format);
- DCP's non-tensor entries (its pickled bytes) are kept as ``bytes`` under their
  key, inline in the index, and never unpickled by pyckpt;
- the index is written last by the coordinator (``finish``) and names every file,
  so a save that failed anywhere is never taken for a checkpoint;
- every read checks the CRC-32C of every chunk it touches.

The reader serves any pyckpt checkpoint: each tensor is declared to DCP as one
chunk, and pyckpt reads the box each rank asks for from however it was stored.
"""

from __future__ import annotations

try:
    import torch.distributed.checkpoint as _dcp
except ImportError as e:  # pragma: no cover - exercised in a subprocess test
    raise ImportError(f"pyckpt.dcp needs torch with torch.distributed.checkpoint: "
                      f'pip install "pyckpt[torch]" ({e})') from None

del _dcp

from .reader import StorageReader
from .writer import StorageWriter

__all__ = ["StorageWriter", "StorageReader"]
