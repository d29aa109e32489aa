"""The format interface: what an opened checkpoint of any format offers.

``load``, ``load_checkpoint``, ``Checkpoint.restore``, ``copy`` and every CLI
command read through this interface and never look inside a format. Opening a
path (``pyckpt.sources.open_source``) picks the implementation: pyckpt's own
format (``engine/reader.py``, local or remote) or a safetensors file
(``codecs/safetensors.py``); a new format is one more implementation,
registered with ``pyckpt.sources.register_format``.

Tensors are addressed by their position ``i`` in ``keys`` (stored order):
bulk paths handle 100,000 small tensors as columns, not objects. Every read
checks what the format can check (pyckpt: every chunk's CRC-32C) before a value
is returned, and raises CorruptCheckpointError naming the key, file and bytes.
"""

from __future__ import annotations

import abc
import math
from typing import Any, Mapping, Sequence

import numpy as np

from ..errors import CheckpointKeyError
from ..device.loading import fill_targets
from ..sharded import ShardedArray

__all__ = ["CheckpointSource", "KeyedSource", "Target"]

#: Where a read puts one tensor: a whole array, or this worker's block of it.
Target = "np.ndarray | ShardedArray"


class CheckpointSource(abc.ABC):
    """One opened, validated checkpoint (of some format). Thread-compatible: reads
    may run concurrently, each from one thread."""

    #: short format name shown to users ("pyckpt", "safetensors")
    format: str = ""
    #: whether the format stores checksums that ``verify`` checks (safetensors does
    #: not: its ``verify`` checks sizes and bounds only)
    checksums: bool = True

    @property
    @abc.abstractmethod
    def url(self) -> str:
        """The checkpoint's path as the user would write it."""

    @property
    @abc.abstractmethod
    def keys(self) -> Sequence[str]:
        """Every tensor key, in stored order."""

    @property
    @abc.abstractmethod
    def index(self) -> Mapping[str, int]:
        """key -> position in ``keys``."""

    @abc.abstractmethod
    def shape(self, i: int) -> tuple[int, ...]:
        """Global shape of tensor i."""

    @abc.abstractmethod
    def dtype(self, i: int) -> np.dtype:
        """dtype of tensor i (little-endian as stored)."""

    @property
    def metadata(self) -> dict:
        """The user metadata given to save (format-specific for foreign files)."""
        return {}

    @property
    def tree(self) -> dict | None:
        """The container skeleton of a flat save (docs/FORMAT.md section 8), if stored."""
        return None

    @property
    def graph(self) -> dict | None:
        """The object graph of an object-based save (docs/FORMAT.md section 9), if stored."""
        return None

    @property
    def info(self) -> dict:
        """Who wrote it and how (library, version, workers...), where known."""
        return {}

    def describe(self) -> dict:
        """Format-specific facts for ``pyckpt inspect`` (files, chunk size...; pyckpt's
        also ``info``, with ``info["incremental"]`` for incremental saves)."""
        return {}

    def blocks(self, i: int) -> int:
        """How many stored blocks tensor i has (1 unless saved sharded)."""
        return 1

    @abc.abstractmethod
    def read(self, indices: Sequence[int], dsts: Sequence[Any]) -> None:
        """Fills each target (an array of the tensor's shape, or a ShardedArray block
        of it) with verified values; dtypes equal the stored ones (byte order is the
        caller's business: ``_dtypes.source_order_view``)."""

    def fill(self, indices: Sequence[int], dsts: Sequence[Any],
             boxes: Sequence[Sequence[int] | None] | None = None) -> None:
        """``read``, where targets may also be DeviceArrays (device memory): those
        are read through pinned bounce buffers and copied to their device,
        overlapped with the next reads (``device/loading.py``). ``boxes``: per
        target, None (it holds the whole tensor) or the offsets of the block of the
        tensor it holds (its shape: the target's), for targets that cannot be a
        ShardedArray themselves (a DeviceArray's block: torch DCP's read items)."""
        if boxes is None:
            fill_targets(self.read, indices, dsts)
            return

        def read(pos: Sequence[int], arrays: Sequence[Any]) -> None:
            self.read([indices[k] for k in pos],
                      [a if (b := boxes[k]) is None else ShardedArray(a, self.shape(indices[k]), b)
                       for k, a in zip(pos, arrays)])

        fill_targets(read, range(len(indices)), dsts)

    @abc.abstractmethod
    def read_new(self, indices: Sequence[int], mmap: bool = False) -> list[np.ndarray]:
        """Verified values in new arrays (``mmap``: read-only views of local files
        where the format can map them, verified through the map)."""

    @abc.abstractmethod
    def verify(self) -> None:
        """Reads everything and checks every checksum; raises on the first failure."""

    # -- shared helpers ----------------------------------------------------------------
    def index_of(self, key: str) -> int:
        """The position of ``key``; CheckpointKeyError naming the checkpoint when it is absent."""
        try:
            return self.index[key]
        except KeyError:
            raise CheckpointKeyError(f"key {key!r} not in checkpoint {self.url}") from None

    def nbytes(self, indices: Sequence[int] | None = None) -> int:
        """Bytes of the given tensors' values (all by default)."""
        idx = range(len(self.keys)) if indices is None else indices
        return sum(math.prod(self.shape(i)) * self.dtype(i).itemsize for i in idx)

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.url!r}: {len(self.keys)} tensors>"


class KeyedSource(CheckpointSource):
    """A source whose keys are a list fixed when it is opened: ``keys`` and ``index``
    come from ``_keys`` and ``_index``, which the opener sets."""

    _keys: list[str]
    _index: dict[str, int]

    @property
    def keys(self) -> Sequence[str]:
        return self._keys

    @property
    def index(self) -> Mapping[str, int]:
        return self._index
