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

import json
import math
import struct
import warnings
from typing import Any, Callable, Iterator, Mapping, Sequence

import numpy as np

from .._dtypes import dtype_from_name, dtype_name
from ..errors import CorruptCheckpointError
from ..format.source import CheckpointSource
from ..format.values import left_out_warning, text_values
from ..sharded import ShardedArray
from ..storage import Store
from ..storage.streamed import write_stream

MAX_HEADER = 100 << 20

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


class SafetensorsFile(CheckpointSource):
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
            header = json.loads(store.read_ranges(path, [(8, 8 + n)])[0])
        except (ValueError, UnicodeDecodeError) as err:
            raise CorruptCheckpointError(f"{url}, bytes [8, {8 + n}): bad JSON header: {err}") from None
        if not isinstance(header, dict):
            raise CorruptCheckpointError(f"{url}: the header is not a JSON object")
        meta = header.pop("__metadata__", None) or {}
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
            except (KeyError, TypeError, ValueError) as exc:
                raise CorruptCheckpointError(f"{url}: tensor {key!r}: bad header entry "
                                             f"{info!r} ({exc})") from None
            want = math.prod(shape) * dtype.itemsize
            if not (0 <= b <= e <= data_len) or e - b != want:
                raise CorruptCheckpointError(
                    f"{url}: tensor {key!r}: bytes [{self.data_start + b}, {self.data_start + e}) "
                    f"do not hold {shape} {dtype.name} inside the file")
            self.tensors[key] = (dtype, shape, b, e)

        self._keys = list(self.tensors)
        self._index = {k: i for i, k in enumerate(self._keys)}

    @property
    def url(self) -> str:
        return self.store.url(self.path)

    @property
    def keys(self) -> Sequence[str]:
        return self._keys

    @property
    def index(self) -> Mapping[str, int]:
        return self._index

    def shape(self, i: int) -> tuple[int, ...]:
        return self.tensors[self._keys[i]][1]

    def dtype(self, i: int) -> np.dtype:
        return self.tensors[self._keys[i]][0]

    @property
    def metadata(self) -> dict:
        return self._metadata

    @property
    def tree(self) -> dict:
        """A flat dict of every tensor under its own name (what the file holds)."""
        return {"d": [[k, k] for k in self._keys]}

    def describe(self) -> dict:
        return {"header_bytes": self.data_start}

    def read(self, indices: Sequence[int], dsts: Sequence[Any]) -> None:
        values = self.read_new(indices)
        for v, d in zip(values, dsts):
            if isinstance(d, ShardedArray):
                v = v[tuple(slice(o, o + n) for o, n in zip(d.offsets, d.local.shape))]
                d = d.local
            np.copyto(d, v, casting="no")

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


def write_file(src: CheckpointSource, store: Store, path: str,
               progress: Callable[[int, int], Any] | None = None) -> None:
    """Writes the opened checkpoint ``src`` as the safetensors file ``path`` of ``store``,
    tensor by tensor (the source's reads are verified ones), through the store's one
    guarded write; warns naming the values a safetensors file cannot keep."""
    names = [dtype_name(src.dtype(i)) for i in range(len(src.keys))]
    unsupported = [f"{k} ({n})" for k, n in zip(src.keys, names) if n not in _NAMES]
    if unsupported:
        raise TypeError("safetensors cannot hold these tensors: " + ", ".join(unsupported))
    left_out = left_out_warning(text_values(src.tree, src.graph), "safetensors file")
    if left_out is not None:
        warnings.warn(left_out, stacklevel=3)
    header: dict[str, Any] = {}
    md = src.metadata
    meta = md.get("safetensors") if isinstance(md.get("safetensors"), dict) \
        else {k: v if isinstance(v, str) else json.dumps(v) for k, v in md.items()}
    if meta:
        header["__metadata__"] = {str(k): str(v) for k, v in meta.items()}
    pos = 0
    for i, k in enumerate(src.keys):
        n = math.prod(src.shape(i)) * src.dtype(i).itemsize
        header[k] = {"dtype": _NAMES[names[i]], "shape": list(src.shape(i)),
                     "data_offsets": [pos, pos + n]}
        pos += n
    body = json.dumps(header, separators=(",", ":")).encode()
    body += b" " * (-len(body) % 8)
    head = struct.pack("<Q", len(body)) + body

    def produce() -> Iterator[Any]:
        yield head
        done = 0
        for i in range(len(src.keys)):
            (arr,) = src.read_new([i])
            yield np.ascontiguousarray(arr).view(np.uint8).reshape(-1).data
            done += arr.nbytes
            if progress is not None:
                progress(done, pos)

    # through the store's guarded write (retries, stall limits, bounded cleanup; a
    # failed write leaves no object, and a local file is replaced atomically)
    write_stream(store, path, len(head) + pos, produce)


__all__ = ["is_safetensors_path", "detect", "SafetensorsFile", "write_file", "dtype_name"]
