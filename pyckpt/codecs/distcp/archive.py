"""One DCP tensor item: a ``torch.save`` zip archive at some byte range of a
``.distcp`` file, read without torch or ``zipfile``.

``torch.save`` writes an uncompressed zip (PKWARE APPNOTE 4.3-4.5): entries
``<prefix>/data.pkl`` (the pickle: ``torch._utils._rebuild_tensor_v2`` or
``_v3`` of a persistent storage reference), ``<prefix>/data/<key>`` (the
storage's raw bytes, 64-byte aligned), ``<prefix>/byteorder`` and a few version
files, then the central directory (ZIP64 records for large items) and the
end-of-central-directory record. Local headers carry no sizes (bit 3: a data
descriptor follows), so sizes and CRC-32s come from the central directory.

Only the central directory, the local headers of the entries needed, the
pickle and the storage's bytes are read (``Item.get`` reads what is not
cached). Every entry read has its CRC-32 checked.
"""

from __future__ import annotations

import math
import struct
import zlib
from typing import Any, Callable, NamedTuple

import numpy as np

from ..._dtypes import stored_dtype
from ...errors import CorruptCheckpointError, UnsupportedDCPError
from .allowed import ARCHIVE_GLOBALS, STORAGE_DTYPES, TORCH_DTYPES, UNTYPED_STORAGE, Rebuild
from .unpickler import Global, restricted_load

__all__ = ["Item", "Member", "Place", "StoredTensor", "UnsupportedDCPError", "read_directory",
           "member_range", "read_member", "decode_tensor", "tensor_view", "MAX_PICKLE"]

MAX_PICKLE = 1 << 20    # a tensor's data.pkl is ~200 bytes
MAX_MEMBERS = 4096
MAX_DIRECTORY = 4 << 20  # bytes of zip directory (torch.save's: well under 1 KiB)
_EOCD = struct.Struct("<4sHHHHIIH")
_LOC64 = struct.Struct("<4sIQI")
_EOCD64 = struct.Struct("<4sQHHIIQQQQ")
_CENTRAL = struct.Struct("<4sHHHHHHIIIHHHHHII")
_LOCAL = struct.Struct("<4sHHHHHIIIHH")
_FULL = 0xFFFFFFFF


class Place(NamedTuple):
    """Where an item is, for messages: its key, file URL and byte range."""

    what: str        # "tensor" or "bytes entry"
    key: str
    url: str
    offset: int
    length: int

    def bad(self, what: str, b: int | None = None, e: int | None = None) -> CorruptCheckpointError:
        lo = self.offset + (0 if b is None else b)
        hi = self.offset + (self.length if e is None else e)
        return CorruptCheckpointError(f"{self.what} {self.key!r}, file '{self.url}', bytes "
                                      f"[{lo}, {hi}): {what}")


class Item:
    """The bytes of one item as far as they were read: cached segments (item-relative
    ``(start, bytes)``) plus ``fetch(b, e)``, which reads more."""

    def __init__(self, place: Place, fetch: Callable[[int, int], Any],
                 segments: list[tuple[int, Any]] | None = None) -> None:
        self.place, self.fetch = place, fetch
        self.segments = list(segments or [])
        self.directory: dict[str, Member] | None = None

    def cached(self, b: int, e: int) -> bool:
        """Whether bytes [b, e) are in hand."""
        return any(start <= b and e <= start + len(buf) for start, buf in self.segments)

    def get(self, b: int, e: int) -> memoryview:
        """Item bytes [b, e) (CorruptCheckpointError outside the item, or short)."""
        if not 0 <= b <= e <= self.place.length:
            raise self.place.bad(f"the archive points at bytes [{b}, {e}) of an item of "
                                 f"{self.place.length}")
        for start, buf in self.segments:
            if start <= b and e <= start + len(buf):
                return memoryview(buf)[b - start:e - start]
        data = self.fetch(b, e)
        if len(data) != e - b:
            raise self.place.bad(f"only {len(data)} of {e - b} bytes could be read "
                                 "(truncated file?)", b, e)
        return memoryview(data)


