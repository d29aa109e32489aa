"""The manifest: the JSON document inside the index file (docs/FORMAT.md, "Manifest").

Tensors and their stored blocks are kept as columns (one JSON list per field)
rather than one object per tensor: checkpoints with 100,000 small variables
then parse and validate in milliseconds, with numpy doing the range checks.

``Manifest.from_json`` is the one validator of untrusted manifests: every
size, offset, index and checksum list is checked before anything is
allocated or read, so a hostile index yields a CorruptCheckpointError and
never a crash, a hang or a huge allocation. docs/manifest.schema.json
describes the same document for other tools.

Memory per tensor is bounded and small (docs/FORMAT.md, "Limits"): a validated
manifest keeps its keys as one list of strings and everything else in numpy
columns (dtype codes, flattened shapes, blocks); per-tensor objects
(``TensorEntry``, shape tuples, the key -> index dict) are built on demand.
The JSON document's per-tensor lists are dropped as soon as they are converted.
"""

from __future__ import annotations

import contextlib
import gc
import itertools
import json
import math
import re
from typing import Any, Callable, Iterable, Iterator, Mapping, Sequence, overload

import numpy as np

from .._dtypes import dtype_from_name
from ..sharded.boxes import check_partition
from ..tree import validate_keys

FORMAT_VERSION = 1
MAX_NDIM = 64
MAX_BYTES = 1 << 62
MAX_CHUNK = 1 << 31
_FILE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,254}$")

BadFn = Callable[[str], Exception]


class FileEntry:
    """A data file of the checkpoint: its ``name`` inside the checkpoint directory and its
    ``size`` in bytes."""

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


class _LazyJSON:
    """The text of a validated JSON object, parsed when first used."""

    __slots__ = ("text",)

    def __init__(self, text: str) -> None:
        self.text = text


