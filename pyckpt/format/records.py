"""The manifest's records and columns (docs/FORMAT.md, "Manifest"): a data file,
a tensor and its stored blocks, and the numpy columns a manifest keeps them in
(``BlockTable``, ``DtypeColumn``, ``ShapeColumn``), with the format's limits.

``manifest.py`` holds the ``Manifest`` built from them; ``validate.py`` builds
them from an untrusted document. Every name here is importable from
``pyckpt.format.manifest`` too.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Iterator, Sequence, overload

import numpy as np

#: the newest format version this pyckpt reads and writes; 1 unless the index
#: references data files of other checkpoints (docs/FORMAT.md section 12)
FORMAT_VERSION = 2
#: the version of indexes without references (what readers older than references read)
BASE_VERSION = 1
MAX_NDIM = 64
MAX_BYTES = 1 << 62
MAX_CHUNK = 1 << 31

BadFn = Callable[[str], Exception]


def span(shape: Sequence[int], itemsize: int) -> int:
    """Bytes of the shape with every zero dimension counted as 1: what numpy needs
    to be able to represent it (``np.empty((0, 2**62), 'f4')`` is "too big"); a
    shape whose span exceeds MAX_BYTES is beyond the format's limits."""
    return math.prod(max(d, 1) for d in shape) * itemsize


# eq=False, repr=False: records compare by identity (and stay hashable), as before
@dataclass(slots=True, eq=False, repr=False)
class FileEntry:
    """A data file of the checkpoint: its ``name`` and ``size`` in bytes, in the
    checkpoint's own directory, or (``at``, a reference of an incremental save) in the
    sibling checkpoint directory ``at`` of the same run directory."""

    name: str
    size: int
    at: str | None = None


@dataclass(slots=True, eq=False, repr=False)
class Block:
    """One stored, contiguous block of a tensor: the whole tensor, or (for a
    sharded array) the box ``[offsets, offsets + shape)`` of the global array."""

    file: int
    offset: int
    nbytes: int
    crcs: np.ndarray  # masked CRC32C per chunk, uint32
    offsets: tuple[int, ...] | None = None
    shape: tuple[int, ...] | None = None


@dataclass(slots=True, eq=False, repr=False)
class TensorEntry:
    """A tensor of the manifest: key, dtype, global shape, stored blocks."""

    key: str
    index: int
    dtype_name: str
    dtype: np.dtype
    shape: tuple[int, ...]
    blocks: list[Block]

    @property
    def nbytes(self) -> int:
        """Bytes of the whole tensor's value (global shape times item size)."""
        return math.prod(self.shape) * self.dtype.itemsize

    @property
    def sharded(self) -> bool:
        """Whether the tensor is stored as blocks of a sharded array (several blocks, or a
        box)."""
        return len(self.blocks) != 1 or self.blocks[0].offsets is not None