class Member(NamedTuple):
    """A zip entry: its name, local header offset, size and CRC-32 (item-relative)."""

    name: str
    header: int
    size: int
    crc: int


def _eocd(item: Item) -> tuple[int, int, int]:
    """(entries, central directory offset, its size) from the end records."""
    n = item.place.length
    tail_len = min(n, _EOCD.size + 0xFFFF)
    tail = bytes(item.get(n - tail_len, n))
    p = tail.rfind(b"PK\x05\x06")
    while p >= 0 and (p + _EOCD.size > tail_len or  # the record ends the item, with its comment
                      p + _EOCD.size + struct.unpack_from("<H", tail, p + 20)[0] != tail_len):
        p = tail.rfind(b"PK\x05\x06", 0, p)
    if p < 0:
        raise item.place.bad("not a torch.save archive (no zip end record at the end of the "
                             "item: a wrong length in the metadata, or a damaged file)")
    _, disk, cd_disk, n_disk, count, cd_size, cd_off, _ = _EOCD.unpack_from(tail, p)
    end = n - tail_len + p
    if _FULL in (cd_size, cd_off) or count == 0xFFFF:
        if end < _LOC64.size:
            raise item.place.bad("ZIP64 end record missing")
        sig, disk, off64, _ = _LOC64.unpack(item.get(end - _LOC64.size, end))
        if sig != b"PK\x06\x07" or off64 + _EOCD64.size > end - _LOC64.size:
            raise item.place.bad("bad ZIP64 end record locator")
        (sig, _, _, _, disk, cd_disk, n_disk, count, cd_size,
         cd_off) = _EOCD64.unpack(item.get(off64, off64 + _EOCD64.size))
        if sig != b"PK\x06\x06":
            raise item.place.bad("bad ZIP64 end record")
        end = off64
    if disk or cd_disk or n_disk != count or count > MAX_MEMBERS or cd_size > MAX_DIRECTORY \
            or count * _CENTRAL.size > cd_size or cd_off + cd_size > end:
        raise item.place.bad(f"impossible zip directory ({count} entries, {cd_size} bytes at "
                             f"{cd_off})")
    return count, cd_off, cd_size


def _zip64_fields(extra: bytes, wanted: list[int]) -> list[int]:
    """The ZIP64 extended information (extra field 1) values replacing the given
    32-bit fields that read 0xFFFFFFFF (in the field order of APPNOTE 4.5.3)."""
    pos = 0
    while pos + 4 <= len(extra):
        hid, size = struct.unpack_from("<HH", extra, pos)
        if hid == 1:
            values = list(struct.unpack_from(f"<{size // 8}Q", extra, pos + 4))
            it = iter(values)
            return [next(it) if w == _FULL else w for w in wanted]
        pos += 4 + size
    raise ValueError("a 0xFFFFFFFF size without a ZIP64 field")


def read_directory(item: Item) -> dict[str, Member]:
    """The archive's entries by name (cached on the item)."""
    if item.directory is not None:
        return item.directory
    count, cd_off, cd_size = _eocd(item)
    cd = bytes(item.get(cd_off, cd_off + cd_size))
    out: dict[str, Member] = {}
    pos = 0
    for _ in range(count):
        if pos + _CENTRAL.size > len(cd):
            raise item.place.bad("zip directory cut short", cd_off, cd_off + cd_size)
        (sig, _, _, flags, method, _, _, crc, csize, usize, nlen, elen, clen, _, _, _,
         header) = _CENTRAL.unpack_from(cd, pos)
        name_b = cd[pos + 46:pos + 46 + nlen]
        extra = cd[pos + 46 + nlen:pos + 46 + nlen + elen]
        pos += 46 + nlen + elen + clen
        name = name_b.decode("utf-8", "replace")
        try:
            if sig != b"PK\x01\x02" or pos > len(cd):
                raise ValueError("bad directory entry")
            usize, csize, header = _zip64_fields(extra, [usize, csize, header]) \
                if _FULL in (usize, csize, header) else (usize, csize, header)
        except (ValueError, struct.error, StopIteration) as e:
            raise item.place.bad(f"zip directory entry {name[:200]!r}: {e}", cd_off,
                                 cd_off + cd_size) from None
        if flags & 1 or method != 0 or csize != usize:
            raise item.place.bad(f"zip entry {name[:200]!r} is encrypted or compressed (method "
                                 f"{method}): torch.save writes neither")
        if name in out or header + _LOCAL.size + usize > cd_off:
            raise item.place.bad(f"zip entry {name[:200]!r} is repeated or overlaps the directory")
        out[name] = Member(name, header, usize, crc)
    item.directory = out
    return out