class Manifest:
    """Everything a checkpoint's index says, validated.

    ``keys`` is a list of strings; ``dtype_names`` and ``shapes`` are sequences
    backed by numpy columns (``DtypeColumn``, ``ShapeColumn``); ``index`` (key ->
    position) and ``entry(i)`` are built on first use."""

    _tree: Any  # dict | None, or a _LazyJSON until first used
    _graph: Any

    def __init__(self, *, chunk_size: int, files: list[FileEntry], keys: Sequence[str],
                 dtype_names: Iterable[str], shapes: Iterable[Sequence[int]], blocks: BlockTable,
                 tree: dict | None = None, metadata: dict | None = None,
                 graph: dict | None = None, info: dict | None = None) -> None:
        self.chunk_size = chunk_size
        self.files = files
        self.keys = keys if isinstance(keys, list) else list(keys)
        self.dtype_names = DtypeColumn.of(dtype_names)
        self._dtype_table = [dtype_from_name(n) for n in self.dtype_names.names]
        self.shapes = ShapeColumn.of(shapes)
        self.blocks = blocks
        self.tree = tree
        self.metadata = metadata if metadata is not None else {}
        self.graph = graph
        self.info = info if info is not None else {}
        self._index: dict[str, int] | None = None

    # -- tree and graph, kept as text until used (their size grows with the tensors) ---
    @property
    def tree(self) -> dict | None:
        """The container skeleton of a flat save (docs/FORMAT.md section 8), or None;
        parsed on first access."""
        if isinstance(self._tree, _LazyJSON):
            self._tree = json.loads(self._tree.text)
        return self._tree

    @tree.setter
    def tree(self, value: Any) -> None:
        """Sets the skeleton (a dict or None; ``from_json`` keeps the unparsed text)."""
        self._tree = value

    @property
    def graph(self) -> dict | None:
        """The object graph of an object-based save (docs/FORMAT.md section 9), or None;
        parsed on first access."""
        if isinstance(self._graph, _LazyJSON):
            self._graph = json.loads(self._graph.text)
        return self._graph

    @graph.setter
    def graph(self, value: Any) -> None:
        """Sets the object graph (a dict or None; ``from_json`` keeps the unparsed text)."""
        self._graph = value

    # -- lookup ---------------------------------------------------------------------
    @property
    def index(self) -> dict[str, int]:
        """``{key: position}`` of every tensor, built on first use."""
        if self._index is None:
            self._index = dict(zip(self.keys, range(len(self.keys))))
        return self._index

    def dtype(self, i: int) -> np.dtype:
        """The numpy dtype of tensor i, as stored."""
        return self._dtype_table[self.dtype_names.codes[i]]

    def entry(self, i: int) -> TensorEntry:
        """Tensor i as a TensorEntry with its blocks (built on each call)."""
        b = self.blocks
        out = []
        for j in range(int(b.tensor_begin[i]), int(b.tensor_begin[i + 1])):
            box = b.box[j] if b.box is not None else None
            out.append(Block(int(b.file[j]), int(b.offset[j]), int(b.nbytes[j]),
                             b.crcs[b.crc_begin[j]:b.crc_begin[j + 1]],
                             tuple(box[0]) if box else None, tuple(box[1]) if box else None))
        return TensorEntry(self.keys[i], i, self.dtype_names[i], self.dtype(i), self.shapes[i], out)

    @property
    def tensors(self) -> "TensorTable":
        """A read-only ``{key: TensorEntry}`` mapping of every tensor (entries built on
        access)."""
        return TensorTable(self)

    @property
    def all_plain(self) -> bool:
        """No tensor is stored as several blocks (nothing sharded)."""
        b = self.blocks
        return b.box is None or all(x is None for x in b.box)

    def is_plain(self, i: int) -> bool:
        """Whether tensor i is stored as one whole block (not sharded)."""
        b = self.blocks
        if b.tensor_begin[i + 1] - b.tensor_begin[i] != 1:
            return False
        return b.box is None or b.box[int(b.tensor_begin[i])] is None

    # -- writing ----------------------------------------------------------------------
    def to_json(self) -> dict:
        """The manifest as the JSON document of the index file (docs/FORMAT.md, "Manifest")."""
        b = self.blocks
        nblocks = np.diff(b.tensor_begin)
        tensors: dict[str, Any] = {"key": self.keys, "dtype": self.dtype_names.tolist(),
                                   "shape": self.shapes.tolists()}
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
        """Validates a parsed manifest. The per-tensor lists of ``doc`` are consumed
        (replaced by None once converted) to keep the peak memory low."""
        return _Validator(doc, bad).manifest()

    @classmethod
    def from_text(cls, text: str, bad: BadFn) -> "Manifest":
        """Parses (json.JSONDecodeError, RecursionError) and validates a manifest,
        member by member (see ``_Validator.from_text``)."""
        return _Validator(None, bad).from_text(text)


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
    """A JSON list of integers in [lo, hi] as int64, else CorruptCheckpointError.
    JSON booleans and floats are not integers, even among integers."""
    if not isinstance(raw, list) or (n is not None and len(raw) != n):
        raise bad(f"{what} must be a list" + (f" of {n} integers" if n is not None else ""))
    if not raw:
        return np.zeros(0, dtype=np.int64)
    if set(map(type, raw)) != {int}:
        j = next(j for j, x in enumerate(raw) if type(x) is not int)
        raise bad(f"{what}[{j}] = {raw[j]!r} is not an integer")
    try:
        arr = np.array(raw, dtype=np.int64)
    except OverflowError:
        j = next(j for j, x in enumerate(raw) if not lo <= x <= hi)
        raise bad(f"{what}[{j}] = {raw[j]} is out of range [{lo}, {hi}]") from None
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


def _span(shape: Sequence[int], itemsize: int) -> int:
    """Bytes of the shape with every zero dimension counted as 1: what numpy needs
    to be able to represent it (``np.empty((0, 2**62), 'f4')`` is "too big")."""
    return math.prod(max(d, 1) for d in shape) * itemsize


class _TensorColumns:
    __slots__ = ("keys", "dtypes", "shapes", "nbytes", "nblocks")

    def __init__(self, keys: list[str], dtypes: DtypeColumn, shapes: ShapeColumn,
                 nbytes: np.ndarray, nblocks: np.ndarray) -> None:
        self.keys, self.dtypes, self.shapes = keys, dtypes, shapes
        self.nbytes, self.nblocks = nbytes, nblocks


class _Failed:
    """A member whose conversion failed: manifest() raises the error after the
    checks that come first (format, version...), so that, say, a newer version
    is reported as such rather than as a malformed column."""

    __slots__ = ("error",)

    def __init__(self, error: Exception) -> None:
        self.error = error


