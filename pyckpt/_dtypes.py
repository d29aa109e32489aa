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

from .errors import DtypeUnavailableError

_BUILTIN = {
    "bool", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64",
    "float16", "float32", "float64", "complex64", "complex128",
}
_FIXED = re.compile(r"^(S|U)([1-9][0-9]{0,8})$|^(M8|m8)\[([0-9]*[a-zA-Z]{1,2})\]$")


#: how to get the dtypes numpy lacks (bfloat16, float8...): ml_dtypes, a dependency
#: of pyckpt that an environment may still lack (installed with --no-deps...)
INSTALL_HINT = "pip install ml_dtypes"
#: ml_dtypes' names (those it has or may add) and their bytes per element: known
#: here so that a checkpoint holding them opens, counts and verifies without it
_ML_WIDE = {"bfloat16": 2, "bcomplex32": 4, "complex32": 4}
_ML_BYTE = re.compile(r"^(float[468]_e[0-9]+m[0-9]+[a-z0-9]*|u?int[124])$")
#: metadata key of a placeholder dtype (``stored_dtype``)
_UNDECODABLE = "pyckpt.undecodable"


def _ml_dtypes():
    try:
        import ml_dtypes  # a dependency, but a broken install must still open checkpoints
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
    name = undecodable(dtype)  # before the cache: placeholders equal plain np.void
    if name is not None:
        return name
    name = _NAME_CACHE.get(dtype)
    if name is None:
        name = _dtype_name(np.dtype(dtype))
        if len(_NAME_CACHE) < 4096:
            _NAME_CACHE[dtype] = name
    return name


def refuse_objects(dtype: np.dtype, where: str = "") -> None:
    """TypeError for a dtype holding Python objects (references: never stored or
    copied as bytes); ``where`` (a key) starts the message."""
    if dtype.hasobject:
        raise TypeError((f"{where}: " if where else "") + "pyckpt cannot store or copy "
                        "arrays of Python objects (dtype object); convert them to a "
                        "fixed-size dtype")


def refuse_masked(arr: np.ndarray) -> None:
    """TypeError for a numpy masked array (an ndarray subclass): pyckpt would store
    or fill its data and lose its mask."""
    if isinstance(arr, np.ma.MaskedArray):
        raise TypeError("a numpy masked array: its mask would be lost; store "
                        "np.ma.getdata(x) and np.ma.getmaskarray(x) as two arrays")


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
    refuse_objects(dtype)
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
        try:
            return np.dtype("<" + name) if name[0] in "UMm" else np.dtype(name)
        except (TypeError, ValueError):  # numpy rejects the unit ("M8[zz]") or the size
            raise ValueError(f"unknown dtype {name!r}") from None
    ml = _ml_dtype_names().get(name)
    if ml is not None:
        return ml
    if _ml_itemsize(name) is not None:
        raise ValueError(f"dtype {name!r} {missing_hint()}")
    raise ValueError(f"unknown dtype {name!r}")


def _ml_itemsize(name: str) -> int | None:
    """Bytes per element of an ml_dtypes name (None: not one)."""
    return _ML_WIDE.get(name) or (1 if _ML_BYTE.match(name) else None)


def missing_hint() -> str:
    """Why an ml_dtypes name cannot be decoded here, and the fix."""
    ml = _ml_dtypes()
    if ml is None:
        return f"needs the ml_dtypes package, which is missing: {INSTALL_HINT}"
    return (f"is unknown to the installed ml_dtypes {getattr(ml, '__version__', '')}: "
            f"pip install -U ml_dtypes")


def stored_dtype(name: str) -> np.dtype:
    """``dtype_from_name`` for reading a stored checkpoint: an ml_dtypes name this
    Python cannot decode (``missing_hint``) gives a placeholder instead of an error,
    raw bytes of the same size (``np.void``) that ``undecodable`` recognises, so that
    the checkpoint still opens and its bytes are counted, verified and listed; readers
    refuse its values (``check_decodable``). ValueError for any other unknown name."""
    try:
        return dtype_from_name(name)
    except ValueError:
        size = _ml_itemsize(name)
        if size is None:
            raise
        return np.dtype(f"V{size}", metadata={_UNDECODABLE: name})


