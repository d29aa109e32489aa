"""The safetensors codec: a safetensors file as a checkpoint source
(format/source.py), so that ``pyckpt.load("model.safetensors")`` and every reader
work on them, and ``write_file``, which writes any opened source as one. The
conversions to and from pyckpt checkpoints are ``pyckpt.interop.safetensors``.

The format (https://github.com/huggingface/safetensors): an 8-byte
little-endian header length N, N bytes of JSON mapping each tensor name to
``{"dtype", "shape", "data_offsets": [begin, end]}`` (offsets into the data
after the header) plus an optional ``"__metadata__"`` of strings, then the
tensors' little-endian bytes. Written here with our own code (no dependency);
headers are validated before anything is allocated.
"""

from __future__ import annotations

import collections
import concurrent.futures
import json
import math
import struct
import warnings
from typing import Any, Callable, Iterator, Sequence

import numpy as np

from .._dtypes import dtype_from_name, dtype_name
from ..errors import CorruptCheckpointError
from ..format.json_scan import loads_untrusted
from ..format.read_plan import ReadPlan
from ..format.records import MAX_BYTES, MAX_NDIM, span
from ..format.source import CheckpointSource, KeyedSource
from ..format.values import left_out_warning, text_values
from ..sharded import ShardedArray
from ..storage import Store
from ..storage.streamed import earlier_uploads_of, write_stream
from ..tree import check_utf8

MAX_HEADER = 100 << 20
METADATA_KEY = "__metadata__"  # the header's member that is no tensor

# safetensors dtype code <-> pyckpt stored dtype name
_CODES = {
    "BOOL": "bool", "U8": "uint8", "I8": "int8", "U16": "uint16", "I16": "int16",
    "U32": "uint32", "I32": "int32", "U64": "uint64", "I64": "int64",
    "F16": "float16", "BF16": "bfloat16", "F32": "float32", "F64": "float64",
    "F8_E4M3": "float8_e4m3fn", "F8_E5M2": "float8_e5m2", "C64": "complex64",
}
_NAMES = {v: k for k, v in _CODES.items()}


def is_safetensors_path(path: Any) -> bool:
    return isinstance(path, str) and path.endswith(".safetensors")


def detect(store: Store, path: str) -> bool:
    """A path ending in ``.safetensors`` is read as a safetensors file."""
    return is_safetensors_path(path)


class FlatTensors(KeyedSource):
    """Tensors under their own names with string metadata (safetensors files and
    folders): a flat tree, whole-tensor reads copied into the targets."""

    checksums = False  # safetensors stores none
    _metadata: dict

    @property
    def metadata(self) -> dict:
        return self._metadata

    @property
    def tree(self) -> dict:
        """A flat dict of every tensor under its own name."""
        return {"d": [[k, k] for k in self._keys]}

    def read(self, indices: Sequence[int], dsts: Sequence[Any]) -> None:
        copy_into(self.read_new(indices), dsts)


