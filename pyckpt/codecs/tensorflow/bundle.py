"""TensorFlow checkpoints (the TensorBundle format) as a checkpoint source
(format/source.py), so that ``load_checkpoint``, ``load``, ``Checkpoint.restore``
and the CLI read them like pyckpt's own. The layout is docs/TF_FORMAT.md.

Opening reads and validates the whole ``<prefix>.index`` once (table.py,
messages.py) into columns; reads then touch only the bytes of the tensors
asked for, in the ``<prefix>.data-NNNNN-of-MMMMM`` files, whose sizes are
checked before anything is allocated. Every entry's masked CRC-32C (over the
whole entry) is checked on every read:

- in local files, the C++ reader (``read_shards`` with ``whole_item_crc``) reads
  every entry: small ones together, large ones split into ``PIECE``-byte pieces
  read in parallel straight into the destination in ``STEP``-byte steps, each
  step checksummed right after it is read, while in cache; the pieces' CRCs are
  combined into the entry's. So every byte is read once from the page cache and
  checksummed from the CPU cache, as in pyckpt's own format, with the GIL released;
- on object stores, every entry is fetched with ranged reads and verified by the
  core (``engine.read_executor``), again as one chunk per entry;
- string tensors are decoded in Python (strings.py), checking both of their checksums.
"""

from __future__ import annotations

import math
from typing import Any, Sequence

import numpy as np

from ... import progress as _progress
from ..._native import core as _core
from ...engine import read_executor
from ...engine.options import DEFAULT, IOOptions
from ...engine.read_executor import BlockReads
from ...errors import CheckpointError, CorruptCheckpointError, UnsupportedTensorError
from ...format.source import KeyedSource
from ..record_file import read_record_file
from ...sharded import ShardedArray
from ...storage import Store
from ...storage.local import map_file
from .dtypes import DTYPES, OBJECT as _OBJECT, STRING, TF_DTYPE_NAMES, VARIANT, numpy_dtype
from .messages import BUNDLE_VERSION, Entry, decode_entry, decode_header, decode_object_graph
from .object_graph import OBJECT_GRAPH_KEY, to_pyckpt_graph
from .strings import check_variants, decode_strings
from .table import read_table
from .wire import WireError

__all__ = ["TensorFlowCheckpoint", "UnsupportedTensorError", "DTYPES", "TF_DTYPE_NAMES",
           "data_file_name", "MAX_INDEX_BYTES"]

MAX_INDEX_BYTES = 1 << 30       # like pyckpt's manifest limit
MAX_SHARDS = 1 << 20
MAX_TENSOR_BYTES = 1 << 62
PIECE = 8 << 20                 # unit of parallel work of a large entry (local files)
STEP = 1 << 20                  # bytes read and checksummed at a time (stays in cache)


def data_file_name(prefix_name: str, shard: int, num_shards: int) -> str:
    """``<prefix>.data-NNNNN-of-MMMMM``, TensorFlow's name of a shard."""
    return f"{prefix_name}.data-{shard:05d}-of-{num_shards:05d}"


