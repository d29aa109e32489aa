"""The read plan: what one load reads from an opened checkpoint, and where it lands.

The load doors (``pyckpt.load`` with or without ``into=`` or ``device=``,
``Checkpoint.restore``, ``pyckpt.dcp.StorageReader``, pyckpt.lightning's
``load_checkpoint``, which loads through ``pyckpt.load``'s code) turn what they
were asked for into ``ReadPlan``s and land the bytes through
``ReadPlan.execute``; none of them calls the source's ``read_new`` or ``fill``
itself. ``execute`` picks the read from the destinations: none (``dsts`` None)
-> ``read_new`` (new host arrays; ``mmap``: views of the file where the format
maps it); given -> ``fill``, which reads host targets (arrays, ShardedArray
blocks) directly and device targets (DeviceArrays) through pinned bounce
buffers (``device/loading.py``, the one place that tells them apart), with
``boxes`` for targets holding a block of a stored tensor. The readers that are
not load doors (``CheckpointReader.get_tensor``, ``transfer``, the interop
converters, the safetensors exporter's read-ahead) read through it too; only a
format's reading of its own files (``codecs/``, ``engine/reader.py``) calls the
reads directly.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

from .source import CheckpointSource

__all__ = ["ReadPlan"]


@dataclass(frozen=True)
class ReadPlan:
    """One batch of reads: the stored tensors ``indices`` of ``source`` (positions in
    its ``keys``, read in this order), landing in ``dsts`` (per index: a host array,
    a ShardedArray block or a DeviceArray; None for the whole plan: new arrays).
    ``boxes`` (with ``dsts`` only): per destination, None or the offsets of the
    block of the stored tensor it holds. ``mmap`` (new arrays only): read-only
    views of local files where the format can map them."""

    source: CheckpointSource
    indices: Sequence[int]
    dsts: Sequence[Any] | None = None
    boxes: Sequence[Sequence[int] | None] | None = None
    mmap: bool = False

    def __post_init__(self) -> None:
        if self.dsts is None:
            if self.boxes is not None:
                raise ValueError("a read plan into new arrays takes no boxes")
        else:
            if self.mmap:
                raise ValueError("mmap applies to a read plan into new arrays only")
            if len(self.dsts) != len(self.indices):
                raise ValueError(f"a read plan of {len(self.indices)} tensor(s) has "
                                 f"{len(self.dsts)} destination(s)")
            if self.boxes is not None and len(self.boxes) != len(self.indices):
                raise ValueError(f"a read plan of {len(self.indices)} tensor(s) has "
                                 f"{len(self.boxes)} box(es)")

    def execute(self) -> list[Any]:
        """Lands the plan's bytes, verified, and returns what holds each value, in the
        plan's order: the new arrays (``dsts`` None), or the destinations once every
        one holds its value (device targets: landed on their device). The one place
        a load reads from its source."""
        src = self.source
        if self.dsts is None:  # without mmap, the read_new(indices) every source takes
            return src.read_new(self.indices, True) if self.mmap else src.read_new(self.indices)
        src.fill(self.indices, self.dsts, self.boxes)
        return list(self.dsts)