def undecodable(dtype: np.dtype) -> str | None:
    """The stored name of a ``stored_dtype`` placeholder; None for a real dtype."""
    md = dtype.metadata
    return md.get(_UNDECODABLE) if md else None


def check_decodable(dtype: np.dtype, key: str, where: str) -> None:
    """DtypeUnavailableError naming the key, the checkpoint (``where``), the dtype and
    the fix when ``dtype`` is a placeholder (``stored_dtype``)."""
    name = undecodable(dtype)
    if name is not None:
        raise unavailable(key, name, where)


def unavailable(key: str, name: str, where: str) -> DtypeUnavailableError:
    """The error for tensor ``key`` of checkpoint ``where`` whose stored dtype ``name``
    cannot be decoded here."""
    return DtypeUnavailableError(f"tensor {key!r} of {where} has dtype {name}, which this "
                                 f"Python cannot decode: it {missing_hint()}")


def little_endian(arr: np.ndarray) -> np.ndarray:
    """``arr`` itself if its bytes are little-endian (or byte order does not apply), else a copy."""
    bo = arr.dtype.byteorder
    if bo == ">" or (bo == "=" and np.little_endian is False):
        return arr.astype(arr.dtype.newbyteorder("<"))
    return arr


# ---------------------------------------------------------------------------
# Byte order of targets (one home for the comparison, docs/FORMAT.md "Dtypes")
# ---------------------------------------------------------------------------

def _native(dtype: np.dtype) -> np.dtype:
    return dtype if dtype.isnative else dtype.newbyteorder("=")


def same_dtype(a: np.dtype, b: np.dtype) -> bool:
    """Whether a and b hold the same values the same way, byte order aside
    (``>f8`` and ``<f8`` match, ``f4`` and ``f8`` do not)."""
    a, b = np.dtype(a), np.dtype(b)
    return a == b or _native(a) == _native(b)


def _order(dtype: np.dtype) -> str:
    """'little-endian', 'big-endian', or '' where byte order does not apply."""
    bo = dtype.byteorder
    if bo == "|" or (dtype.itemsize <= 1 and dtype.kind != "U"):
        return ""
    if bo == "=":
        return "little-endian" if np.little_endian else "big-endian"
    return "little-endian" if bo == "<" else "big-endian"


def describe_dtypes(a: np.dtype, b: np.dtype) -> tuple[str, str]:
    """The names of two dtypes for a message, with their byte order where it differs."""
    a, b = np.dtype(a), np.dtype(b)
    oa, ob = _order(a), _order(b)
    if oa and ob and oa != ob:
        return f"{_label(a)} ({oa})", f"{_label(b)} ({ob})"
    return _label(a), _label(b)


def _label(dtype: np.dtype) -> str:
    """A dtype's name as users write it: the stored name for bytes, str and datetime
    (``U22``, ``M8[D]``; numpy's ``name`` is ``str704`` for ``<U22``), the stored one
    of a placeholder (``stored_dtype``)."""
    return _dtype_name(dtype) if dtype.kind in "SUMm" else undecodable(dtype) or dtype.name


def source_order_view(dst: np.ndarray, src_dtype: np.dtype) -> tuple[np.ndarray, bool]:
    """(view, swap): a view of dst's memory typed exactly ``src_dtype``, to be filled
    with the source's bytes, and whether dst must then be byteswapped in place
    (``finish_byte_order``) to hold the same values in its own byte order.

    Readers copy raw bytes, so a target whose byte order differs from the
    source's is filled through this view. Needs ``same_dtype(dst.dtype, src_dtype)``.
    """
    src_dtype = np.dtype(src_dtype)
    if dst.dtype == src_dtype or _order(dst.dtype) == _order(src_dtype):
        return dst, False
    return dst.view(src_dtype), True


def finish_byte_order(arrays: list[np.ndarray]) -> None:
    """Byteswaps in place the targets ``source_order_view`` said need it (each once)."""
    done: set[int] = set()
    for a in arrays:
        if id(a) not in done:
            done.add(id(a))
            a.byteswap(inplace=True)
