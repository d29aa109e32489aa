"""safetensors files: reading (``pyckpt.load("model.safetensors")``), and
conversion to and from pyckpt checkpoints (``pyckpt cp``).

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
from typing import Any, Callable, Iterable

import numpy as np

from .._dtypes import describe_dtypes, dtype_from_name, dtype_name, same_dtype
from ..errors import CorruptCheckpointError

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


class SafetensorsFile:
    """The validated header of a safetensors file in some store."""

    def __init__(self, store: Any, path: str) -> None:
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
        self.metadata = {str(k): str(v) for k, v in meta.items()} if isinstance(meta, dict) else {}
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

    def read(self, keys: Iterable[str], mmap: bool = False) -> dict[str, np.ndarray]:
        keys = list(keys)
        if mmap and self.store.local:
            raw = np.memmap(self.path, dtype=np.uint8, mode="r")
            out = {}
            for k in keys:
                dtype, shape, b, e = self.tensors[k]
                out[k] = raw[self.data_start + b:self.data_start + e].view(dtype).reshape(shape)
            return out
        ranges = [(self.data_start + self.tensors[k][2], self.data_start + self.tensors[k][3])
                  for k in keys]
        out = {}
        for k, data in zip(keys, self.store.read_ranges(self.path, ranges)):
            dtype, shape, _, _ = self.tensors[k]
            out[k] = np.frombuffer(data, dtype=dtype).reshape(shape).copy() if len(data) else \
                np.zeros(shape, dtype=dtype)
        return out


def load(path: Any, into: Any, select: Any, key_map: Any, mmap: bool,
         storage_options: dict | None) -> Any:
    """``pyckpt.load`` of a .safetensors file: the same modes as for checkpoints."""
    from ..flat import map_keys, select_keys
    from ..storage import resolve
    from ..tree import nest_flat

    store, p = resolve(path, storage_options)
    st = SafetensorsFile(store, p)
    keys = list(st.tensors)
    if select is not None:
        keys = select_keys(keys, select)
    mapping = map_keys(keys, key_map)
    if into is None:
        values = st.read(mapping, mmap=mmap)
        if select is None and key_map is None:
            return values  # the saved structure: a flat dict
        return nest_flat({mapping[k]: v for k, v in values.items()})
    return _fill(st, into, mapping)


def _fill(st: SafetensorsFile, into: Any, mapping: dict[str, str]) -> Any:
    from ..errors import CheckpointKeyError
    from ..load_into import collect_targets

    source = {t: k for k, t in mapping.items()}
    targets = collect_targets(into)
    missing = [t.key for t in targets if t.key not in source]
    if missing:
        raise CheckpointKeyError(f"key(s) of `into` not in {st.store.url(st.path)}: "
                                 + ", ".join(map(repr, missing)))
    problems = []
    for t in targets:
        dtype, shape, _, _ = st.tensors[source[t.key]]
        if t.array is None or tuple(t.array.shape) != shape or not same_dtype(t.array.dtype, dtype):
            names = describe_dtypes(dtype, t.array.dtype) if t.array is not None else (dtype.name,)
            problems.append(f"{t.key!r}: file has {shape} {names[0]}, target has "
                            f"{None if t.array is None else (tuple(t.array.shape), names[1])}")
    if problems:
        raise ValueError("cannot load into the given tree:\n  " + "\n  ".join(problems))
    values = st.read(source[t.key] for t in targets)
    for t in targets:
        assert t.array is not None  # a target without an array is reported as a problem above
        np.copyto(t.array, values[source[t.key]])
    return into


def to_checkpoint(src: Any, dst: Any, *, src_options: dict | None = None,
                  dst_options: dict | None = None,
                  progress: Callable[[int, int], Any] | None = None) -> None:
    """A safetensors file -> a pyckpt checkpoint (dtypes and metadata kept)."""
    import pyckpt
    from ..storage import resolve

    store, p = resolve(src, src_options)
    st = SafetensorsFile(store, p)
    values = st.read(st.tensors)
    pyckpt.save(values, dst, metadata={"safetensors": st.metadata} if st.metadata else None,
                storage_options=dst_options, progress=progress)


def from_checkpoint(src: Any, dst: Any, *, src_options: dict | None = None,
                    dst_options: dict | None = None,
                    progress: Callable[[int, int], Any] | None = None) -> None:
    """A pyckpt checkpoint -> a safetensors file, tensor by tensor (verified reads)."""
    from ..engine.reader import open_checkpoint
    from ..flat import read_values
    from ..storage import resolve

    ck = open_checkpoint(src, src_options)
    m = ck.manifest
    unsupported = [f"{k} ({m.dtype_names[i]})" for i, k in enumerate(m.keys)
                   if m.dtype_names[i] not in _NAMES]
    if unsupported:
        raise TypeError("safetensors cannot hold these tensors: " + ", ".join(unsupported))
    header: dict[str, Any] = {}
    meta = m.metadata.get("safetensors") if isinstance(m.metadata.get("safetensors"), dict) \
        else {k: v if isinstance(v, str) else json.dumps(v) for k, v in m.metadata.items()}
    if meta:
        header["__metadata__"] = {str(k): str(v) for k, v in meta.items()}
    pos = 0
    for i, k in enumerate(m.keys):
        n = math.prod(m.shapes[i]) * m.dtype(i).itemsize
        header[k] = {"dtype": _NAMES[m.dtype_names[i]], "shape": list(m.shapes[i]),
                     "data_offsets": [pos, pos + n]}
        pos += n
    body = json.dumps(header, separators=(",", ":")).encode()
    body += b" " * (-len(body) % 8)
    store, p = resolve(dst, dst_options)
    total, done = pos, 0
    with store.open_write(p) as f:
        f.write(struct.pack("<Q", len(body)) + body)
        for k in m.keys:
            arr = read_values(ck, [k])[k]
            f.write(np.ascontiguousarray(arr).view(np.uint8).reshape(-1).data)
            done += arr.nbytes
            if progress is not None:
                progress(done, total)


__all__ = ["is_safetensors_path", "SafetensorsFile", "load", "to_checkpoint", "from_checkpoint",
           "dtype_name"]