class _BlockColumns:
    __slots__ = ("file", "offset", "nbytes", "box")

    def __init__(self, file: np.ndarray, offset: np.ndarray, nbytes: np.ndarray,
                 box: Any) -> None:
        self.file, self.offset, self.nbytes, self.box = file, offset, nbytes, box


_WS = re.compile(r"[ \t\n\r]*")
_scanstring: Callable[[str, int], tuple[str, int]] = getattr(json.decoder, "scanstring")


@contextlib.contextmanager
def _no_cyclic_gc() -> Iterator[None]:
    """Pauses the cyclic garbage collector (process-wide; re-enabled only by the caller
    that paused it): parsing allocates millions of containers, none in a cycle."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


def _skip_ws(text: str, pos: int) -> int:
    return _WS.match(text, pos).end()  # type: ignore[union-attr]


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
        for name in ("tree", "graph", "metadata", "info"):
            self.check_object(name, doc.get(name))
        files = self.files(doc.get("files"))
        tensors = self.converted("tensors", doc)
        blocks = self.blocks(self.converted("blocks", doc), self.converted("crc32c", doc),
                             tensors, files, chunk)
        return Manifest(chunk_size=chunk, files=files, keys=tensors.keys,
                        dtype_names=tensors.dtypes, shapes=tensors.shapes, blocks=blocks,
                        tree=doc.get("tree"), metadata=doc.get("metadata") or {},
                        graph=doc.get("graph"), info=doc.get("info") or {})

    def check_object(self, name: str, value: Any) -> None:
        if value is not None and not isinstance(value, (dict, _LazyJSON)):
            raise self.bad(f"'{name}' must be an object or null")

    def converted(self, name: str, doc: dict) -> Any:
        """The compact form of a per-tensor member of doc (converted once)."""
        value = doc.get(name)
        if isinstance(value, _Failed):  # reported now, in the order of the checks
            raise value.error
        if not isinstance(value, (_TensorColumns, _BlockColumns, np.ndarray)):
            value = doc[name] = self.convert(name, value)
        return value

    def convert(self, name: str, raw: Any) -> Any:
        if name == "tensors":
            return self.tensor_columns(raw)
        if name == "blocks":
            return self.block_columns(raw)
        assert name == "crc32c"
        return _int_column(raw, None, "'crc32c'", self.bad, hi=(1 << 32) - 1)

    # -- the streaming form: members converted as soon as they are parsed ---------------
    def from_text(self, text: str) -> Manifest:
        """Parses and validates the manifest's JSON text. Top-level members are parsed
        one at a time, and the per-tensor columns converted to their compact form
        right away, so the whole document never exists as Python objects at once;
        ``tree`` and ``graph`` are kept as text and parsed when first used."""
        with _no_cyclic_gc():  # JSON makes no cycles; collections would double the time
            self.doc = self.parse(text)
        return self.manifest()

    def parse(self, text: str) -> dict:
        scan: Callable[[str, int], tuple[Any, int]] = getattr(json.JSONDecoder(), "scan_once")
        pos = _skip_ws(text, 0)
        if not text.startswith("{", pos):
            return json.loads(text)  # not an object: manifest() reports it
        doc: dict[str, Any] = {}

        def value(at: int) -> tuple[Any, int]:
            try:
                return scan(text, at)
            except StopIteration:
                raise json.JSONDecodeError("Expecting value", text, at) from None

        pos = _skip_ws(text, pos + 1)
        if text.startswith("}", pos):
            pos += 1
        else:
            while True:
                if not text.startswith('"', pos):
                    raise json.JSONDecodeError("Expecting property name enclosed in double "
                                               "quotes", text, pos)
                name, pos = _scanstring(text, pos + 1)
                pos = _skip_ws(text, pos)
                if not text.startswith(":", pos):
                    raise json.JSONDecodeError("Expecting ':' delimiter", text, pos)
                start = _skip_ws(text, pos + 1)
                obj, pos = value(start)
                if name in ("tensors", "blocks", "crc32c"):
                    try:
                        obj = self.convert(name, obj)
                    except Exception as e:  # noqa: BLE001 - raised by manifest(), in order
                        obj = _Failed(e)
                elif name in ("tree", "graph") and isinstance(obj, dict):
                    obj = _LazyJSON(text[start:pos])
                doc[name] = obj
                del obj
                pos = _skip_ws(text, pos)
                if text.startswith(",", pos):
                    pos = _skip_ws(text, pos + 1)
                    continue
                if text.startswith("}", pos):
                    pos += 1
                    break
                raise json.JSONDecodeError("Expecting ',' delimiter", text, pos)
        if _skip_ws(text, pos) != len(text):
            raise json.JSONDecodeError("Extra data", text, pos)
        return doc

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

    # -- tensors: whole columns at a time; a slow per-tensor pass only names the culprit --
    def tensor_columns(self, raw: Any) -> "_TensorColumns":
        bad = self.bad
        if not isinstance(raw, dict):
            raise bad("'tensors' must be an object of columns")
        keys, dts, shp = raw.get("key"), raw.get("dtype"), raw.get("shape")
        if not isinstance(keys, list) or not isinstance(dts, list) or not isinstance(shp, list):
            raise bad("'tensors' needs the lists 'key', 'dtype' and 'shape'")
        n = len(keys)
        if len(dts) != n or len(shp) != n:
            raise bad("'tensors' columns differ in length")
        self.check_keys(keys)
        dtypes = self.dtype_column(keys, dts)
        raw["dtype"] = dts = None  # consumed: free the per-tensor strings now
        shapes = self.shape_column(keys, shp)
        raw["shape"] = shp = None
        itemsize = np.array([dtype_from_name(d).itemsize for d in dtypes.names] or [0],
                            dtype=np.int64)[dtypes.codes]
        nbytes = self.tensor_bytes(keys, shapes, itemsize)
        if "nblocks" in raw:
            nblocks = _int_column(raw["nblocks"], n, "'tensors.nblocks'", bad, lo=1, hi=1 << 31)
        else:
            nblocks = np.ones(n, dtype=np.int64)
        return _TensorColumns(keys, dtypes, shapes, nbytes, nblocks)

    def check_keys(self, keys: list) -> None:
        try:
            validate_keys(keys)
        except (TypeError, ValueError) as e:
            raise self.bad(f"invalid key: {e}" if "listed twice" not in str(e) else str(e)) from None

    def dtype_column(self, keys: list[str], dts: list) -> DtypeColumn:
        bad = self.bad
        try:
            distinct = list(dict.fromkeys(dts))
        except TypeError:  # an unhashable value (a list...)
            distinct = [None]
        for name in distinct:
            if not isinstance(name, str):
                j = next(j for j, d in enumerate(dts) if not isinstance(d, str))
                raise bad(f"tensor {keys[j]!r}: dtype must be a string, not {dts[j]!r}")
            try:
                dtype_from_name(name)
            except ValueError as e:
                raise bad(f"tensor {keys[dts.index(name)]!r}: {e}") from None
        table = {name: i for i, name in enumerate(distinct)}
        codes = np.fromiter(map(table.__getitem__, dts), dtype=np.int32, count=len(dts))
        return DtypeColumn(distinct, codes)

    def shape_column(self, keys: list[str], shp: list) -> ShapeColumn:
        bad, n = self.bad, len(shp)

        def culprit() -> Exception:  # the precise message, from the slow path
            for k, s in zip(keys, shp):
                _dims(s, f"tensor {k!r}: shape", bad)
            return bad("a tensor has an invalid shape")

        if set(map(type, shp)) - {list}:
            raise culprit()
        ndim = np.fromiter(map(len, shp), dtype=np.int64, count=n)
        if n and int(ndim.max()) > MAX_NDIM:
            raise culprit()
        flat = list(itertools.chain.from_iterable(shp))
        if flat and set(map(type, flat)) != {int}:
            raise culprit()
        try:
            dims = np.array(flat, dtype=np.int64)
        except OverflowError:
            raise culprit() from None
        del flat
        if len(dims) and (int(dims.min()) < 0 or int(dims.max()) > MAX_BYTES):
            raise culprit()
        begin = np.zeros(n + 1, dtype=np.int64)
        np.cumsum(ndim, out=begin[1:])
        return ShapeColumn(dims, begin)

    def tensor_bytes(self, keys: list[str], shapes: ShapeColumn,
                     itemsize: np.ndarray) -> np.ndarray:
        """prod(shape) * itemsize of every tensor, after checking that every shape
        (zero dimensions counted as 1) holds at most MAX_BYTES bytes."""
        n = len(keys)
        dims, begin = shapes.dims, shapes.begin
        out = np.ones(n, dtype=np.int64)
        if n == 0:
            return out
        # log2 of the span, vectorized; the few tensors near the limit are checked exactly
        logs = np.zeros(len(dims) + 1)
        np.cumsum(np.log2(np.maximum(dims, 1).astype(np.float64)), out=logs[1:])
        span_log = logs[begin[1:]] - logs[begin[:-1]] + np.log2(itemsize.astype(np.float64))
        nonempty = np.nonzero(begin[1:] > begin[:-1])[0]
        if len(nonempty):
            out[nonempty] = np.multiply.reduceat(dims, begin[nonempty])
        out *= itemsize
        for i in np.nonzero(span_log > 56)[0].tolist():
            shape, size = shapes[i], int(itemsize[i])
            if _span(shape, size) > MAX_BYTES:
                raise self.bad(f"tensor {keys[i]!r}: shape {list(shape)} is too large for "
                               f"{size}-byte items (at most 2^62 bytes, counting zero "
                               "dimensions as 1)")
            out[i] = math.prod(shape) * size
        return out

    def block_columns(self, raw: Any) -> "_BlockColumns":
        bad = self.bad
        if not isinstance(raw, dict):
            raise bad("'blocks' must be an object of columns")
        file = _int_column(raw.get("file"), None, "'blocks.file'", bad, hi=1 << 31)
        raw["file"] = None  # consumed: free the per-block values now
        offset = _int_column(raw.get("offset"), None, "'blocks.offset'", bad)
        raw["offset"] = None
        nbytes = _int_column(raw.get("nbytes"), None, "'blocks.nbytes'", bad)
        raw["nbytes"] = None
        return _BlockColumns(file, offset, nbytes, raw.get("box"))

    def blocks(self, cols: "_BlockColumns", crcs: np.ndarray, t: "_TensorColumns",
               files: list[FileEntry], chunk: int) -> BlockTable:
        bad = self.bad
        keys, nblocks = t.keys, t.nblocks
        nb = int(nblocks.sum())
        for what, col in (("file", cols.file), ("offset", cols.offset), ("nbytes", cols.nbytes)):
            if len(col) != nb:
                raise bad(f"'blocks.{what}' must be a list of {nb} integers")
        file, offset, nbytes = cols.file, cols.offset, cols.nbytes
        tensor_begin = np.zeros(len(keys) + 1, dtype=np.int64)
        np.cumsum(nblocks, out=tensor_begin[1:])

        def key_of(j: int) -> str:
            return keys[int(np.searchsorted(tensor_begin, j, side="right") - 1)]

        box = cols.box
        if box is None:
            if (nblocks != 1).any():
                raise bad("tensors with several blocks need 'blocks.box'")
            expected = t.nbytes
        else:
            expected = np.empty(nb, dtype=np.int64)
            box = self.boxes(box, nb, keys, t.dtypes, t.shapes, t.nbytes, tensor_begin,
                             expected)
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
        if len(crcs) != int(nchunks.sum()):
            raise bad(f"'crc32c' must be a list of {int(nchunks.sum())} integers")
        return BlockTable(file, offset, nbytes, box, tensor_begin, crcs.astype(np.uint32), chunk)

    def boxes(self, raw: Any, nb: int, keys: list[str], dtypes: DtypeColumn,
              shapes: ShapeColumn, tensor_nbytes: np.ndarray, tensor_begin: np.ndarray,
              expected: np.ndarray) -> list:
        bad = self.bad
        if not isinstance(raw, list) or len(raw) != nb:
            raise bad(f"'blocks.box' must be a list of {nb} entries")
        out: list = [None] * nb
        codes = dtypes.codes
        itemsizes = [dtype_from_name(d).itemsize for d in dtypes.names]
        for i, key in enumerate(keys):
            b0, b1 = int(tensor_begin[i]), int(tensor_begin[i + 1])
            if b1 - b0 == 1 and raw[b0] is None:
                expected[b0] = tensor_nbytes[i]
                continue
            shape = shapes[i]
            itemsize = itemsizes[codes[i]]
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
                expected[j] = math.prod(shp) * itemsize
                boxes.append((off, shp))
                out[j] = (off, shp)
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
