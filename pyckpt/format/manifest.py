"""The manifest: the JSON document inside the index file (docs/FORMAT.md, "Manifest").

``Manifest.from_json`` is the one validator of untrusted manifests: every
size, offset, index and checksum list is checked before anything is
allocated or read, so a hostile index yields a CorruptCheckpointError and
never a crash, a hang or a huge allocation. docs/manifest.schema.json
describes the same document for other tools.
"""

from __future__ import annotations

import math
import re
from typing import Any, Callable

import numpy as np

from .._dtypes import dtype_from_name

FORMAT_VERSION = 1
MAX_NDIM = 64
MAX_BYTES = 1 << 62
_FILE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,254}$")

BadFn = Callable[[str], Exception]


class Block:
    """One stored, contiguous block of a tensor: the whole tensor, or (for a
    sharded array) the box ``[offsets, offsets + shape)`` of the global array."""

    __slots__ = ("file", "offset", "nbytes", "crcs", "offsets", "shape")

    def __init__(self, file: int, offset: int, nbytes: int, crcs: list[int],
                 offsets: tuple[int, ...] | None = None,
                 shape: tuple[int, ...] | None = None) -> None:
        self.file = file
        self.offset = offset
        self.nbytes = nbytes
        self.crcs = crcs
        self.offsets = offsets
        self.shape = shape

    def to_json(self) -> dict:
        d: dict[str, Any] = {"file": self.file, "offset": self.offset, "nbytes": self.nbytes,
                             "crc32c": self.crcs}
        if self.offsets is not None:
            d["offsets"] = list(self.offsets)
            d["shape"] = list(self.shape or ())
        return d


class TensorEntry:
    __slots__ = ("key", "dtype", "dtype_name", "shape", "blocks")

    def __init__(self, key: str, dtype_name: str, dtype: np.dtype, shape: tuple[int, ...],
                 blocks: list[Block]) -> None:
        self.key = key
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

    def to_json(self) -> dict:
        return {"dtype": self.dtype_name, "shape": list(self.shape),
                "blocks": [b.to_json() for b in self.blocks]}


class FileEntry:
    __slots__ = ("name", "size")

    def __init__(self, name: str, size: int) -> None:
        self.name = name
        self.size = size


class Manifest:
    """Everything a checkpoint's index says, validated."""

    def __init__(self, *, chunk_size: int, files: list[FileEntry],
                 tensors: dict[str, TensorEntry], tree: dict | None = None,
                 metadata: dict | None = None, graph: dict | None = None,
                 info: dict | None = None) -> None:
        self.chunk_size = chunk_size
        self.files = files
        self.tensors = tensors
        self.tree = tree
        self.metadata = metadata if metadata is not None else {}
        self.graph = graph
        self.info = info if info is not None else {}

    # -- writing ------------------------------------------------------------------
    def to_json(self) -> dict:
        return {
            "format": "pyckpt",
            "version": FORMAT_VERSION,
            "chunk_size": self.chunk_size,
            "info": self.info,
            "files": [{"name": f.name, "size": f.size} for f in self.files],
            "tensors": {k: t.to_json() for k, t in self.tensors.items()},
            "tree": self.tree,
            "graph": self.graph,
            "metadata": self.metadata,
        }

    # -- reading ------------------------------------------------------------------
    @classmethod
    def from_json(cls, doc: Any, bad: BadFn) -> "Manifest":
        if not isinstance(doc, dict) or doc.get("format") != "pyckpt":
            raise bad("not a pyckpt manifest")
        version = doc.get("version")
        if not _is_int(version) or version < 1:
            raise bad(f"bad manifest version {version!r}")
        if version > FORMAT_VERSION:
            raise bad(f"manifest version {version} is newer than this pyckpt supports")
        chunk = doc.get("chunk_size")
        if not _is_int(chunk) or not (1 <= chunk <= 1 << 31):
            raise bad(f"bad chunk_size {chunk!r}")
        files = _files(doc.get("files"), bad)
        raw = doc.get("tensors")
        if not isinstance(raw, dict):
            raise bad("'tensors' must be an object")
        tensors: dict[str, TensorEntry] = {}
        for key, entry in raw.items():
            tensors[key] = _tensor(key, entry, files, chunk, bad)
        _check_overlaps(tensors, files, bad)
        for name in ("tree", "graph"):
            if doc.get(name) is not None and not isinstance(doc.get(name), dict):
                raise bad(f"'{name}' must be an object or null")
        meta = doc.get("metadata")
        if meta is not None and not isinstance(meta, dict):
            raise bad("'metadata' must be an object")
        info = doc.get("info")
        return cls(chunk_size=chunk, files=files, tensors=tensors, tree=doc.get("tree"),
                   metadata=meta or {}, graph=doc.get("graph"),
                   info=info if isinstance(info, dict) else {})


def _is_int(x: Any) -> bool:
    return type(x) is int


