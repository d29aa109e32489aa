"""The one validator of untrusted manifests (docs/FORMAT.md, "Manifest", "Limits").

Every size, offset, index and checksum list is checked before anything is
allocated or read, so a hostile index yields a CorruptCheckpointError (through
``bad``) and never a crash, a hang or a huge allocation. Tensors and blocks are
checked whole columns at a time with numpy; a slow per-tensor pass runs only to
name the culprit. The result is the arguments of a ``Manifest``
(``Manifest.from_json`` and ``Manifest.from_text`` build it).
"""

from __future__ import annotations

import itertools
import math
import re
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np

from .._dtypes import stored_dtype
from ..sharded.boxes import check_partition
from ..tree import validate_keys
from .json_scan import LazyJSON, scan_members
from .records import (FORMAT_VERSION, MAX_BYTES, MAX_CHUNK, MAX_NDIM, BadFn, BlockTable,
                      DtypeColumn, FileEntry, ShapeColumn, span)

_FILE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,254}$")
_HEX = re.compile(r"^[0-9a-f]*$")


def manifest_fields(doc: Any, bad: BadFn) -> dict[str, Any]:
    """Validates a parsed manifest; returns the keyword arguments of its ``Manifest``.
    The per-tensor lists of ``doc`` are consumed (replaced by None once converted) to
    keep the peak memory low."""
    return _Validator(doc, bad).fields()


def manifest_fields_from_text(text: str, bad: BadFn) -> dict[str, Any]:
    """Parses (json.JSONDecodeError, RecursionError) and validates a manifest, member
    by member (see ``_Validator.from_text``); returns the keyword arguments of its
    ``Manifest``."""
    return _Validator(None, bad).from_text(text)


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


@dataclass(slots=True)
class _TensorColumns:
    keys: list[str]
    dtypes: DtypeColumn
    shapes: ShapeColumn
    nbytes: np.ndarray
    nblocks: np.ndarray


@dataclass(slots=True)
class _Failed:
    """A member whose conversion failed: ``fields()`` raises the error after the
    checks that come first (format, version...), so that, say, a newer version
    is reported as such rather than as a malformed column."""

    error: Exception


@dataclass(slots=True)
class _BlockColumns:
    file: np.ndarray
    offset: np.ndarray
    nbytes: np.ndarray
    box: Any
    hashes: Any = None


class _Validator:
    def __init__(self, doc: Any, bad: BadFn) -> None:
        self.doc = doc
        self.bad = bad

    def fields(self) -> dict[str, Any]:
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
        if version < 2 and any(f.at is not None for f in files):
            raise bad(f"manifest version {version} cannot reference other checkpoints' files")
        tensors = self.converted("tensors", doc)
        blocks = self.blocks(self.converted("blocks", doc), self.converted("crc32c", doc),
                             tensors, files, chunk)
        return dict(chunk_size=chunk, files=files, keys=tensors.keys,
                    dtype_names=tensors.dtypes, shapes=tensors.shapes, blocks=blocks,
                    tree=doc.get("tree"), metadata=doc.get("metadata") or {},
                    graph=doc.get("graph"), info=doc.get("info") or {})

    def check_object(self, name: str, value: Any) -> None:
        if value is not None and not isinstance(value, (dict, LazyJSON)):
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
    def from_text(self, text: str) -> dict[str, Any]:
        """Parses and validates the manifest's JSON text. Top-level members are parsed
        one at a time, and the per-tensor columns converted to their compact form
        right away, so the whole document never exists as Python objects at once;
        ``tree`` and ``graph`` are kept as text and parsed when first used."""
        self.doc = scan_members(text, self.member, as_text=("tree", "graph"))
        return self.fields()

    def member(self, name: str, value: Any) -> Any:
        """A top-level member as ``from_text`` keeps it: the per-tensor columns
        converted (or the error, raised later by ``fields()`` in the order of the
        checks), anything else as parsed."""
        if name not in ("tensors", "blocks", "crc32c"):
            return value
        try:
            return self.convert(name, value)
        except Exception as e:  # noqa: BLE001 - raised by fields(), in order
            return _Failed(e)

    def files(self, raw: Any) -> list[FileEntry]:
        bad = self.bad
        if not isinstance(raw, list) or len(raw) > 1_000_000:
            raise bad("'files' must be a list")
        out, names = [], set()
        for i, f in enumerate(raw):
            if not isinstance(f, dict):
                raise bad(f"file entry {i} must be an object")
            name, size, at = f.get("name"), f.get("size"), f.get("at")
            if not isinstance(name, str) or not _FILE_NAME.match(name) or name == "pyckpt.index":
                raise bad(f"file entry {i} has an unsafe name {name!r}")
            if at is not None and (not isinstance(at, str) or not _FILE_NAME.match(at)):
                raise bad(f"file {name!r} is referenced in an unsafe directory {at!r} (a "
                          "reference names a sibling checkpoint directory)")
            if name in names:
                raise bad(f"file {name!r} is listed twice")
            names.add(name)
            if type(size) is not int or not (0 <= size <= MAX_BYTES):
                raise bad(f"file {name!r} has a bad size {size!r}")
            out.append(FileEntry(name, size, at))
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
        itemsize = np.array([stored_dtype(d).itemsize for d in dtypes.names] or [0],
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
                stored_dtype(name)
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
            if span(shape, size) > MAX_BYTES:
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
        return _BlockColumns(file, offset, nbytes, raw.get("box"), raw.get("h128"))

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
        hashes = None if cols.hashes is None else self.hashes(cols.hashes, nchunks, key_of)
        return BlockTable(file, offset, nbytes, box, tensor_begin, crcs.astype(np.uint32), chunk,
                          hashes)

    def hashes(self, raw: Any, nchunks: np.ndarray, key_of: Callable[[int], str]) -> list[str]:
        """``blocks.h128``: per block, 32 lowercase hex digits per chunk."""
        if not isinstance(raw, list) or len(raw) != len(nchunks):
            raise self.bad(f"'blocks.h128' must be a list of {len(nchunks)} strings")
        for j, (h, n) in enumerate(zip(raw, nchunks.tolist())):
            if not isinstance(h, str) or len(h) != 32 * n or not _HEX.match(h):
                raise self.bad(f"tensor {key_of(j)!r}: 'blocks.h128' entry {j} must be "
                               f"{32 * n} lowercase hex digits (one 128-bit hash per chunk)")
        return raw

    def boxes(self, raw: Any, nb: int, keys: list[str], dtypes: DtypeColumn,
              shapes: ShapeColumn, tensor_nbytes: np.ndarray, tensor_begin: np.ndarray,
              expected: np.ndarray) -> list:
        bad = self.bad
        if not isinstance(raw, list) or len(raw) != nb:
            raise bad(f"'blocks.box' must be a list of {nb} entries")
        out: list = [None] * nb
        codes = dtypes.codes
        itemsizes = [stored_dtype(d).itemsize for d in dtypes.names]
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
