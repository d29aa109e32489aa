"""The manifest: the JSON document inside the index file (docs/FORMAT.md, "Manifest").

Tensors and their stored blocks are kept as columns (one JSON list per field)
rather than one object per tensor: checkpoints with 100,000 small variables
then parse and validate in milliseconds, with numpy doing the range checks.

``Manifest.from_json`` is the one validator of untrusted manifests: every
size, offset, index and checksum list is checked before anything is
allocated or read, so a hostile index yields a CorruptCheckpointError and
never a crash, a hang or a huge allocation. docs/manifest.schema.json
describes the same document for other tools.
"""

from __future__ import annotations

import math
import re
from typing import Any, Callable, Iterator, Mapping, Sequence

import numpy as np

from .._dtypes import dtype_from_name

FORMAT_VERSION = 1
MAX_NDIM = 64
MAX_BYTES = 1 << 62
MAX_CHUNK = 1 << 31
_FILE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,254}$")

BadFn = Callable[[str], Exception]


class FileEntry:
    __slots__ = ("name", "size")

    def __init__(self, name: str, size: int) -> None:
        self.name = name
        self.size = size


class Block:
    """One stored, contiguous block of a tensor: the whole tensor, or (for a
    sharded array) the box ``[offsets, offsets + shape)`` of the global array."""

    __slots__ = ("file", "offset", "nbytes", "crcs", "offsets", "shape")

    def __init__(self, file: int, offset: int, nbytes: int, crcs: np.ndarray,
                 offsets: tuple[int, ...] | None = None,
                 shape: tuple[int, ...] | None = None) -> None:
        self.file = file
        self.offset = offset
        self.nbytes = nbytes
        self.crcs = crcs  # masked CRC32C per chunk, uint32
        self.offsets = offsets
        self.shape = shape


class TensorEntry:
    """A tensor of the manifest: key, dtype, global shape, stored blocks."""

    __slots__ = ("key", "index", "dtype", "dtype_name", "shape", "blocks")

    def __init__(self, key: str, index: int, dtype_name: str, dtype: np.dtype,
                 shape: tuple[int, ...], blocks: list[Block]) -> None:
        self.key = key
        self.index = index
        self.dtype_name = dtype_name
        self.dtype = dtype
        self.shape = shape
        self.blocks = blocks

    @property
    def nbytes(self) -> int:
        return math.prod(self.shape) * self.dtype.itemsize

    @property
    def sharded(self) -> bool:
        return len(self.blocks) != 1 or self.blocks[0].offsets is not None