def _files(raw: Any, bad: BadFn) -> list[FileEntry]:
    if not isinstance(raw, list) or len(raw) > 1_000_000:
        raise bad("'files' must be a list")
    out = []
    names = set()
    for i, f in enumerate(raw):
        if not isinstance(f, dict):
            raise bad(f"file entry {i} must be an object")
        name, size = f.get("name"), f.get("size")
        if not isinstance(name, str) or not _FILE_NAME.match(name) or name == "pyckpt.index":
            raise bad(f"file entry {i} has an unsafe name {name!r}")
        if name in names:
            raise bad(f"file {name!r} is listed twice")
        names.add(name)
        if not _is_int(size) or not (0 <= size <= MAX_BYTES):
            raise bad(f"file {name!r} has a bad size {size!r}")
        out.append(FileEntry(name, size))
    return out


def _int_list(raw: Any, what: str, bad: BadFn) -> tuple[int, ...]:
    if not isinstance(raw, list) or len(raw) > MAX_NDIM:
        raise bad(f"{what} must be a list of at most {MAX_NDIM} integers")
    for d in raw:
        if not _is_int(d) or not (0 <= d <= MAX_BYTES):
            raise bad(f"{what} has a bad entry {d!r}")
    return tuple(raw)


def _tensor(key: Any, entry: Any, files: list[FileEntry], chunk: int, bad: BadFn) -> TensorEntry:
    from ..tree import validate_key

    try:
        validate_key(key)
    except (TypeError, ValueError) as e:
        raise bad(f"invalid key: {e}") from None
    if not isinstance(entry, dict):
        raise bad(f"tensor {key!r}: entry must be an object")
    try:
        dtype = dtype_from_name(entry.get("dtype"))
    except ValueError as e:
        raise bad(f"tensor {key!r}: {e}") from None
    shape = _int_list(entry.get("shape"), f"tensor {key!r}: shape", bad)
    total = math.prod(shape) * dtype.itemsize
    if total > MAX_BYTES:
        raise bad(f"tensor {key!r}: shape {shape} is too large")
    raw_blocks = entry.get("blocks")
    if not isinstance(raw_blocks, list) or not raw_blocks:
        raise bad(f"tensor {key!r}: 'blocks' must be a non-empty list")
    blocks = []
    for j, b in enumerate(raw_blocks):
        if not isinstance(b, dict):
            raise bad(f"tensor {key!r}: block {j} must be an object")
        f, off, n, crcs = b.get("file"), b.get("offset"), b.get("nbytes"), b.get("crc32c")
        if b.get("offsets") is not None or len(raw_blocks) > 1:
            offsets = _int_list(b.get("offsets"), f"tensor {key!r} block {j}: offsets", bad)
            bshape = _int_list(b.get("shape"), f"tensor {key!r} block {j}: shape", bad)
            if len(offsets) != len(shape) or len(bshape) != len(shape):
                raise bad(f"tensor {key!r} block {j}: rank differs from the tensor's")
            for o, s, g in zip(offsets, bshape, shape):
                if o + s > g:
                    raise bad(f"tensor {key!r} block {j}: box {offsets}+{bshape} exceeds {shape}")
            expected = math.prod(bshape) * dtype.itemsize
        else:
            offsets, bshape, expected = None, None, total
        if not _is_int(n) or n != expected:
            raise bad(f"tensor {key!r} block {j}: nbytes {n!r} != {expected} "
                      f"(shape and dtype {dtype.name})")
        if not _is_int(f) or not (0 <= f < len(files)) and n > 0:
            raise bad(f"tensor {key!r} block {j}: file index {f!r} out of range")
        if not _is_int(off) or off < 0 or (n > 0 and off + n > files[f].size):
            fname = files[f].name if n > 0 else "?"
            raise bad(f"tensor {key!r} block {j}: bytes [{off}, {off + n if _is_int(off) else '?'}) "
                      f"lie outside file {fname!r}")
        want = -(-n // chunk)
        if not isinstance(crcs, list) or len(crcs) != want:
            raise bad(f"tensor {key!r} block {j}: expected {want} chunk checksums")
        for c in crcs:
            if not _is_int(c) or not (0 <= c < 1 << 32):
                raise bad(f"tensor {key!r} block {j}: bad checksum {c!r}")
        blocks.append(Block(f, off, n, crcs, offsets, bshape))
    if len(blocks) > 1 or blocks[0].offsets is not None:
        covered = sum(math.prod(b.shape) for b in blocks)
        if covered != math.prod(shape):
            raise bad(f"tensor {key!r}: blocks cover {covered} of {math.prod(shape)} elements")
    return TensorEntry(key, entry["dtype"], dtype, shape, blocks)


def _check_overlaps(tensors: dict[str, TensorEntry], files: list[FileEntry], bad: BadFn) -> None:
    spans = []
    for t in tensors.values():
        for b in t.blocks:
            if b.nbytes:
                spans.append((b.file, b.offset, b.offset + b.nbytes, t.key))
    spans.sort()
    for a, b in zip(spans, spans[1:]):
        if a[0] == b[0] and b[1] < a[2]:
            raise bad(f"tensors {a[3]!r} and {b[3]!r} overlap in file "
                      f"{files[a[0]].name!r} at bytes [{b[1]}, {min(a[2], b[2])})")
