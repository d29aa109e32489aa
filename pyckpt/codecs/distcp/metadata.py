"""DCP's ``.metadata`` file, decoded without torch: the restricted reader
(unpickler.py, with allowed.py's ``METADATA_GLOBALS``) gives plain records, and
``decode_metadata`` checks them into ``DcpMetadata``.

What ``torch.distributed.checkpoint`` (FileSystemWriter) stores there, as torch
2.13 writes it: a ``Metadata`` with ``state_dict_metadata`` (fully qualified
name -> ``TensorStorageMetadata(properties, size, chunks)`` or
``BytesStorageMetadata()``), ``storage_data`` (``MetadataIndex(fqn, offset)`` ->
``_StorageInfo(relative_path, offset, length[, transform_descriptors])``, one
per chunk and per bytes entry), ``planner_data``, ``storage_meta`` and
``version``. Every chunk lies inside its tensor, the chunks of a tensor tile it
exactly, and every chunk and bytes entry has its storage record, naming a plain
file of the checkpoint's directory; no two of these items share a byte of a file
(one 4 MiB file could otherwise be read as 800 MiB).

The records the restricted reader returns can share parts (one list, dict or
string referenced many times costs a few bytes per reference): the checks here
do bounded work per reference (a record has at most ``MAX_FIELDS`` fields, a
file name ``MAX_NAME`` characters, messages are formatted only on failure) and
refuse a chunk list shared by two tensors, so opening stays linear in the file.
The records DCP writes (exact classes, states naming only DCP's fields, integer
boxes inside their tensor) take a plain path of a few steps per chunk and storage
record (``_plain_chunk``, ``_plain_storage_record``); anything else goes through the
full checks, which give the messages. 200,000 chunks of one tensor (25 MB) open in
about 1.65 s on a quiet 2-core machine, about a quarter of it the pickle machine.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from functools import partial
from typing import Any, Callable, NamedTuple, Union

from ...errors import CorruptCheckpointError
from ...format.json_scan import no_cyclic_gc
from ...sharded.boxes import check_partition
from .allowed import METADATA_GLOBALS, TORCH_DTYPES, UNREAD_ITEMSIZE
from .unpickler import Global, Obj, restricted_load

__all__ = ["StorageInfo", "Chunk", "TensorEntry", "BytesEntry", "DcpMetadata",
           "decode_metadata", "torch_itemsize", "MAX_DIMS", "MAX_BYTES"]

MAX_DIMS = 64
MAX_BYTES = 1 << 62  # a dimension, an offset, a length, a tensor's bytes
MAX_FIELDS = 32      # fields of a record's state (DCP's have at most 5)
MAX_NAME = 255       # characters of a data file's name (NAME_MAX)
MAX_TRANSFORMS = 16  # transform descriptors of one item
#: what is being checked, for messages: text, or a function making it (on failure only)
What = Union[str, Callable[[], str]]
_M = "torch.distributed.checkpoint.metadata."
_PLAIN_NAME = re.compile(r"^[^/\\\x00]+$")
_INDEX = _M + "MetadataIndex"
_CHUNK = _M + "ChunkStorageMetadata"
_STORAGE_INFO = ("torch.distributed.checkpoint.filesystem._StorageInfo", _M + "_StorageInfo")
_NO_TRANSFORMS: tuple[Any, ...] = (None, [], ())
#: the fields DCP's records have (a state naming only these has string names, few)
_INDEX_FIELDS = frozenset(("fqn", "offset", "index"))
_STORAGE_FIELDS = frozenset(("relative_path", "offset", "length", "transform_descriptors"))
_CHUNK_FIELDS = frozenset(("offsets", "sizes"))


class StorageInfo(NamedTuple):
    """Where an item's bytes are: ``length`` bytes at ``offset`` in ``relative_path``
    (a NamedTuple, as ``Chunk``: a file holds one per chunk, and frozen dataclasses
    cost about 0.1 s more to construct in a 200,000-chunk open)."""

    relative_path: str
    offset: int
    length: int
    transforms: tuple[str, ...] = ()


class Chunk(NamedTuple):
    """One stored chunk of a tensor: the box [offsets, offsets + sizes)."""

    offsets: tuple[int, ...]
    sizes: tuple[int, ...]
    storage: StorageInfo


@dataclass(frozen=True)
class TensorEntry:
    key: str
    torch_dtype: str            # torch's name ("bfloat16")
    dtype_name: str | None      # pyckpt's name, None when numpy has no such dtype
    layout: str                 # "strided" unless a sparse/other layout was recorded
    shape: tuple[int, ...]
    chunks: tuple[Chunk, ...]


@dataclass(frozen=True)
class BytesEntry:
    """A non-tensor value: the bytes DCP wrote for it (its torch.save archive),
    listed, never decoded."""

    key: str
    storage: StorageInfo


@dataclass(frozen=True)
class DcpMetadata:
    entries: tuple[TensorEntry | BytesEntry, ...]
    version: str | None
    save_id: str | None
    checkpoint_id: str | None


class _Checker:
    """Checks the records of one ``.metadata`` (``where``: its URL, for messages)."""

    def __init__(self, where: str) -> None:
        self.where = where
        self.chunk_lists: set[int] = set()  # ids of the chunk lists seen (kept alive by the tree)

    def bad(self, what: What) -> CorruptCheckpointError:
        return CorruptCheckpointError(f"DCP metadata {self.where}: {_say(what)}")

    def state(self, obj: Any, cls: str, what: What) -> Any:
        if not isinstance(obj, Obj) or obj.cls != _M + cls and not (
                cls == "_StorageInfo" and obj.cls == "torch.distributed.checkpoint.filesystem."
                "_StorageInfo"):
            raise self.bad(lambda: f"{_say(what)} is {_kind(obj)}, not a {cls}")
        return obj.state

    def fields(self, obj: Any, cls: str, what: What) -> dict:
        st = self.state(obj, cls, what)
        if st is None:
            return {}
        if type(st) is not dict or len(st) > MAX_FIELDS or not all(
                isinstance(k, str) for k in st):
            raise self.bad(lambda: f"{_say(what)}: the {cls}'s state is {_kind(st)}, not its "
                           f"fields (at most {MAX_FIELDS} names)")
        return st

    def count(self, v: Any, what: What) -> int:
        if type(v) is not int or not 0 <= v <= MAX_BYTES:
            raise self.bad(lambda: f"{_say(what)} is {_kind(v)}, not an integer in [0, 2**62]")
        return v

    def dims(self, v: Any, what: What) -> tuple[int, ...]:
        if type(v) is not tuple or len(v) > MAX_DIMS:
            raise self.bad(lambda: f"{_say(what)} is {_kind(v)}, not a torch.Size of at most "
                           f"{MAX_DIMS} dims")
        return tuple(self.count(d, what) for d in v)


def _say(what: What) -> str:
    return what if isinstance(what, str) else what()


def _kind(v: Any) -> str:
    """What an untrusted value is, briefly."""
    if isinstance(v, (Obj, Global)):
        return repr(v)
    if isinstance(v, (int, float, bool, type(None))):
        return repr(v)
    if isinstance(v, str):
        return repr(v[:60])
    return f"a {type(v).__name__}"


def _storage(c: _Checker, obj: Any, what: What) -> StorageInfo:
    f = c.fields(obj, "_StorageInfo", what)
    path = f.get("relative_path")
    if not isinstance(path, str) or len(path) > MAX_NAME or not _PLAIN_NAME.match(path) \
            or path in (".", ".."):
        raise c.bad(lambda: f"{_say(what)}: relative_path {_kind(path)} is not a plain file "
                    "name of the checkpoint's directory")
    offset = c.count(f.get("offset"), lambda: f"{_say(what)}: offset")
    length = c.count(f.get("length"), lambda: f"{_say(what)}: length")
    if offset + length > MAX_BYTES:
        raise c.bad(lambda: f"{_say(what)}: bytes [{offset}, {offset + length}) are impossible")
    tds = f.get("transform_descriptors")
    if tds is None:
        tds = ()
    if not isinstance(tds, (list, tuple)) or len(tds) > MAX_TRANSFORMS or not all(
            isinstance(t, str) for t in tds):
        raise c.bad(lambda: f"{_say(what)}: transform_descriptors is {_kind(tds)}, not a list "
                    f"of at most {MAX_TRANSFORMS} names")
    return StorageInfo(path, offset, length, tuple(tds))


def _storage_index(c: _Checker, storage_data: Any) -> dict[tuple[str, Any], StorageInfo]:
    """(fqn, chunk offsets or None) -> StorageInfo, from ``storage_data``."""
    if type(storage_data) is not dict:
        raise c.bad(f"storage_data is {_kind(storage_data)}, not a dict (not written by "
                    "FileSystemWriter?)")
    out: dict[tuple[str, Any], StorageInfo] = {}
    names: set[str] = set()  # relative paths found plain
    for idx, info in storage_data.items():
        key_info = _plain_storage_record(idx, info, names)
        if key_info is not None:
            out[key_info[0]] = key_info[1]
            continue
        f = c.fields(idx, "MetadataIndex", "a storage_data key")
        fqn = f.get("fqn")
        if not isinstance(fqn, str):
            raise c.bad(f"a storage_data key has fqn {_kind(fqn)}")
        off = f.get("offset")

        def where(fqn: str = fqn) -> str:
            return f"storage record of {fqn!r}"
        key = (fqn, None if off is None else c.dims(off, lambda: f"{where()}: offset"))
        out[key] = _storage(c, info, where)
    return out


def _plain_storage_record(idx: Any, info: Any, names: set[str]) -> tuple[
        tuple[str, Any], StorageInfo] | None:
    """The common case of one storage_data item, checked in a few steps: ((fqn, offset),
    StorageInfo) when the pair is exactly what DCP writes and ``_storage_index``'s
    checks would accept it as it is; None sends it through those checks (their
    messages). ``names``: relative paths already found plain."""
    if type(idx) is not Obj or idx.cls != _INDEX or type(info) is not Obj \
            or info.cls not in _STORAGE_INFO:
        return None
    f, g = idx.state, info.state
    if type(f) is not dict or type(g) is not dict or not f.keys() <= _INDEX_FIELDS \
            or not g.keys() <= _STORAGE_FIELDS:
        return None
    fqn, off = f.get("fqn"), f.get("offset")
    path, offset, length = g.get("relative_path"), g.get("offset"), g.get("length")
    if type(fqn) is not str or not (off is None or _counts(off)) \
            or type(offset) is not int or type(length) is not int \
            or not (0 <= offset and 0 <= length and offset + length <= MAX_BYTES) \
            or g.get("transform_descriptors") not in _NO_TRANSFORMS or type(path) is not str:
        return None
    if path not in names:
        if len(path) > MAX_NAME or not _PLAIN_NAME.match(path) \
                or path in (".", ".."):
            return None
        names.add(path)
    return (fqn, off), StorageInfo(path, offset, length)


def _counts(v: Any) -> bool:
    """``v`` is what ``_Checker.dims`` returns unchanged: a tuple of at most MAX_DIMS
    integers in [0, MAX_BYTES]."""
    if type(v) is not tuple or len(v) > MAX_DIMS:
        return False
    for d in v:
        if type(d) is not int or not 0 <= d <= MAX_BYTES:
            return False
    return True


def _properties(c: _Checker, obj: Any, key: str) -> tuple[str, str]:
    """(torch dtype name, layout name) of a TensorProperties (tuple or dict state)."""
    st = c.state(obj, "TensorProperties", f"tensor {key!r}: properties")
    if type(st) is tuple and len(st) == 5:
        dtype, layout = st[0], st[1]
    elif type(st) is dict:
        dtype, layout = st.get("dtype"), st.get("layout", Global("torch", "strided", "layout"))
    else:
        raise c.bad(f"tensor {key!r}: TensorProperties state is {_kind(st)}")
    if not isinstance(dtype, Global) or dtype.kind != "dtype":
        raise c.bad(f"tensor {key!r}: dtype is {_kind(dtype)}, not a torch dtype")
    if not isinstance(layout, Global) or layout.kind != "layout":
        raise c.bad(f"tensor {key!r}: layout is {_kind(layout)}, not a torch layout")
    return dtype.name, layout.name


def _tensor(c: _Checker, key: str, obj: Any,
            storage: dict[tuple[str, Any], StorageInfo]) -> TensorEntry:
    f = c.fields(obj, "TensorStorageMetadata", f"entry {key!r}")
    torch_dtype, layout = _properties(c, f.get("properties"), key)
    shape = c.dims(f.get("size"), f"tensor {key!r}: size")
    name = TORCH_DTYPES[torch_dtype]
    raw_chunks = f.get("chunks")
    if type(raw_chunks) is not list:
        raise c.bad(f"tensor {key!r}: chunks is {_kind(raw_chunks)}, not a list")
    if raw_chunks and id(raw_chunks) in c.chunk_lists:
        raise c.bad(f"tensor {key!r}: its list of chunks is another tensor's too (DCP writes "
                    "one list per tensor)")
    c.chunk_lists.add(id(raw_chunks))
    chunks: list[Chunk] = []
    seen: set[tuple] = set()
    records: set[int] = set()  # one record listed again: nothing new to check
    itemsize = 0 if name is None else _itemsize(name)
    for n, ch in enumerate(raw_chunks):
        if id(ch) in records:
            continue
        records.add(id(ch))
        chunk = _plain_chunk(ch, key, shape, itemsize, storage) or \
            _chunk(c, partial(_chunk_name, key, n), ch, key, shape, name, storage)
        box = (chunk.offsets, chunk.sizes)
        if box not in seen:  # a replica listed twice: one record
            seen.add(box)
            chunks.append(chunk)
    if name is not None and math.prod(shape) * _itemsize(name) > MAX_BYTES:
        raise c.bad(f"tensor {key!r}: shape {list(shape)} is too large")
    problem = check_partition(shape, [(ch.offsets, ch.sizes) for ch in chunks])
    if problem is not None:
        raise c.bad(f"tensor {key!r} of shape {list(shape)}: its chunks do not tile it "
                    f"({problem})")
    return TensorEntry(key, torch_dtype, name, layout, shape, tuple(chunks))


def _plain_chunk(ch: Any, key: str, shape: tuple[int, ...], itemsize: int,
                 storage: dict[tuple[str, Any], StorageInfo]) -> Chunk | None:
    """The common case of ``_chunk``, checked in a few steps: the Chunk when ``ch`` is
    exactly what DCP writes and ``_chunk`` would accept it as it is; None sends it
    through ``_chunk`` (its messages). ``itemsize``: 0 when the dtype is not read."""
    if type(ch) is not Obj or ch.cls != _CHUNK:
        return None
    st = ch.state
    if type(st) is not dict or not st.keys() <= _CHUNK_FIELDS:
        return None
    offs, sizes = st.get("offsets"), st.get("sizes")
    if type(offs) is not tuple or type(sizes) is not tuple or len(offs) != len(shape) \
            or len(sizes) != len(shape):
        return None
    for o, n, d in zip(offs, sizes, shape):  # d <= MAX_BYTES: so are o and n
        if type(o) is not int or type(n) is not int or o < 0 or n < 0 or o + n > d:
            return None
    info = storage.get((key, offs))
    if info is None or math.prod(sizes) * itemsize > info.length:
        return None
    return Chunk(offs, sizes, info)


def _chunk_name(key: str, n: int) -> str:
    return f"tensor {key!r}, chunk {n}"


def _chunk(c: _Checker, what: Callable[[], str], ch: Any, key: str, shape: tuple[int, ...],
           name: str | None, storage: dict[tuple[str, Any], StorageInfo]) -> Chunk:
    """One ChunkStorageMetadata of tensor ``key``, inside the tensor, with its storage
    record, whose item can hold its values."""
    cf = c.fields(ch, "ChunkStorageMetadata", what)
    offs = c.dims(cf.get("offsets"), lambda: f"{what()}: offsets")
    sizes = c.dims(cf.get("sizes"), lambda: f"{what()}: sizes")
    if len(offs) != len(shape) or len(sizes) != len(shape) or any(
            o + s > d for o, s, d in zip(offs, sizes, shape)):
        raise c.bad(f"{what()}: box at {list(offs)} of sizes {list(sizes)} is not inside "
                    f"the tensor's shape {list(shape)}")
    info = storage.get((key, offs))
    if info is None:
        raise c.bad(f"{what()} at {list(offs)} has no storage record")
    if name is not None and math.prod(sizes) * _itemsize(name) > info.length:
        # the item holds the values: checked before anything is allocated for them
        raise c.bad(f"{what()}: {list(sizes)} {name} values cannot fit in its item, "
                    f"{info.relative_path} bytes [{info.offset}, {info.offset + info.length})")
    return Chunk(offs, sizes, info)


def torch_itemsize(torch_dtype: str) -> int:
    """Bytes per element of a torch dtype (those numpy lacks included)."""
    name = TORCH_DTYPES.get(torch_dtype)
    return _itemsize(name) if name is not None else UNREAD_ITEMSIZE.get(torch_dtype, 1)


def _itemsize(name: str) -> int:
    """Bytes per element of a pyckpt dtype name (without numpy: ml_dtypes may be missing)."""
    if name in ("bool", "bfloat16") or name.startswith("float8"):
        return 2 if name == "bfloat16" else 1
    bits = int("".join(ch for ch in name if ch.isdigit()))
    return bits // 8


def _no_shared_bytes(c: _Checker, entries: list[TensorEntry | BytesEntry]) -> None:
    """Refuses two items (chunks, bytes entries) whose byte ranges in a file overlap:
    sorted by (file, offset), an overlap shows between neighbours."""
    items: list[tuple[str, int, int, int, int]] = []  # file, offset, length, entry, chunk
    for i, e in enumerate(entries):
        if isinstance(e, BytesEntry):
            items.append((e.storage.relative_path, e.storage.offset, e.storage.length, i, -1))
        else:
            items += [(ch.storage.relative_path, ch.storage.offset, ch.storage.length, i, n)
                      for n, ch in enumerate(e.chunks)]
    items = sorted(x for x in items if x[2] > 0)
    for a, b in zip(items, items[1:]):
        if a[0] == b[0] and b[1] < a[1] + a[2]:
            raise c.bad(f"{_item(entries, a)} and {_item(entries, b)} share bytes of file "
                        f"{a[0]!r}: [{a[1]}, {a[1] + a[2]}) and [{b[1]}, {b[1] + b[2]})")


def _item(entries: list[TensorEntry | BytesEntry], x: tuple) -> str:
    e = entries[x[3]]
    if isinstance(e, BytesEntry):
        return f"bytes entry {e.key!r}"
    return f"tensor {e.key!r} chunk at {list(e.chunks[x[4]].offsets)}"


def _storage_meta(c: _Checker, obj: Any) -> tuple[str | None, str | None]:
    """(save_id, checkpoint_id) of a StorageMeta (both informational)."""
    if obj is None:
        return None, None
    f = c.fields(obj, "StorageMeta", "storage_meta")
    save_id, ck = f.get("save_id"), f.get("checkpoint_id")
    return (save_id if isinstance(save_id, str) else None,
            ck if isinstance(ck, str) else None)


def decode_metadata(data: bytes, where: str) -> DcpMetadata:
    """The checked content of a ``.metadata`` file's bytes (``where``: its URL). The
    cyclic GC is paused meanwhile (json_scan.no_cyclic_gc): the records are millions
    of small containers in no cycle, and each collection walked all made so far."""
    with no_cyclic_gc():
        return _decode(data, where)


def _decode(data: bytes, where: str) -> DcpMetadata:
    top = restricted_load(data, METADATA_GLOBALS, where=f"DCP metadata {where}")
    c = _Checker(where)
    f = c.fields(top, "Metadata", "the pickled value")
    sdm = f.get("state_dict_metadata")
    if type(sdm) is not dict or not all(isinstance(k, str) for k in sdm):
        raise c.bad(f"state_dict_metadata is {_kind(sdm)}, not a dict of names")
    storage = _storage_index(c, f.get("storage_data"))
    entries: list[TensorEntry | BytesEntry] = []
    for key, md in sdm.items():
        if isinstance(md, Obj) and md.cls == _M + "BytesStorageMetadata":
            info = storage.get((key, None))
            if info is None:
                raise c.bad(f"bytes entry {key!r} has no storage record")
            entries.append(BytesEntry(key, info))
        else:
            entries.append(_tensor(c, key, md, storage))
    _no_shared_bytes(c, entries)
    version = f.get("version")
    save_id, ck = _storage_meta(c, f.get("storage_meta"))
    return DcpMetadata(tuple(entries), version if isinstance(version, str) else None,
                       save_id, ck)
