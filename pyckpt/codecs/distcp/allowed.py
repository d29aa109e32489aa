"""The allow-lists of the two restricted readers (unpickler.py): which globals a
DCP ``.metadata`` pickle and the ``data.pkl`` of a ``torch.save`` archive inside a
``.distcp`` file may name, and the stand-in each one becomes. Nothing here imports
torch: a global is a name, and what "calling" it does is written here, on plain
values. The torch dtype names and storage classes, with the numpy dtype each is
read as, are here too.
"""

from __future__ import annotations

from typing import Any

from .unpickler import Global, Obj, int_tuple

__all__ = ["METADATA_GLOBALS", "ARCHIVE_GLOBALS", "TORCH_DTYPES", "STORAGE_DTYPES",
           "UNTYPED_STORAGE", "UNREAD_ITEMSIZE", "MEMORY_FORMATS", "Rebuild"]

#: torch dtype name -> pyckpt dtype name (None: no numpy equivalent; listed, not read)
TORCH_DTYPES: dict[str, str | None] = {
    "float32": "float32", "float64": "float64", "float16": "float16", "bfloat16": "bfloat16",
    "int8": "int8", "int16": "int16", "int32": "int32", "int64": "int64", "uint8": "uint8",
    "uint16": "uint16", "uint32": "uint32", "uint64": "uint64", "bool": "bool",
    "complex64": "complex64", "complex128": "complex128",
    "float8_e4m3fn": "float8_e4m3fn", "float8_e5m2": "float8_e5m2",
    "float8_e4m3fnuz": "float8_e4m3fnuz", "float8_e5m2fnuz": "float8_e5m2fnuz",
    "float8_e8m0fnu": "float8_e8m0fnu",
    "complex32": None, "quint8": None, "qint8": None, "qint32": None, "quint4x2": None,
    "quint2x4": None, "float4_e2m1fn_x2": None, "bits1x8": None, "bits2x4": None,
    "bits4x2": None, "bits8": None, "bits16": None,
    **{f"{p}int{n}": None for p in ("", "u") for n in range(1, 8)},
}

#: bytes per element of the dtypes numpy lacks (for sizes only: they are not read)
UNREAD_ITEMSIZE: dict[str, int] = {"complex32": 4, "qint32": 4, "bits16": 2}

#: torch's typed storage classes (torch.save's ``_rebuild_tensor_v2``) -> torch dtype name
STORAGE_DTYPES: dict[str, str] = {
    "FloatStorage": "float32", "DoubleStorage": "float64", "HalfStorage": "float16",
    "BFloat16Storage": "bfloat16", "LongStorage": "int64", "IntStorage": "int32",
    "ShortStorage": "int16", "CharStorage": "int8", "ByteStorage": "uint8",
    "BoolStorage": "bool", "ComplexFloatStorage": "complex64",
    "ComplexDoubleStorage": "complex128",
}
#: the untyped storage of ``_rebuild_tensor_v3`` (its size counts bytes)
UNTYPED_STORAGE = "UntypedStorage"

_LAYOUTS = ("strided", "sparse_coo", "sparse_csr", "sparse_csc", "sparse_bsr", "sparse_bsc",
            "_mkldnn", "jagged")
#: DCP's _MEM_FORMAT_ENCODING values
MEMORY_FORMATS = {0: "contiguous_format", 1: "channels_last", 2: "preserve_format"}

_DCP = "torch.distributed.checkpoint.metadata"
_FS = "torch.distributed.checkpoint.filesystem"


def _dtype(name: str) -> Global:
    return Global("torch", name, "dtype")


def _layout(args: tuple) -> Global:
    """``torch.serialization._get_layout("torch.strided")``: that layout's name."""
    if len(args) != 1 or not isinstance(args[0], str) or not args[0].startswith("torch.") \
            or args[0][6:] not in _LAYOUTS:
        raise ValueError("not a torch layout name")
    return Global("torch", args[0][6:], "layout")


def _mem_format(args: tuple) -> Obj:
    if len(args) != 1 or type(args[0]) is not int or args[0] not in MEMORY_FORMATS:
        raise ValueError("not a memory format code")
    return Obj(f"{_DCP}._MEM_FORMAT_ENCODING", args)


def _path(args: tuple) -> str:
    """``pathlib.PosixPath(*parts)``: the path as text (DCP records its checkpoint_id)."""
    if not all(isinstance(a, str) for a in args):
        raise ValueError("path parts must be strings")
    return "/".join(args).replace("//", "/")


def _ordered_dict(args: tuple) -> dict:
    if args:
        raise ValueError("OrderedDict takes no arguments here (items come as SETITEMS)")
    return {}


class Rebuild:
    """What ``torch._utils._rebuild_tensor_v2`` / ``_v3`` were asked to build: the
    call's name and its arguments, checked by archive.py."""

    __slots__ = ("fn", "args")

    def __init__(self, fn: str, args: tuple) -> None:
        self.fn, self.args = fn, args

    def __repr__(self) -> str:
        return f"<{self.fn}>"


def _table(*globals_: Global) -> dict[tuple[str, str], Global]:
    return {(g.module, g.name): g for g in globals_}


_DTYPE_GLOBALS = [_dtype(n) for n in TORCH_DTYPES]
_LAYOUT_GLOBALS = [Global("torch", n, "layout") for n in _LAYOUTS]
_ORDERED_DICT = Global("collections", "OrderedDict", "class", _ordered_dict)

#: what a DCP ``.metadata`` pickle may name (docs/API.md lists them)
METADATA_GLOBALS = _table(
    *(Global(_DCP, n, "class") for n in (
        "Metadata", "TensorStorageMetadata", "ChunkStorageMetadata", "TensorProperties",
        "BytesStorageMetadata", "MetadataIndex", "StorageMeta")),
    Global(_DCP, "_MEM_FORMAT_ENCODING", "class", _mem_format),
    Global(_FS, "_StorageInfo", "class"),
    Global("torch", "Size", "class", int_tuple),
    Global("torch.serialization", "_get_layout", "function", _layout),
    *_DTYPE_GLOBALS, *_LAYOUT_GLOBALS,
    Global("pathlib", "PosixPath", "class", _path),
    Global("pathlib", "PurePosixPath", "class", _path),
    Global("pathlib", "WindowsPath", "class", _path),
    Global("pathlib", "PureWindowsPath", "class", _path),
    _ORDERED_DICT,
)


def _rebuild(name: str) -> Global:
    def call(args: tuple) -> Any:
        return Rebuild(name, args)
    return Global("torch._utils", name, "function", call)


#: what the ``data.pkl`` of a tensor item (a ``torch.save`` archive) may name
ARCHIVE_GLOBALS = _table(
    _rebuild("_rebuild_tensor_v2"), _rebuild("_rebuild_tensor_v3"),
    *(Global("torch", n, "storage") for n in STORAGE_DTYPES),
    Global("torch", UNTYPED_STORAGE, "storage"),
    Global("torch.storage", UNTYPED_STORAGE, "storage"),
    *_DTYPE_GLOBALS,
    _ORDERED_DICT,
)