def member_range(item: Item, m: Member) -> tuple[int, int]:
    """Item bytes [start, end) of entry ``m``'s data (its local header checked)."""
    sig, _, _, _, _, _, _, _, _, nlen, elen = _LOCAL.unpack(item.get(m.header, m.header + 30))
    name = bytes(item.get(m.header + 30, m.header + 30 + nlen))
    start = m.header + 30 + nlen + elen
    if sig != b"PK\x03\x04" or name.decode("utf-8", "replace") != m.name:
        raise item.place.bad(f"zip entry {m.name[:200]!r}: bad local header", m.header,
                             m.header + 30)
    return start, start + m.size


def read_member(item: Item, m: Member) -> memoryview:
    """The bytes of entry ``m``, its CRC-32 checked."""
    start, end = member_range(item, m)
    data = item.get(start, end)
    crc = zlib.crc32(data)
    if crc != m.crc:
        raise item.place.bad(f"checksum mismatch in zip entry {m.name[:200]!r} (stored 0x{m.crc:08x}, "
                             f"computed 0x{crc:08x})", start, start + m.size)
    return data


class StoredTensor(NamedTuple):
    """What data.pkl says: a view of ``shape``/``stride`` (elements) at ``offset`` of the
    storage entry ``storage`` holding ``elements`` elements of ``dtype``."""

    dtype: np.dtype
    shape: tuple[int, ...]
    stride: tuple[int, ...]
    offset: int
    storage: Member
    elements: int
    big_endian: bool


class _StorageRef(NamedTuple):
    cls: Global
    key: str
    numel: int


def _persistent(pid: Any) -> _StorageRef:
    if type(pid) is not tuple or len(pid) != 5 or pid[0] != "storage" \
            or not isinstance(pid[1], Global) or pid[1].kind != "storage" \
            or not isinstance(pid[2], str) or not pid[2].isdigit() or len(pid[2]) > 20 \
            or type(pid[4]) is not int or not 0 <= pid[4] < 1 << 62:
        raise ValueError("not a storage reference ('storage', class, key, location, size)")
    return _StorageRef(pid[1], pid[2], pid[4])


def _dims(v: Any, what: str) -> tuple[int, ...]:
    if type(v) is not tuple or len(v) > 64 or not all(type(d) is int and 0 <= d < 1 << 62
                                                     for d in v):
        raise ValueError(f"{what} is not a tuple of at most 64 non-negative ints")
    return v


def _rebuild_args(r: Any) -> tuple[_StorageRef, int, tuple, tuple, str]:
    """(storage, offset, size, stride, torch dtype name) of a tensor rebuild call."""
    if not isinstance(r, Rebuild):
        raise ValueError("the pickle does not hold a plain tensor")
    v3 = r.fn == "_rebuild_tensor_v3"
    a = r.args
    if len(a) not in ((7, 8) if v3 else (6, 7)):
        raise ValueError(f"{r.fn} with {len(a)} arguments")
    storage, offset = a[0], a[1]
    if not isinstance(storage, _StorageRef) or type(offset) is not int or not 0 <= offset < 1 << 62:
        raise ValueError("no storage reference or a bad storage offset")
    size, stride = _dims(a[2], "size"), _dims(a[3], "stride")
    if len(size) != len(stride) or type(a[4]) is not bool or type(a[5]) is not dict or a[5]:
        raise ValueError("size and stride differ in length, or hooks are attached")
    typed = STORAGE_DTYPES.get(storage.cls.name)
    dtype = a[6] if v3 else None
    if v3 and (not isinstance(dtype, Global) or dtype.kind != "dtype"):
        raise ValueError("_rebuild_tensor_v3 without a dtype")
    name = dtype.name if isinstance(dtype, Global) else typed
    if name is None or (typed is not None and name != typed):
        raise ValueError(f"storage class {storage.cls.qualname} does not give dtype {name}")
    return storage, offset, size, stride, name