class BlockTable:
    """Columns of every stored block. Tensor i owns blocks
    ``tensor_begin[i] .. tensor_begin[i+1]``; block j's CRCs are
    ``crcs[crc_begin[j] .. crc_begin[j+1]]``."""

    __slots__ = ("file", "offset", "nbytes", "box", "tensor_begin", "crc_begin", "crcs")

    def __init__(self, file: np.ndarray, offset: np.ndarray, nbytes: np.ndarray,
                 box: list | None, tensor_begin: np.ndarray, crcs: np.ndarray,
                 chunk_size: int) -> None:
        self.file = file
        self.offset = offset
        self.nbytes = nbytes
        self.box = box  # None, or per block None | (offsets, shape)
        self.tensor_begin = tensor_begin
        self.crcs = crcs
        nchunks = -(-nbytes // chunk_size)
        self.crc_begin = np.zeros(len(nbytes) + 1, dtype=np.int64)
        np.cumsum(nchunks, out=self.crc_begin[1:])

    def __len__(self) -> int:
        return len(self.nbytes)


class Manifest:
    """Everything a checkpoint's index says, validated."""

    def __init__(self, *, chunk_size: int, files: list[FileEntry], keys: list[str],
                 dtype_names: list[str], shapes: list[tuple[int, ...]], blocks: BlockTable,
                 tree: dict | None = None, metadata: dict | None = None,
                 graph: dict | None = None, info: dict | None = None) -> None:
        self.chunk_size = chunk_size
        self.files = files
        self.keys = keys
        self.dtype_names = dtype_names
        self._dtypes = {n: dtype_from_name(n) for n in set(dtype_names)}
        self.shapes = shapes
        self.blocks = blocks
        self.tree = tree
        self.metadata = metadata if metadata is not None else {}
        self.graph = graph
        self.info = info if info is not None else {}
        self._index: dict[str, int] | None = None

    # -- lookup ---------------------------------------------------------------------
    @property
    def index(self) -> dict[str, int]:
        if self._index is None:
            self._index = {k: i for i, k in enumerate(self.keys)}
        return self._index

    def dtype(self, i: int) -> np.dtype:
        return self._dtypes[self.dtype_names[i]]

    def entry(self, i: int) -> TensorEntry:
        b = self.blocks
        out = []
        for j in range(int(b.tensor_begin[i]), int(b.tensor_begin[i + 1])):
            box = b.box[j] if b.box is not None else None
            out.append(Block(int(b.file[j]), int(b.offset[j]), int(b.nbytes[j]),
                             b.crcs[b.crc_begin[j]:b.crc_begin[j + 1]],
                             tuple(box[0]) if box else None, tuple(box[1]) if box else None))
        name = self.dtype_names[i]
        return TensorEntry(self.keys[i], i, name, self._dtypes[name], self.shapes[i], out)

    @property
    def tensors(self) -> "TensorTable":
        return TensorTable(self)

    @property
    def all_plain(self) -> bool:
        """No tensor is stored as several blocks (nothing sharded)."""
        b = self.blocks
        return b.box is None or all(x is None for x in b.box)

    def is_plain(self, i: int) -> bool:
        b = self.blocks
        if b.tensor_begin[i + 1] - b.tensor_begin[i] != 1:
            return False
        return b.box is None or b.box[int(b.tensor_begin[i])] is None

    # -- writing ----------------------------------------------------------------------
    def to_json(self) -> dict:
        b = self.blocks
        nblocks = np.diff(b.tensor_begin)
        tensors: dict[str, Any] = {"key": self.keys, "dtype": self.dtype_names,
                                   "shape": [list(s) for s in self.shapes]}
        if len(nblocks) and (nblocks != 1).any():
            tensors["nblocks"] = nblocks.tolist()
        blocks: dict[str, Any] = {"file": b.file.tolist(), "offset": b.offset.tolist(),
                                  "nbytes": b.nbytes.tolist()}
        if b.box is not None:
            blocks["box"] = [None if x is None else [list(x[0]), list(x[1])] for x in b.box]
        return {
            "format": "pyckpt",
            "version": FORMAT_VERSION,
            "chunk_size": self.chunk_size,
            "info": self.info,
            "files": [{"name": f.name, "size": f.size} for f in self.files],
            "tensors": tensors,
            "blocks": blocks,
            "crc32c": b.crcs.tolist(),
            "tree": self.tree,
            "graph": self.graph,
            "metadata": self.metadata,
        }

    # -- reading ----------------------------------------------------------------------
    @classmethod
    def from_json(cls, doc: Any, bad: BadFn) -> "Manifest":
        return _Validator(doc, bad).manifest()


class TensorTable(Mapping[str, TensorEntry]):
    """``manifest.tensors``: key -> TensorEntry, built on access."""

    def __init__(self, m: Manifest) -> None:
        self._m = m

    def __getitem__(self, key: str) -> TensorEntry:
        return self._m.entry(self._m.index[key])

    def __contains__(self, key: object) -> bool:
        return key in self._m.index

    def __iter__(self) -> Iterator[str]:
        return iter(self._m.keys)

    def __len__(self) -> int:
        return len(self._m.keys)


# ---------------------------------------------------------------------------
# Validation of untrusted manifests
# ---------------------------------------------------------------------------

def _int_column(raw: Any, n: int | None, what: str, bad: BadFn, lo: int = 0,
                hi: int = MAX_BYTES) -> np.ndarray:
    """A JSON list of integers in [lo, hi] as int64, else CorruptCheckpointError."""
    if not isinstance(raw, list) or (n is not None and len(raw) != n):
        raise bad(f"{what} must be a list" + (f" of {n} integers" if n is not None else ""))
    if not raw:
        return np.zeros(0, dtype=np.int64)
    try:
        arr = np.array(raw)
    except (ValueError, OverflowError, TypeError):
        raise bad(f"{what} holds a value that is not an integer") from None
    if arr.dtype.kind not in "iu" or arr.ndim != 1:
        raise bad(f"{what} holds a value that is not an integer")
    if arr.dtype == np.uint64 and arr.max() > np.uint64(MAX_BYTES):
        raise bad(f"{what} holds a value out of range")
    arr = arr.astype(np.int64)
    if arr.min() < lo or arr.max() > hi:
        bad_i = int(np.nonzero((arr < lo) | (arr > hi))[0][0])
        raise bad(f"{what}[{bad_i}] = {int(arr[bad_i])} is out of range [{lo}, {hi}]")
    return arr


def _dims(raw: Any, what: str, bad: BadFn) -> tuple[int, ...]:
    if not isinstance(raw, list) or len(raw) > MAX_NDIM:
        raise bad(f"{what} must be a list of at most {MAX_NDIM} integers")
    for d in raw:
        if type(d) is not int or not (0 <= d <= MAX_BYTES):
            raise bad(f"{what} has a bad dimension {d!r}")
    return tuple(raw)


class _Validator:
    def __init__(self, doc: Any, bad: BadFn) -> None:
        self.doc = doc
        self.bad = bad

    def manifest(self) -> Manifest:
        doc, bad = self.doc, self.bad
        if not isinstance(doc, dict) or doc.get("format") != "pyckpt":
            raise bad("not a pyckpt manifest")
        version = doc.get("version")
        if type(version) is not int or version < 1:
            raise bad(f"bad manifest version {version!r}")
        if version > FORMAT_VERSION:
            raise bad(f"manifest version {version} is newer than this pyckpt supports")
        chunk = doc.get("chunk_size")
        if type(chunk) is not int or not (1 <= chunk <= MAX_CHUNK):
            raise bad(f"bad chunk_size {chunk!r}")
        files = self.files(doc.get("files"))
        keys, dtype_names, shapes, nblocks = self.tensors(doc.get("tensors"))
        blocks = self.blocks(doc.get("blocks"), doc.get("crc32c"), keys, dtype_names, shapes,
                             nblocks, files, chunk)
        for name in ("tree", "graph", "metadata", "info"):
            if doc.get(name) is not None and not isinstance(doc.get(name), dict):
                raise bad(f"'{name}' must be an object or null")
        return Manifest(chunk_size=chunk, files=files, keys=keys, dtype_names=dtype_names,
                        shapes=shapes, blocks=blocks, tree=doc.get("tree"),
                        metadata=doc.get("metadata") or {}, graph=doc.get("graph"),
                        info=doc.get("info") or {})

    def files(self, raw: Any) -> list[FileEntry]:
        bad = self.bad
        if not isinstance(raw, list) or len(raw) > 1_000_000:
            raise bad("'files' must be a list")
        out, names = [], set()
        for i, f in enumerate(raw):
            if not isinstance(f, dict):
                raise bad(f"file entry {i} must be an object")
            name, size = f.get("name"), f.get("size")
            if not isinstance(name, str) or not _FILE_NAME.match(name) or name == "pyckpt.index":
                raise bad(f"file entry {i} has an unsafe name {name!r}")
            if name in names:
                raise bad(f"file {name!r} is listed twice")
            names.add(name)
            if type(size) is not int or not (0 <= size <= MAX_BYTES):
                raise bad(f"file {name!r} has a bad size {size!r}")
            out.append(FileEntry(name, size))
        return out

    def tensors(self, raw: Any) -> tuple[list[str], list[str], list[tuple[int, ...]], np.ndarray]:
        from ..tree import validate_key

        bad = self.bad
        if not isinstance(raw, dict):
            raise bad("'tensors' must be an object of columns")
        keys, dts, shp = raw.get("key"), raw.get("dtype"), raw.get("shape")
        if not isinstance(keys, list) or not isinstance(dts, list) or not isinstance(shp, list):
            raise bad("'tensors' needs the lists 'key', 'dtype' and 'shape'")
        n = len(keys)
        if len(dts) != n or len(shp) != n:
            raise bad("'tensors' columns differ in length")
        for k in keys:
            try:
                validate_key(k)
            except (TypeError, ValueError) as e:
                raise bad(f"invalid key: {e}") from None
        if len(set(keys)) != n:
            raise bad("a key is listed twice")
        for name in set(map(str, dts)):
            try:
                dtype_from_name(name)
            except ValueError as e:
                raise bad(f"tensor dtype: {e}") from None
        for k, d in zip(keys, dts):
            if not isinstance(d, str):
                raise bad(f"tensor {k!r}: dtype must be a string")
        shapes = [_dims(s, f"tensor {k!r}: shape", bad) for k, s in zip(keys, shp)]
        if "nblocks" in raw:
            nblocks = _int_column(raw["nblocks"], n, "'tensors.nblocks'", bad, lo=1, hi=1 << 31)
        else:
            nblocks = np.ones(n, dtype=np.int64)
        return keys, dts, shapes, nblocks

    def blocks(self, raw: Any, raw_crcs: Any, keys: list[str], dts: list[str],
               shapes: list[tuple[int, ...]], nblocks: np.ndarray, files: list[FileEntry],
               chunk: int) -> BlockTable:
        bad = self.bad
        if not isinstance(raw, dict):
            raise bad("'blocks' must be an object of columns")
        nb = int(nblocks.sum())
        file = _int_column(raw.get("file"), nb, "'blocks.file'", bad, hi=1 << 31)
        offset = _int_column(raw.get("offset"), nb, "'blocks.offset'", bad)
        nbytes = _int_column(raw.get("nbytes"), nb, "'blocks.nbytes'", bad)
        tensor_begin = np.zeros(len(keys) + 1, dtype=np.int64)
        np.cumsum(nblocks, out=tensor_begin[1:])
        owner = np.repeat(np.arange(len(keys)), nblocks)

        def key_of(j: int) -> str:
            return keys[int(owner[j])]

        itemsize = {n: dtype_from_name(n).itemsize for n in set(dts)}
        box = raw.get("box")
        expected = np.empty(nb, dtype=np.int64)
        if box is None:
            if (nblocks != 1).any():
                raise bad("tensors with several blocks need 'blocks.box'")
            for i, (d, s) in enumerate(zip(dts, shapes)):
                total = math.prod(s) * itemsize[d]
                if total > MAX_BYTES:
                    raise bad(f"tensor {keys[i]!r}: shape {s} is too large")
                expected[i] = total
        else:
            box = self.boxes(box, nb, keys, dts, shapes, tensor_begin, itemsize, expected)
        wrong = np.nonzero(expected != nbytes)[0]
        if len(wrong):
            j = int(wrong[0])
            raise bad(f"tensor {key_of(j)!r}: block stores {int(nbytes[j])} bytes, its shape "
                      f"and dtype need {int(expected[j])}")
        stored = nbytes > 0
        sizes = np.array([f.size for f in files] + [0], dtype=np.int64)
        bad_file = stored & (file >= len(files))
        if bad_file.any():
            j = int(np.nonzero(bad_file)[0][0])
            raise bad(f"tensor {key_of(j)!r}: file index {int(file[j])} out of range")
        end = offset + nbytes
        outside = stored & (end > sizes[np.minimum(file, len(files))])
        if outside.any():
            j = int(np.nonzero(outside)[0][0])
            raise bad(f"tensor {key_of(j)!r}: bytes [{int(offset[j])}, {int(end[j])}) lie "
                      f"outside file {files[int(file[j])].name!r} of {files[int(file[j])].size} bytes")
        self.overlaps(file, offset, end, stored, key_of, files)
        nchunks = -(-nbytes // chunk)
        crcs = _int_column(raw_crcs, int(nchunks.sum()), "'crc32c'", bad, hi=(1 << 32) - 1)
        return BlockTable(file, offset, nbytes, box, tensor_begin, crcs.astype(np.uint32), chunk)

    def boxes(self, raw: Any, nb: int, keys: list[str], dts: list[str],
              shapes: list[tuple[int, ...]], tensor_begin: np.ndarray, itemsize: dict,
              expected: np.ndarray) -> list:
        bad = self.bad
        if not isinstance(raw, list) or len(raw) != nb:
            raise bad(f"'blocks.box' must be a list of {nb} entries")
        out: list = [None] * nb
        for i, key in enumerate(keys):
            shape = shapes[i]
            b0, b1 = int(tensor_begin[i]), int(tensor_begin[i + 1])
            if b1 - b0 == 1 and raw[b0] is None:
                total = math.prod(shape) * itemsize[dts[i]]
                if total > MAX_BYTES:
                    raise bad(f"tensor {key!r}: shape {shape} is too large")
                expected[b0] = total
                continue
            boxes = []
            for j in range(b0, b1):
                x = raw[j]
                if not isinstance(x, list) or len(x) != 2:
                    raise bad(f"tensor {key!r}: block {j - b0} needs a box [offsets, shape]")
                off = _dims(x[0], f"tensor {key!r} block {j - b0}: offsets", bad)
                shp = _dims(x[1], f"tensor {key!r} block {j - b0}: shape", bad)
                if len(off) != len(shape) or len(shp) != len(shape):
                    raise bad(f"tensor {key!r} block {j - b0}: rank differs from the tensor's")
                if any(o + s > g for o, s, g in zip(off, shp, shape)):
                    raise bad(f"tensor {key!r} block {j - b0}: box {off}+{shp} exceeds {shape}")
                expected[j] = math.prod(shp) * itemsize[dts[i]]
                boxes.append((off, shp))
                out[j] = (off, shp)
            from ..sharding.boxes import check_partition

            problem = check_partition(shape, boxes)
            if problem:
                raise bad(f"tensor {key!r}: {problem}")
        return out

    def overlaps(self, file: np.ndarray, offset: np.ndarray, end: np.ndarray, stored: np.ndarray,
                 key_of: Callable[[int], str], files: list[FileEntry]) -> None:
        idx = np.nonzero(stored)[0]
        if len(idx) < 2:
            return
        order = idx[np.lexsort((offset[idx], file[idx]))]
        f, o, e = file[order], offset[order], end[order]
        clash = (f[1:] == f[:-1]) & (o[1:] < e[:-1])
        if clash.any():
            k = int(np.nonzero(clash)[0][0])
            a, b = int(order[k]), int(order[k + 1])
            raise self.bad(f"tensors {key_of(a)!r} and {key_of(b)!r} overlap in file "
                           f"{files[int(file[a])].name!r} at bytes [{int(offset[b])}, "
                           f"{int(min(end[a], end[b]))})")


def build_manifest(*, chunk_size: int, files: list[FileEntry], keys: Sequence[str],
                   dtype_names: Sequence[str], shapes: Sequence[tuple[int, ...]],
                   file: np.ndarray, offset: np.ndarray, nbytes: np.ndarray, crcs: np.ndarray,
                   nblocks: np.ndarray | None = None, box: list | None = None,
                   tree: dict | None = None, metadata: dict | None = None,
                   graph: dict | None = None, info: dict | None = None) -> Manifest:
    """A Manifest from columns produced by a writer (trusted input)."""
    n = len(keys)
    if nblocks is None:
        nblocks = np.ones(n, dtype=np.int64)
    tensor_begin = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(nblocks, out=tensor_begin[1:])
    table = BlockTable(np.asarray(file, dtype=np.int64), np.asarray(offset, dtype=np.int64),
                       np.asarray(nbytes, dtype=np.int64), box, tensor_begin,
                       np.asarray(crcs, dtype=np.uint32), chunk_size)
    return Manifest(chunk_size=chunk_size, files=files, keys=list(keys),
                    dtype_names=list(dtype_names), shapes=[tuple(s) for s in shapes],
                    blocks=table, tree=tree, metadata=metadata, graph=graph, info=info)
