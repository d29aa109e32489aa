"""Dtype names stored in checkpoints (docs/FORMAT.md, "Dtypes").

Stored names are numpy's canonical names for the builtin numeric types
(``float32``, ``complex64``, ``bool``...), ml_dtypes' names for its types
(``bfloat16``, ``float8_e4m3fn``...), and ``S<n>``/``U<n>``/``M8[unit]``/
``m8[unit]`` for fixed-size bytes, unicode and datetime types. Data is always
little-endian on disk.
"""

from __future__ import annotations

import re

import numpy as np

_BUILTIN = {
    "bool", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64",
    "float16", "float32", "float64", "complex64", "complex128",
}
_FIXED = re.compile(r"^(S|U)([1-9][0-9]{0,8})$|^(M8|m8)\[([0-9]*[a-zA-Z]{1,2})\]$")


def _ml_dtypes():
    try:
        import ml_dtypes
    except ImportError:
        return None
    return ml_dtypes


def _ml_dtype_names() -> dict[str, np.dtype]:
    ml = _ml_dtypes()
    if ml is None:
        return {}
    out = {}
    for name in dir(ml):
        obj = getattr(ml, name)
        if isinstance(obj, type) and issubclass(obj, np.generic):
            out[np.dtype(obj).name] = np.dtype(obj)
    return out


_NAME_CACHE: dict[np.dtype, str] = {}


def dtype_name(dtype: np.dtype) -> str:
    """The stored name of a dtype; TypeError for dtypes pyckpt cannot store."""
    name = _NAME_CACHE.get(dtype)
    if name is None:
        name = _dtype_name(np.dtype(dtype))
        if len(_NAME_CACHE) < 4096:
            _NAME_CACHE[dtype] = name
    return name


def _dtype_name(dtype: np.dtype) -> str:
    if dtype.name in _BUILTIN:
        return dtype.name
    if dtype.kind in "SU":
        return f"{dtype.kind}{dtype.itemsize // (4 if dtype.kind == 'U' else 1)}"
    if dtype.kind in "Mm":
        return dtype.str[1:]
    if dtype.names is None and dtype.subdtype is None and dtype.kind in "Vfiuc":
        ml = _ml_dtype_names().get(dtype.name)
        if ml is not None and ml == dtype:
            return dtype.name
    if dtype.hasobject:
        raise TypeError("pyckpt cannot store arrays of Python objects (dtype object); "
                        "convert them to a fixed-size dtype")
    raise TypeError(f"pyckpt cannot store arrays of dtype {dtype!r} "
                    "(supported: bool, ints, floats, complex, bytes/str, datetime, ml_dtypes)")


def dtype_from_name(name: str) -> np.dtype:
    """Inverse of dtype_name; ValueError for an unknown or unavailable name."""
    if not isinstance(name, str):
        raise ValueError(f"dtype name must be a string, got {name!r}")
    if name in _BUILTIN:
        return np.dtype(name).newbyteorder("<")
    m = _FIXED.match(name)
    if m:
        return np.dtype("<" + name) if name[0] in "UMm" else np.dtype(name)
    ml = _ml_dtype_names().get(name)
    if ml is not None:
        return ml
    if _ml_dtypes() is None and (name.startswith(("bfloat", "float8", "float4", "float6", "int4", "uint4", "int2", "uint2"))):
        raise ValueError(f"dtype {name!r} needs the ml_dtypes package: pip install ml_dtypes")
    raise ValueError(f"unknown dtype {name!r}")


def little_endian(arr: np.ndarray) -> np.ndarray:
    """``arr`` itself if its bytes are little-endian (or byte order does not apply), else a copy."""
    bo = arr.dtype.byteorder
    if bo == ">" or (bo == "=" and np.little_endian is False):
        return arr.astype(arr.dtype.newbyteorder("<"))
    return arr
