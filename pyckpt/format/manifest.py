"""The manifest: the JSON document inside the index file (docs/FORMAT.md, "Manifest").

Tensors and their stored blocks are kept as columns (one JSON list per field)
rather than one object per tensor: checkpoints with 100,000 small variables
then parse and validate in milliseconds, with numpy doing the range checks.

``Manifest.from_json`` and ``Manifest.from_text`` go through the one validator
of untrusted manifests (``validate.py``; the streaming JSON reader behind
``from_text`` is ``json_scan.py``): every size, offset, index and checksum
list is checked before anything is allocated or read, so a hostile index
yields a CorruptCheckpointError and never a crash, a hang or a huge
allocation. docs/manifest.schema.json describes the same document for other
tools.

Memory per tensor is bounded and small (docs/FORMAT.md, "Limits"): a validated
manifest keeps its keys as one list of strings and everything else in numpy
columns (dtype codes, flattened shapes, blocks: ``records.py``); per-tensor
objects (``TensorEntry``, shape tuples, the key -> index dict) are built on
demand. The JSON document's per-tensor lists are dropped as soon as they are
converted.
"""

from __future__ import annotations

import json
from typing import Any, Iterable, Iterator, Mapping, Sequence

import numpy as np

from .._dtypes import stored_dtype
from .json_scan import LazyJSON
# the records and columns, importable from here as before the split
from .records import (BASE_VERSION, FORMAT_VERSION, MAX_BYTES, MAX_CHUNK, MAX_NDIM, BadFn, Block,
                      BlockTable, DtypeColumn, FileEntry, ShapeColumn, TensorEntry)
from .validate import manifest_fields, manifest_fields_from_text

__all__ = ["FORMAT_VERSION", "MAX_NDIM", "MAX_BYTES", "MAX_CHUNK", "BadFn", "FileEntry",
           "Block", "TensorEntry", "BlockTable", "DtypeColumn", "ShapeColumn", "Manifest",
           "TensorTable", "build_manifest"]


class Manifest:
    """Everything a checkpoint's index says, validated.

    ``keys`` is a list of strings; ``dtype_names`` and ``shapes`` are sequences
    backed by numpy columns (``DtypeColumn``, ``ShapeColumn``); ``index`` (key ->
    position) and ``entry(i)`` are built on first use."""

    _tree: Any  # dict | None, or a LazyJSON until first used
    _graph: Any

    def __init__(self, *, chunk_size: int, files: list[FileEntry], keys: Sequence[str],
                 dtype_names: Iterable[str], shapes: Iterable[Sequence[int]], blocks: BlockTable,
                 tree: dict | None = None, metadata: dict | None = None,
                 graph: dict | None = None, info: dict | None = None) -> None:
        self.chunk_size = chunk_size
        self.files = files
        self.keys = keys if isinstance(keys, list) else list(keys)
        self.dtype_names = DtypeColumn.of(dtype_names)
        self._dtype_table = [stored_dtype(n) for n in self.dtype_names.names]
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
        if isinstance(self._tree, LazyJSON):
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
        if isinstance(self._graph, LazyJSON):
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

    # -- references (incremental saves, docs/FORMAT.md section 12) ---------------------
    @property
    def has_references(self) -> bool:
        """Whether some data file lies in another checkpoint's directory."""
        return any(f.at is not None for f in self.files)

    @property
    def version(self) -> int:
        """The format version this manifest is written with: 2 with references (readers
        that predate them refuse it), else 1."""
        return FORMAT_VERSION if self.has_references else BASE_VERSION

    def own_and_referenced_bytes(self) -> tuple[int, int]:
        """Bytes of stored blocks in this checkpoint's own files, and in files of other
        checkpoints it references."""
        b = self.blocks
        if not len(b):
            return 0, 0
        referenced = np.array([f.at is not None for f in self.files] + [False])
        ref = referenced[np.minimum(b.file, len(self.files))] & (b.nbytes > 0)
        return int(b.nbytes[~ref].sum()), int(b.nbytes[ref].sum())

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
        if b.hashes is not None:
            blocks["h128"] = b.hashes
        return {
            "format": "pyckpt",
            "version": self.version,
            "chunk_size": self.chunk_size,
            "info": self.info,
            "files": [{"name": f.name, "size": f.size} if f.at is None
                      else {"name": f.name, "size": f.size, "at": f.at} for f in self.files],
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
        return Manifest(**manifest_fields(doc, bad))

    @classmethod
    def from_text(cls, text: str, bad: BadFn) -> "Manifest":
        """Parses (json.JSONDecodeError, RecursionError) and validates a manifest,
        member by member (see ``validate._Validator.from_text``)."""
        return Manifest(**manifest_fields_from_text(text, bad))


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


def build_manifest(*, chunk_size: int, files: list[FileEntry], keys: Sequence[str],
                   dtype_names: Sequence[str], shapes: Sequence[tuple[int, ...]],
                   file: np.ndarray, offset: np.ndarray, nbytes: np.ndarray, crcs: np.ndarray,
                   nblocks: np.ndarray | None = None, box: list | None = None,
                   tree: dict | None = None, metadata: dict | None = None,
                   graph: dict | None = None, info: dict | None = None,
                   hashes: list[str] | None = None) -> Manifest:
    """A Manifest from columns produced by a writer (trusted input)."""
    n = len(keys)
    if nblocks is None:
        nblocks = np.ones(n, dtype=np.int64)
    tensor_begin = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(nblocks, out=tensor_begin[1:])
    table = BlockTable(np.asarray(file, dtype=np.int64), np.asarray(offset, dtype=np.int64),
                       np.asarray(nbytes, dtype=np.int64), box, tensor_begin,
                       np.asarray(crcs, dtype=np.uint32), chunk_size, hashes)
    return Manifest(chunk_size=chunk_size, files=files, keys=list(keys),
                    dtype_names=list(dtype_names), shapes=[tuple(s) for s in shapes],
                    blocks=table, tree=tree, metadata=metadata, graph=graph, info=info)