class TensorFlowCheckpoint(KeyedSource):
    """A TensorFlow checkpoint ``<prefix>`` in a store, its index validated when
    opened. Tensors are addressed by position in ``keys`` (sorted, as stored);
    slices of partitioned variables are not keys of their own."""

    format = "tensorflow"

    def __init__(self, store: Store, prefix: str, options: IOOptions = DEFAULT) -> None:
        self.store, self.prefix, self.options = store, prefix, options
        index_path = prefix + ".index"
        self.index_url = store.url(index_path)
        data = read_record_file(store, index_path, MAX_INDEX_BYTES, "TensorFlow index",
                                f"TensorFlow checkpoint at {store.url(prefix)}")
        self._parse_index(data)

    @classmethod
    def from_index_bytes(cls, store: Store, prefix: str, data: bytes,
                         options: IOOptions = DEFAULT) -> "TensorFlowCheckpoint":
        """A checkpoint whose ``.index`` bytes are already at hand (tests, the fuzzer);
        data files are read from ``store`` at ``prefix`` when needed."""
        self = cls.__new__(cls)
        self.store, self.prefix, self.options = store, prefix, options
        self.index_url = store.url(prefix + ".index")
        self._parse_index(data)
        return self

    def _parse_index(self, data: bytes) -> None:
        url = self.index_url
        if len(data) > MAX_INDEX_BYTES:
            raise CorruptCheckpointError(f"TensorFlow index {url} has {len(data)} bytes, more "
                                         f"than the {MAX_INDEX_BYTES} this reader accepts")
        self.index_bytes = len(data)
        pairs = read_table(data, url)
        if not pairs or pairs[0][0] != b"":
            raise CorruptCheckpointError(f"TensorFlow index {url}: no header entry (the empty "
                                         "key): not a TensorBundle index")
        _, hb, he = pairs[0]
        try:
            header = decode_header(memoryview(data)[hb:he])
        except WireError as e:
            raise CorruptCheckpointError(f"TensorFlow index {url}, bytes [{hb}, {he}): bad "
                                         f"header ({e})") from None
        if not 1 <= header.num_shards <= MAX_SHARDS:
            raise CorruptCheckpointError(f"TensorFlow index {url}, bytes [{hb}, {he}): "
                                         f"{header.num_shards} shards")
        if header.min_consumer > BUNDLE_VERSION or BUNDLE_VERSION in header.bad_consumers:
            raise CheckpointError(f"TensorFlow checkpoint {self.url} needs a reader of "
                                  f"bundle version {header.min_consumer} or later (this one "
                                  f"reads version {BUNDLE_VERSION})")
        self.num_shards = header.num_shards
        self.big_endian = header.big_endian
        self.producer = header.producer
        self._columns(data, pairs[1:])

    # -- opening ------------------------------------------------------------------------
    def _columns(self, data: bytes, pairs: list[tuple[bytes, int, int]]) -> None:
        """Validates every entry of the index and keeps the tensors' columns (slices of
        partitioned variables aside, in ``slice_parts``)."""
        keys: list[str] = []
        dtypes: list[np.dtype] = []
        entries: list[Entry] = []
        self.sliced: dict[int, int] = {}      # position -> number of slices
        self.slice_parts: list[tuple[str, int, int, int, int]] = []  # hidden slice entries
        numpy_of: dict[int, np.dtype] = {}   # TensorFlow dtype -> numpy dtype, resolved once
        for raw_key, b, e in pairs:
            key, entry = self._entry(data, raw_key, b, e)
            if raw_key[:1] == b"\x00":  # one slice of a partitioned variable
                self.slice_parts.append((key, entry.shard, entry.offset, entry.size,
                                         entry.crc32c))
                continue
            dtype = numpy_of.get(entry.dtype)
            if dtype is None:
                dtype = numpy_of[entry.dtype] = self._numpy_dtype(entry.dtype, key, b, e)
            self._check_size(entry, dtype, key, b, e)
            if entry.slices:
                self.sliced[len(keys)] = entry.slices
            keys.append(key)
            dtypes.append(dtype)
            entries.append(entry)
        self._keys = keys
        self._index = {k: i for i, k in enumerate(keys)}
        self.tf_dtypes = [en.dtype for en in entries]
        self._dtypes = dtypes
        self._shapes = [en.shape for en in entries]
        self.shard = np.asarray([en.shard for en in entries], dtype=np.int64)
        self.offset = np.asarray([en.offset for en in entries], dtype=np.int64)
        self.size = np.asarray([en.size for en in entries], dtype=np.int64)
        self.crc = np.asarray([en.crc32c for en in entries], dtype=np.uint32)
        self._file_sizes: dict[int, int] = {}
        self._graph: dict | None = None
        self._graph_read = False

    def _bad(self, b: int, e: int, key: str, what: str) -> CorruptCheckpointError:
        return CorruptCheckpointError(f"TensorFlow index {self.index_url}, bytes [{b}, {e}): "
                                      f"tensor {key!r}: {what}")

    def _entry(self, data: bytes, raw_key: bytes, b: int, e: int) -> tuple[str, Entry]:
        """The key and the entry stored at ``data[b:e]``, its shard and range checked."""
        try:
            entry = decode_entry(data, b, e)
        except WireError as err:
            raise CorruptCheckpointError(f"TensorFlow index {self.index_url}, bytes [{b}, {e}): "
                                         f"entry {raw_key[:200]!r}: {err}") from None
        key = raw_key.decode("utf-8", "backslashreplace")
        if entry.shard >= self.num_shards:
            raise self._bad(b, e, key, f"shard {entry.shard} of a checkpoint of {self.num_shards}")
        if entry.offset > MAX_TENSOR_BYTES or entry.size > MAX_TENSOR_BYTES:
            raise self._bad(b, e, key, f"offset {entry.offset} or size {entry.size} is impossible")
        return key, entry

    def _numpy_dtype(self, code: int, key: str, b: int, e: int) -> np.dtype:
        """The numpy dtype of the tensors of TensorFlow dtype ``code`` (dtypes.py)."""
        try:
            dtype = numpy_dtype(code, self.big_endian)
        except ValueError as err:  # ml_dtypes missing
            raise UnsupportedTensorError(f"tensor {key!r} of {self.url}: {err}") from None
        if dtype is None:
            raise self._bad(b, e, key, f"unknown dtype {code}")
        return dtype

    def _check_size(self, entry: Entry, dtype: np.dtype, key: str, b: int, e: int) -> None:
        """Whether the entry's byte size can hold its shape (whole tensors only)."""
        code, shape, nbytes = entry.dtype, entry.shape, entry.size
        count = math.prod(shape)
        if dtype is not _OBJECT:
            if count * dtype.itemsize != nbytes and not entry.slices:
                raise self._bad(b, e, key, f"shape {shape} of {TF_DTYPE_NAMES[code]} needs "
                                f"{count * dtype.itemsize} bytes, the entry says {nbytes}")
            if count * dtype.itemsize > MAX_TENSOR_BYTES:
                raise self._bad(b, e, key, f"shape {shape} is too large")
        elif code == STRING and not entry.slices and nbytes < count + 4:
            raise self._bad(b, e, key, f"{count} strings cannot fit in {nbytes} bytes")

    # -- the format interface -----------------------------------------------------------
    @property
    def url(self) -> str:
        return self.store.url(self.prefix)

    def shape(self, i: int) -> tuple[int, ...]:
        return self._shapes[i]

    def dtype(self, i: int) -> np.dtype:
        """The numpy dtype (``object`` for string, variant and resource tensors)."""
        return self._dtypes[i]

    @property
    def info(self) -> dict:
        # no "library": TensorFlow's format does not say which program wrote it
        # (TensorFlow, or pyckpt's writer), so nothing claims one
        return {"format": "TensorBundle", "producer": self.producer,
                "num_shards": self.num_shards}

    @property
    def graph(self) -> dict | None:
        """The object graph TensorFlow stored under ``_CHECKPOINTABLE_OBJECT_GRAPH``,
        in pyckpt's form (object_graph.py); None for name-based (TF1) checkpoints."""
        if not self._graph_read:
            i = self._index.get(OBJECT_GRAPH_KEY)
            if i is not None:
                if self.tf_dtypes[i] != STRING or self._shapes[i] != ():
                    raise CorruptCheckpointError(f"{self.url}: {OBJECT_GRAPH_KEY} is not a "
                                                 "scalar string")
                blob = self.read_new([i])[0].reshape(-1)[0]
                try:
                    nodes = decode_object_graph(blob)
                except WireError as e:
                    raise CorruptCheckpointError(
                        f"{self.url}: tensor {OBJECT_GRAPH_KEY!r} is not a TrackableObjectGraph "
                        f"({e})") from None
                self._graph = to_pyckpt_graph(nodes, self._index, lambda m: CorruptCheckpointError(
                    f"{self.url}: object graph: {m}"))
            self._graph_read = True
        return self._graph

    def describe(self) -> dict:
        sizes = self._sizes_known()
        return {"layout": "TensorFlow TensorBundle", "index_bytes": self.index_bytes,
                "num_shards": self.num_shards, "byte_order": "big" if self.big_endian else "little",
                "files": [{"name": self._file_name(s), "bytes": n} for s, n in sizes.items()],
                "tf_dtypes": {self._keys[i]: TF_DTYPE_NAMES.get(d, str(d))
                              for i, d in enumerate(self.tf_dtypes) if DTYPES.get(d) is None}}

    def nbytes(self, indices: Sequence[int] | None = None) -> int:
        """Stored bytes of the given tensors (all by default)."""
        if indices is None:
            return int(self.size.sum())
        return int(self.size[np.asarray(list(indices), dtype=np.int64)].sum()) if len(indices) else 0

    # -- files ----------------------------------------------------------------------
    def _file_name(self, shard: int) -> str:
        return data_file_name(self.prefix.rpartition("/")[2], shard, self.num_shards)

    def _file(self, shard: int) -> str:
        head = self.prefix.rpartition("/")[0]
        name = self._file_name(shard)
        return self.store.join(head, name) if head else name

    def _sizes_known(self) -> dict[int, int | None]:
        out: dict[int, int | None] = {}
        for shard in sorted(set(self.shard.tolist()) | {p[1] for p in self.slice_parts}):
            try:
                out[shard] = self._file_sizes.get(shard) or self.store.size(self._file(shard))
            except FileNotFoundError:
                out[shard] = None
        return out

    def _check_ranges(self, items: Sequence[tuple[str, int, int, int]]) -> None:
        """Each (key, shard, offset, size) lies inside its data file (sizes asked once)."""
        for key, shard, off, n in items:
            if n == 0:
                continue
            fsize = self._file_sizes.get(shard)
            if fsize is None:
                path = self._file(shard)
                try:
                    fsize = self.store.size(path)
                except FileNotFoundError:
                    raise CorruptCheckpointError(
                        f"tensor {key!r}: data file {self.store.url(path)} of checkpoint "
                        f"{self.url} is missing (needed for bytes [{off}, {off + n}))") from None
                self._file_sizes[shard] = fsize
            if off + n > fsize:
                raise CorruptCheckpointError(
                    f"tensor {key!r}: bytes [{off}, {off + n}) lie outside "
                    f"{self.store.url(self._file(shard))}, which holds {fsize} bytes "
                    "(truncated file?)")

    def _check(self, indices: Sequence[int]) -> None:
        for i in indices:
            d = self.tf_dtypes[i]
            if i in self.sliced:
                raise UnsupportedTensorError(
                    f"tensor {self._keys[i]!r} of {self.url} is a partitioned variable saved "
                    f"as {self.sliced[i]} slices; pyckpt does not read sliced TensorFlow tensors "
                    "(restore it with TensorFlow and save it whole)")
            if DTYPES.get(d) is None and d != STRING:
                raise UnsupportedTensorError(
                    f"tensor {self._keys[i]!r} of {self.url} has TensorFlow dtype "
                    f"{TF_DTYPE_NAMES.get(d, d)}, which has no numpy equivalent")
        self._check_ranges([(self._keys[i], int(self.shard[i]), int(self.offset[i]),
                             int(self.size[i])) for i in indices])

    # -- reads ------------------------------------------------------------------------
    def read_new(self, indices: Sequence[int], mmap: bool = False) -> list[np.ndarray]:
        indices = [int(i) for i in indices]
        self._check(indices)
        out: list[Any] = [None] * len(indices)
        numeric = [p for p, i in enumerate(indices) if self.tf_dtypes[i] != STRING]
        if mmap and numeric:
            maps = self._maps([indices[p] for p in numeric])
            if maps is not None:
                for p, v in zip(numeric, self._mapped([indices[p] for p in numeric], maps)):
                    out[p] = v
                numeric = []
        arrays = [np.empty(self._shapes[indices[p]], dtype=self._dtypes[indices[p]])
                  for p in numeric]
        self._read_numeric([indices[p] for p in numeric], arrays)
        for p, a in zip(numeric, arrays):
            out[p] = a
        for p, i in enumerate(indices):
            if self.tf_dtypes[i] == STRING:
                out[p] = self._read_strings(i)
        return out

    def read(self, indices: Sequence[int], dsts: Sequence[Any]) -> None:
        indices = [int(i) for i in indices]
        self._check(indices)
        direct_i, direct_d, later = [], [], []
        for i, d in zip(indices, dsts):
            if (self.tf_dtypes[i] != STRING and isinstance(d, np.ndarray) and d.flags.c_contiguous
                    and d.flags.writeable and d.nbytes == int(self.size[i])):
                direct_i.append(i)
                direct_d.append(d)
            else:
                later.append((i, d))
        self._read_numeric(direct_i, direct_d)
        if later:
            values = self.read_new([i for i, _ in later])
            for (i, d), v in zip(later, values):
                if isinstance(d, ShardedArray):
                    v = v[tuple(slice(o, o + n) for o, n in zip(d.offsets, d.local.shape))]
                    d = d.local
                np.copyto(d, v, casting="no" if v.dtype != _OBJECT else "unsafe")

    def verify(self) -> None:
        """Reads every entry (slices of partitioned variables included) and checks
        every checksum; the first mismatch raises CorruptCheckpointError."""
        numeric = [i for i in range(len(self._keys))
                   if i not in self.sliced and self.tf_dtypes[i] not in (STRING, VARIANT)]
        self._check_ranges([(self._keys[i], int(self.shard[i]), int(self.offset[i]),
                             int(self.size[i])) for i in numeric])
        self._check_ranges([(k, s, o, n) for k, s, o, n, _ in self.slice_parts])
        items = [(self._keys[i], int(self.shard[i]), int(self.offset[i]), int(self.size[i]),
                  int(self.crc[i])) for i in numeric] + list(self.slice_parts)
        self._verified_read(items, [None] * len(items))
        for i in range(len(self._keys)):
            if self.tf_dtypes[i] in (STRING, VARIANT) and i not in self.sliced:
                self._read_strings(i)

    # -- numeric entries ----------------------------------------------------------------
    def _read_numeric(self, indices: list[int], dsts: list[np.ndarray]) -> None:
        items = [(self._keys[i], int(self.shard[i]), int(self.offset[i]), int(self.size[i]),
                  int(self.crc[i])) for i in indices]
        self._verified_read(items, [d.reshape(-1).view(np.uint8) if d.size else d for d in dsts])

    def _verified_read(self, items: list[tuple[str, int, int, int, int]],
                       dsts: Sequence[np.ndarray | None]) -> None:
        """Reads (key, shard, offset, size, masked crc) items into contiguous byte
        arrays (None: verify only), checking each item's CRC-32C."""
        keep = [p for p, it in enumerate(items) if it[3] > 0]
        if not keep:
            return
        items = [items[p] for p in keep]
        dsts = [dsts[p] for p in keep]
        shards = sorted({it[1] for it in items})
        paths = {s: self._file(s) for s in shards}
        names = self.store.native_paths([paths[s] for s in shards])
        if names is None:  # object stores: ranged reads, one checksummed chunk per entry
            plan = BlockReads([it[0] for it in items],
                              np.asarray([it[1] for it in items], np.int64),
                              np.asarray([it[2] for it in items], np.uint64),
                              np.asarray([it[3] for it in items], np.uint64),
                              np.asarray([it[4] for it in items], np.uint32),
                              np.arange(len(items) + 1, dtype=np.uint64))
            read_executor.execute(self.store, paths, plan, list(dsts),
                                  max(it[3] for it in items), self.options)
            return
        # Local files: the core reads every entry (large ones in parallel pieces, in
        # STEP-byte steps checksummed while in cache) and checks each entry's one CRC.
        where = {s: k for k, s in enumerate(shards)}
        threads = self.options.threads if self.options.threads > 0 else _core.default_threads()
        options = _core.ReadOptions(chunk_size=STEP, piece_size=PIECE, threads=threads,
                                    verify=True, whole_item_crc=True,
                                    progress=_progress.counter())
        _core.read_shards(names=names, buffers=[None] * len(names), bases=[0] * len(names),
                          keys=[it[0] for it in items],
                          sources=np.asarray([where[it[1]] for it in items], np.uint32),
                          offsets=np.asarray([it[2] for it in items], np.uint64),
                          nbytes=np.asarray([it[3] for it in items], np.uint64),
                          crcs=np.asarray([it[4] for it in items], np.uint32),
                          crc_begin=np.arange(len(items) + 1, dtype=np.uint64),
                          dsts=list(dsts), options=options)

    def _compare(self, item: tuple[str, int, int, int, int], actual: int) -> None:
        key, shard, off, n, stored = item
        if actual != stored:
            raise CorruptCheckpointError(
                f"checksum mismatch in tensor {key!r}, file "
                f"'{self.store.url(self._file(shard))}', bytes [{off}, {off + n}) (stored "
                f"0x{stored:08x}, computed 0x{actual:08x})")

    def _maps(self, indices: list[int]) -> dict[int, Any] | None:
        shards = sorted({int(self.shard[i]) for i in indices if self.size[i] > 0})
        names = self.store.native_paths([self._file(s) for s in shards])
        if names is None:
            return None
        return {s: map_file(n) for s, n in zip(shards, names)}

    def _mapped(self, indices: list[int], maps: dict[int, Any]) -> list[np.ndarray]:
        """Read-only arrays backed by the mapped data files, verified through the map."""
        out = []
        for i in indices:
            dtype, shape, n = self._dtypes[i], self._shapes[i], int(self.size[i])
            if n == 0:
                arr = np.empty(shape, dtype=dtype)
                arr.flags.writeable = False
            else:
                arr = np.frombuffer(maps[int(self.shard[i])], dtype=dtype,
                                    count=n // dtype.itemsize, offset=int(self.offset[i]))
                arr = arr.reshape(shape)
            out.append(arr)
        live = [i for i in indices if self.size[i] > 0]
        if live:
            shards = sorted(maps)
            paths = {s: self._file(s) for s in shards}
            plan = BlockReads([self._keys[i] for i in live],
                              self.shard[live], self.offset[live].astype(np.uint64),
                              self.size[live].astype(np.uint64), self.crc[live],
                              np.arange(len(live) + 1, dtype=np.uint64))
            read_executor.execute(self.store, paths, plan, [None] * len(live),
                                  int(self.size[live].max()), self.options, buffers=maps)
        return out

    # -- string entries -----------------------------------------------------------------
    def _read_strings(self, i: int) -> np.ndarray:
        """A string tensor's elements (a variant tensor: its checksums checked only)."""
        key, shard, off, n = self._keys[i], int(self.shard[i]), int(self.offset[i]), int(self.size[i])
        self._check_ranges([(key, shard, off, n)])
        path = self._file(shard)
        raw = self.store.read_ranges(path, [(off, off + n)])[0] if n else b""
        where = f"tensor {key!r}, file '{self.store.url(path)}', bytes [{off}, {off + n})"
        if len(raw) != n:
            raise CorruptCheckpointError(f"{where}: only {len(raw)} bytes could be read")
        count = math.prod(self._shapes[i])
        values: list[bytes] = []
        try:
            if self.tf_dtypes[i] == VARIANT:
                actual = check_variants(raw, count)
            else:
                values, actual = decode_strings(raw, count)
        except WireError as e:
            raise CorruptCheckpointError(f"{where}: bad {TF_DTYPE_NAMES[self.tf_dtypes[i]]} "
                                         f"tensor ({e})") from None
        self._compare((key, shard, off, n, int(self.crc[i])), actual)
        if self.tf_dtypes[i] == VARIANT:
            return np.empty(0, dtype=object)
        arr = np.empty(count, dtype=object)
        arr[:] = values
        return arr.reshape(self._shapes[i])
