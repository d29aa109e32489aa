"""The torch.save archive reader on hand-built archives: ZIP64 fields as large items
carry them, big-endian storages, and entries torch.save never writes."""

import pickle
import struct
import zlib

import numpy as np
import pytest

from pyckpt.codecs.distcp.archive import (Item, Place, StoredTensor, decode_tensor, read_directory,
                                       read_member, tensor_view)
from pyckpt.errors import CorruptCheckpointError

_PKL = (b"\x80\x02ctorch._utils\n_rebuild_tensor_v2\n((X\x07\x00\x00\x00storagectorch\nFloatStorage\n"
        b"X\x01\x00\x00\x000X\x03\x00\x00\x00cpuK\x04tQK\x00K\x02K\x02\x86K\x02K\x01\x86\x89"
        b"ccollections\nOrderedDict\n)RtR.")


def build_zip(entries: dict[str, bytes], zip64: bool = False, method: int = 0) -> bytes:
    """A stored (uncompressed) zip of ``entries``, as torch.save lays it out (local
    headers with data descriptors, sizes in the central directory); ``zip64``: the
    central entries give sizes and offsets in ZIP64 extra fields, as for large items."""
    out, central = b"", b""
    for name, data in entries.items():
        n = name.encode()
        header = len(out)
        out += struct.pack("<4sHHHHHIIIHH", b"PK\x03\x04", 45, 8, method, 0, 0, 0, 0, 0, len(n), 0)
        out += n + data + struct.pack("<4sIII", b"PK\x07\x08", zlib.crc32(data), len(data), len(data))
        if zip64:
            extra = struct.pack("<HHQQQ", 1, 24, len(data), len(data), header)
            sizes = (0xFFFFFFFF, 0xFFFFFFFF, 0xFFFFFFFF)
        else:
            extra, sizes = b"", (len(data), len(data), header)
        central += struct.pack("<4sHHHHHHIIIHHHHHII", b"PK\x01\x02", 45, 45, 8, method, 0, 0,
                               zlib.crc32(data), sizes[0], sizes[1], len(n), len(extra), 0, 0, 0,
                               0, sizes[2]) + n + extra
    count = len(entries)
    return out + central + struct.pack("<4sHHHHIIH", b"PK\x05\x06", 0, 0, count, count,
                                       len(central), len(out), 0)


def _item(data: bytes) -> Item:
    return Item(Place("tensor", "w", "file.distcp", 100, len(data)), lambda b, e: data[b:e], [])


def _values() -> bytes:
    return np.array([1, 2, 3, 4], dtype="<f4").tobytes()


@pytest.mark.parametrize("zip64", [False, True])
def test_hand_built_archive(zip64):
    data = build_zip({"archive/data.pkl": _PKL, "archive/byteorder": b"little",
                      "archive/data/0": _values()}, zip64=zip64)
    item = _item(data)
    t = decode_tensor(item, "float32")
    assert t.shape == (2, 2) and t.stride == (2, 1)
    got = tensor_view(t, read_member(item, t.storage))
    assert got.tolist() == [[1.0, 2.0], [3.0, 4.0]]


def test_big_endian_storage_is_swapped():
    be = np.array([1, 2, 3, 4], dtype=">f4").tobytes()
    data = build_zip({"archive/data.pkl": _PKL, "archive/byteorder": b"big", "archive/data/0": be})
    item = _item(data)
    t = decode_tensor(item, "float32")
    assert t.big_endian
    got = tensor_view(t, read_member(item, t.storage))
    assert got.dtype == np.dtype("<f4") and got.tolist() == [[1.0, 2.0], [3.0, 4.0]]
    c = np.array([1 + 2j, -3j], dtype=">c8")
    view = tensor_view(StoredTensor(np.dtype("<c8"), (2,), (1,), 0, t.storage, 2, True), c.tobytes())
    assert view.tolist() == [1 + 2j, -3j]


@pytest.mark.parametrize("entries, match", [
    ({"archive/data.pkl": _PKL, "archive/data/0": _values()[:8]}, r"storage archive/data/0 of 16 bytes"),
    ({"archive/data.pkl": _PKL}, r"archive/data/0 of 16 bytes is missing"),
    ({"archive/data.pkl": _PKL, "archive/byteorder": b"middle", "archive/data/0": _values()},
     r"byteorder entry says b'middle'"),
    ({"a/data.pkl": _PKL, "b/data.pkl": _PKL}, r"2 data.pkl entries"),
    ({"archive/data.pkl": pickle.dumps([1, 2], protocol=2), "archive/data/0": _values()},
     r"does not hold a plain tensor"),
    ({"archive/data.pkl": _PKL.replace(b"K\x00K\x02K\x02", b"K\x03K\x02K\x02"),
      "archive/data/0": _values()}, r"reaches past its storage of 4 elements"),
])
def test_archives_torch_never_writes(entries, match):
    with pytest.raises(CorruptCheckpointError, match=match) as e:
        decode_tensor(_item(build_zip(entries)), "float32")
    assert "'w'" in str(e.value) and "file.distcp" in str(e.value)


def test_compressed_entries_are_refused():
    data = build_zip({"archive/data.pkl": _PKL}, method=8)
    with pytest.raises(CorruptCheckpointError, match=r"encrypted or compressed \(method 8\)"):
        read_directory(_item(data))


def test_checksum_mismatch_names_the_absolute_range():
    data = bytearray(build_zip({"archive/data.pkl": _PKL, "archive/data/0": _values()}))
    start = data.index(b"archive/data/0") + len("archive/data/0")
    data[start] ^= 1
    item = _item(bytes(data))
    t = decode_tensor(item, "float32")
    with pytest.raises(CorruptCheckpointError, match=rf"bytes \[{100 + start}, {100 + start + 16}\)"):
        read_member(item, t.storage)