def decode_tensor(item: Item, expect_dtype: str) -> StoredTensor:
    """The tensor the archive holds (its data.pkl read and checked), without its data."""
    members = read_directory(item)
    pkls = [n for n in members if n == "data.pkl" or n.endswith("/data.pkl")]
    if len(pkls) != 1:
        raise item.place.bad(f"{len(pkls)} data.pkl entries in the archive (want one)")
    prefix = pkls[0][:-len("data.pkl")]
    m = members[pkls[0]]
    if m.size > MAX_PICKLE:
        raise item.place.bad(f"{m.name} of {m.size} bytes is too large for one tensor")
    where = f"{item.place.what} {item.place.key!r}, file '{item.place.url}', item bytes " \
            f"[{item.place.offset}, {item.place.offset + item.place.length}), {m.name}"
    value = restricted_load(bytes(read_member(item, m)), ARCHIVE_GLOBALS, where=where,
                            persistent=_persistent)
    try:
        storage, offset, size, stride, name = _rebuild_args(value)
    except ValueError as e:
        raise item.place.bad(f"{m.name}: {e}") from None
    if name != expect_dtype:
        raise item.place.bad(f"the archive holds a {name} tensor, the metadata says {expect_dtype}")
    dtype = _numpy_dtype(name, item.place)
    nbytes = storage.numel if storage.cls.name == UNTYPED_STORAGE else storage.numel * dtype.itemsize
    data = members.get(f"{prefix}data/{storage.key}")
    if data is None or data.size != nbytes or nbytes % dtype.itemsize:
        raise item.place.bad(f"storage {prefix}data/{storage.key} of {nbytes} bytes is "
                             + ("missing" if data is None else f"{data.size} bytes in the archive"))
    count = nbytes // dtype.itemsize
    if math.prod(size) and offset + sum((n - 1) * s for n, s in zip(size, stride)) >= count:
        raise item.place.bad(f"a tensor of size {list(size)}, stride {list(stride)} at offset "
                             f"{offset} reaches past its storage of {count} elements")
    order = members.get(f"{prefix}byteorder")
    big = False
    if order is not None:
        text = bytes(read_member(item, order))
        if text not in (b"little", b"big"):
            raise item.place.bad(f"byteorder entry says {text[:20]!r}")
        big = text == b"big"
    return StoredTensor(dtype, size, stride, offset, data, count, big)


def _numpy_dtype(name: str, place: Place) -> np.dtype:
    pyckpt_name = TORCH_DTYPES.get(name)
    try:
        if pyckpt_name is None:
            raise ValueError("numpy has no such dtype")
        return stored_dtype(pyckpt_name)  # bfloat16 without ml_dtypes: bytes only
    except ValueError as e:
        raise UnsupportedDCPError(f"tensor {place.key!r} of {place.url}: torch.{name} "
                                  f"cannot be read ({e})") from None


def tensor_view(t: StoredTensor, data: Any) -> np.ndarray:
    """The tensor as a (read-only, strided) little-endian array over the storage's
    bytes ``data`` (copied if byte-swapped)."""
    dtype = t.dtype
    flat = np.frombuffer(data, dtype=np.uint8, count=t.elements * dtype.itemsize)
    if t.big_endian and dtype.itemsize > 1:  # complex numbers: each half swapped
        unit = dtype.itemsize // 2 if dtype.kind == "c" else dtype.itemsize
        flat = flat.view(f">u{unit}").astype(f"<u{unit}").view(np.uint8)
    if not math.prod(t.shape):
        return np.zeros(t.shape, dtype=dtype)
    item = dtype.itemsize
    # strided as raw items (as_strided cannot build ml_dtypes arrays), then viewed
    elems = flat.view(np.dtype((np.void, item)))
    view = np.lib.stride_tricks.as_strided(elems[t.offset:], shape=t.shape,
                                           strides=[s * item for s in t.stride], writeable=False)
    return view.view(dtype)