class SafetensorsFile(FlatTensors):
    """A safetensors file in some store, its header validated when opened. It has
    no checksums: reads check sizes and bounds only."""

    format = "safetensors"

    def __init__(self, store: Store, path: str) -> None:
        self.store, self.path = store, path
        url = store.url(path)
        size = store.size(path)
        if size < 8:
            raise CorruptCheckpointError(f"{url}: too short for a safetensors file ({size} bytes)")
        (n,) = struct.unpack("<Q", store.read_ranges(path, [(0, 8)])[0])
        if n > MAX_HEADER or 8 + n > size:
            raise CorruptCheckpointError(f"{url}, bytes [0, 8): header length {n} is impossible "
                                         f"for a file of {size} bytes")
        try:
            header = loads_untrusted(store.read_ranges(path, [(8, 8 + n)])[0])
        except ValueError as err:
            raise CorruptCheckpointError(f"{url}, bytes [8, {8 + n}): bad JSON header: {err}") from None
        if not isinstance(header, dict):
            raise CorruptCheckpointError(f"{url}: the header is not a JSON object")
        try:
            check_utf8(list(header), "tensor name")
        except ValueError as err:
            raise CorruptCheckpointError(f"{url}, bytes [8, {8 + n}): {err}") from None
        meta = header.pop(METADATA_KEY, None) or {}
        self._metadata = {str(k): str(v) for k, v in meta.items()} if isinstance(meta, dict) else {}
        self.data_start = 8 + n
        self.tensors: dict[str, tuple[np.dtype, tuple[int, ...], int, int]] = {}
        data_len = size - self.data_start
        for key, info in header.items():
            try:
                code, shape, (b, e) = info["dtype"], tuple(info["shape"]), info["data_offsets"]
                dtype = dtype_from_name(_CODES[code])
                if not all(type(d) is int and d >= 0 for d in shape) or type(b) is not int \
                        or type(e) is not int:
                    raise ValueError("non-integer shape or offsets")
                if len(shape) > MAX_NDIM or span(shape, dtype.itemsize) > MAX_BYTES:
                    raise ValueError(f"shape beyond the limits ({MAX_NDIM} dimensions, 2^62 "
                                     "bytes counting zero dimensions as 1)")
            except (KeyError, TypeError, ValueError) as exc:
                raise CorruptCheckpointError(f"{url}: tensor {key!r}: bad header entry "
                                             f"{info!r} ({exc})") from None
            want = math.prod(shape) * dtype.itemsize
            if not (0 <= b <= e <= data_len) or e - b != want:
                raise CorruptCheckpointError(
                    f"{url}: tensor {key!r}: bytes [{self.data_start + b}, {self.data_start + e}) "
                    f"do not hold {shape} {dtype.name} inside the file")
            self.tensors[key] = (dtype, shape, b, e)
        self._check_tiling(data_len)

        self._keys = list(self.tensors)
        self._index = {k: i for i, k in enumerate(self._keys)}

    def _check_tiling(self, data_len: int) -> None:
        """The safetensors library's rule: the tensors, in the order of their offsets,
        tile the data after the header exactly (each begins where the one before
        ends, the last ends at the end of the file), so no bytes are read twice (two
        tensors on the same bytes would load a small file as a huge one) and none is
        left over. Raises CorruptCheckpointError naming the tensors and the bytes."""
        start = self.data_start

        def bytes_of(key: str) -> str:
            return f"tensor {key!r} (bytes [{start + self.tensors[key][2]}, " \
                   f"{start + self.tensors[key][3]}))"

        at, before = 0, ""
        for key, (_, _, b, e) in sorted(self.tensors.items(), key=lambda kv: kv[1][2:]):
            if b < at:
                raise CorruptCheckpointError(f"{self.url}: {bytes_of(key)} overlaps "
                                             f"{bytes_of(before)}")
            if b > at:
                raise CorruptCheckpointError(
                    f"{self.url}: bytes [{start + at}, {start + b}) belong to no tensor (before "
                    f"{bytes_of(key)}); safetensors tensors must tile the data exactly")
            at, before = e, key
        if at != data_len:
            raise CorruptCheckpointError(
                f"{self.url}: bytes [{start + at}, {start + data_len}) at the end belong to no "
                "tensor; safetensors tensors must tile the data exactly")

    @property
    def url(self) -> str:
        return self.store.url(self.path)

    def shape(self, i: int) -> tuple[int, ...]:
        return self.tensors[self._keys[i]][1]

    def dtype(self, i: int) -> np.dtype:
        return self.tensors[self._keys[i]][0]

    def describe(self) -> dict:
        return {"header_bytes": self.data_start}

    def read_new(self, indices: Sequence[int], mmap: bool = False) -> list[np.ndarray]:
        keys = [self._keys[i] for i in indices]
        local = self.store.native_path(self.path) if mmap else None
        if local is not None:
            raw = np.memmap(local, dtype=np.uint8, mode="r")
            out = []
            for k in keys:
                dtype, shape, b, e = self.tensors[k]
                out.append(raw[self.data_start + b:self.data_start + e].view(dtype).reshape(shape))
            return out
        ranges = [(self.data_start + self.tensors[k][2], self.data_start + self.tensors[k][3])
                  for k in keys]
        arrays = []
        for k, data in zip(keys, self.store.read_ranges(self.path, ranges) if ranges else []):
            dtype, shape, b, e = self.tensors[k]
            if len(data) != e - b:
                raise CorruptCheckpointError(f"{self.url}: tensor {k!r}: bytes "
                                             f"[{self.data_start + b}, {self.data_start + e}) "
                                             f"are cut short ({len(data)} read)")
            arrays.append(np.frombuffer(data, dtype=dtype).reshape(shape).copy() if len(data)
                          else np.zeros(shape, dtype=dtype))
        return arrays

    def verify(self) -> None:
        """Reads every tensor (safetensors has no checksums: sizes and bounds only)."""
        for i in range(len(self._keys)):
            self.read_new([i])


def unsupported(src: CheckpointSource, indices: Sequence[int]) -> list[str]:
    """``key (dtype)`` of every tensor of ``indices`` that safetensors cannot hold."""
    names = [(src.keys[i], dtype_name(src.dtype(i))) for i in indices]
    return [f"{k} ({n})" for k, n in names if n not in _NAMES]


def check_names(names: Sequence[str]) -> None:
    """Raises ValueError naming a tensor name a safetensors header cannot hold:
    ``__metadata__`` (the header's metadata: the tensor would be lost, and the
    safetensors library refuses the file) or a name that is not UTF-8 text."""
    if METADATA_KEY in names:
        raise ValueError(f"a safetensors file cannot hold a tensor named {METADATA_KEY!r} "
                         "(the name of its metadata): rename it (key_map)")
    check_utf8(names, "tensor name")