class BlockTable:
    """Columns of every stored block. Tensor i owns blocks
    ``tensor_begin[i] .. tensor_begin[i+1]``; block j's CRCs are
    ``crcs[crc_begin[j] .. crc_begin[j+1]]``."""

    __slots__ = ("file", "offset", "nbytes", "box", "tensor_begin", "crc_begin", "crcs",
                 "hashes")

    def __init__(self, file: np.ndarray, offset: np.ndarray, nbytes: np.ndarray,
                 box: list | None, tensor_begin: np.ndarray, crcs: np.ndarray,
                 chunk_size: int, hashes: list[str] | None = None) -> None:
        self.file = file
        self.offset = offset
        self.nbytes = nbytes
        self.box = box  # None, or per block None | (offsets, shape)
        self.tensor_begin = tensor_begin
        self.crcs = crcs
        # None, or per block the 128-bit fingerprints of its chunks as one hex string
        # (docs/FORMAT.md section 12): what an incremental save compares with
        self.hashes = hashes
        nchunks = -(-nbytes // chunk_size)
        self.crc_begin = np.zeros(len(nbytes) + 1, dtype=np.int64)
        np.cumsum(nchunks, out=self.crc_begin[1:])

    def __len__(self) -> int:
        return len(self.nbytes)

        return len(self.nbytes)


class DtypeColumn(Sequence[str]):
    """The stored dtype name of every tensor, kept as a small table of names and a
    code per tensor (``manifest.dtype_names``)."""

    __slots__ = ("names", "codes")

    def __init__(self, names: list[str], codes: np.ndarray) -> None:
        self.names = names    # distinct names
        self.codes = codes    # per tensor, an index into names

    @classmethod
    def of(cls, names: Iterable[str]) -> "DtypeColumn":
        """A column of the given dtype names (``names`` itself when already a DtypeColumn)."""
        if isinstance(names, DtypeColumn):
            return names
        names = list(names)
        table = {n: i for i, n in enumerate(dict.fromkeys(names))}
        codes = np.fromiter(map(table.__getitem__, names), dtype=np.int32, count=len(names))
        return cls(list(table), codes)

    @overload
    def __getitem__(self, i: int) -> str: ...
    @overload
    def __getitem__(self, i: slice) -> list[str]: ...

    def __getitem__(self, i: Any) -> Any:
        if isinstance(i, slice):
            return [self.names[c] for c in self.codes[i].tolist()]
        return self.names[self.codes[i]]

    def __len__(self) -> int:
        return len(self.codes)

    def __iter__(self) -> Iterator[str]:
        names = self.names
        return (names[c] for c in self.codes.tolist())

    def tolist(self) -> list[str]:
        """Every tensor's dtype name, as a list."""
        return list(self)


class ShapeColumn(Sequence[tuple[int, ...]]):
    """The shape of every tensor, flattened: tensor i's dimensions are
    ``dims[begin[i]:begin[i+1]]`` (``manifest.shapes``; items are built as tuples)."""

    __slots__ = ("dims", "begin")

    def __init__(self, dims: np.ndarray, begin: np.ndarray) -> None:
        self.dims = dims      # int64
        self.begin = begin    # int64, len n + 1

    @classmethod
    def of(cls, shapes: Iterable[Sequence[int]]) -> "ShapeColumn":
        """A column of the given shapes (``shapes`` itself when already a ShapeColumn)."""
        if isinstance(shapes, ShapeColumn):
            return shapes
        shapes = [tuple(s) for s in shapes]
        begin = np.zeros(len(shapes) + 1, dtype=np.int64)
        np.cumsum(np.fromiter(map(len, shapes), dtype=np.int64, count=len(shapes)),
                  out=begin[1:])
        dims = np.fromiter(itertools.chain.from_iterable(shapes), dtype=np.int64,
                           count=int(begin[-1]))
        return cls(dims, begin)

    @overload
    def __getitem__(self, i: int) -> tuple[int, ...]: ...
    @overload
    def __getitem__(self, i: slice) -> list[tuple[int, ...]]: ...

    def __getitem__(self, i: Any) -> Any:
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(len(self)))]
        if i < 0:
            i += len(self)
        if not 0 <= i < len(self):
            raise IndexError("shape index out of range")
        return tuple(self.dims[self.begin[i]:self.begin[i + 1]].tolist())

    def __len__(self) -> int:
        return len(self.begin) - 1

    def __iter__(self) -> Iterator[tuple[int, ...]]:
        dims, b = self.dims.tolist(), self.begin.tolist()
        return (tuple(dims[b[i]:b[i + 1]]) for i in range(len(b) - 1))

    def ndim(self, i: int) -> int:
        """The number of dimensions of tensor i."""
        return int(self.begin[i + 1] - self.begin[i])

    def tolists(self) -> list[list[int]]:
        """Every shape as a list of ints (the manifest's JSON form)."""
        dims, b = self.dims.tolist(), self.begin.tolist()
        return [dims[b[i]:b[i + 1]] for i in range(len(b) - 1)]