def check_writable(src: CheckpointSource, indices: Sequence[int], what: str,
                   names: Sequence[str] | None = None) -> None:
    """Raises TypeError naming the tensors safetensors cannot hold, ValueError for a
    name it cannot hold (``check_names``; ``names``: the tensors' names in the
    output, default their keys); warns naming the values kept outside tensors
    (``what``: the file or folder written)."""
    check_names([src.keys[i] for i in indices] if names is None else names)
    bad = unsupported(src, indices)
    if bad:
        raise TypeError("safetensors cannot hold these tensors: " + ", ".join(bad))
    left_out = left_out_warning(text_values(src.tree, src.graph), what)
    if left_out is not None:
        warnings.warn(left_out, stacklevel=3)


def write_file(src: CheckpointSource, store: Store, path: str,
               progress: Callable[[int, int], Any] | None = None, *,
               indices: Sequence[int] | None = None, names: Sequence[str] | None = None,
               metadata: dict | None = None) -> int:
    """Writes tensors ``indices`` (default: all) of the opened checkpoint ``src`` under
    ``names`` (default: their keys) as the safetensors file ``path`` of ``store``, tensor
    by tensor (the source's reads are verified ones), through the store's one guarded
    write; returns the tensor bytes written. ``metadata``: the header's
    ``__metadata__`` (default: the source's). The caller checks the dtypes and names
    first (``check_writable``: before anything is written)."""
    indices = list(range(len(src.keys))) if indices is None else list(indices)
    names = [src.keys[i] for i in indices] if names is None else list(names)
    check_names(names)
    header: dict[str, Any] = {}
    if metadata is None:
        md = src.metadata
        metadata = md.get("safetensors") if isinstance(md.get("safetensors"), dict) \
            else {k: v if isinstance(v, str) else json.dumps(v) for k, v in md.items()}
    if metadata:
        header[METADATA_KEY] = {str(k): str(v) for k, v in metadata.items()}
    pos = 0
    for i, k in zip(indices, names):
        n = math.prod(src.shape(i)) * src.dtype(i).itemsize
        header[k] = {"dtype": _NAMES[dtype_name(src.dtype(i))], "shape": list(src.shape(i)),
                     "data_offsets": [pos, pos + n]}
        pos += n
    body = json.dumps(header, separators=(",", ":")).encode()
    body += b" " * (-len(body) % 8)
    head = struct.pack("<Q", len(body)) + body

    def produce() -> Iterator[Any]:
        yield head
        done = 0
        for arr in read_ahead(src, indices):
            yield np.ascontiguousarray(arr).view(np.uint8).reshape(-1).data
            done += arr.nbytes
            if progress is not None:
                progress(done, pos)

    # through the store's guarded write (retries, stall limits, bounded cleanup; a
    # failed write leaves no object, and a local file is replaced atomically)
    write_stream(store, path, len(head) + pos, produce, earlier_uploads_of(path))
    return pos


READ_AHEAD_BYTES = 256 << 20  # tensor bytes read ahead of the writer, at most
READ_AHEAD_TENSORS = 8


def read_ahead(src: CheckpointSource, indices: Sequence[int]) -> Iterator[np.ndarray]:
    """The tensors ``indices`` of ``src`` in order, each read whole, with up to
    ``READ_AHEAD_TENSORS`` reads (and ``READ_AHEAD_BYTES``) in flight on other threads,
    so that a remote source's ranged reads overlap each other and the writing. A
    failed read raises where its tensor is due; the reads not yet taken are
    cancelled or waited for."""
    sizes = [math.prod(src.shape(i)) * src.dtype(i).itemsize for i in indices]
    with concurrent.futures.ThreadPoolExecutor(READ_AHEAD_TENSORS,
                                               thread_name_prefix="pyckpt-read-ahead") as pool:
        pending: collections.deque = collections.deque()
        nxt, in_flight = 0, 0
        try:
            for k in range(len(indices)):
                while nxt < len(indices) and len(pending) < READ_AHEAD_TENSORS and (
                        not pending or in_flight + sizes[nxt] <= READ_AHEAD_BYTES):
                    pending.append(pool.submit(ReadPlan(src, [indices[nxt]]).execute))
                    in_flight += sizes[nxt]
                    nxt += 1
                (arr,) = pending.popleft().result()
                in_flight -= sizes[k]
                yield arr
        finally:
            for f in pending:
                f.cancel()


def copy_into(values: Sequence[np.ndarray], dsts: Sequence[Any]) -> None:
    """Copies whole tensors into their destinations (arrays, or ShardedArray blocks:
    the block's part of the tensor)."""
    for v, d in zip(values, dsts):
        if isinstance(d, ShardedArray):
            v = v[tuple(slice(o, o + n) for o, n in zip(d.offsets, d.local.shape))]
            d = d.local
        np.copyto(d, v, casting="no")


__all__ = ["is_safetensors_path", "detect", "FlatTensors", "SafetensorsFile", "write_file", "check_writable",
           "check_names", "copy_into", "dtype_name"]
