"""A pure-Python reader of the format in docs/FORMAT.md, sharing no code with
the real reader (not even CRC32C). Tests use it to check that the writer
produces what the spec says; it is also handy for debugging. Slow: for small
checkpoints only. Handles local directories of whole (unsharded) tensors and
sharded arrays.
"""

from __future__ import annotations

import json
import os
import struct

import numpy as np

_POLY = 0x82F63B78
_TABLE = []
for _i in range(256):
    _c = _i
    for _ in range(8):
        _c = (_c >> 1) ^ (_POLY if _c & 1 else 0)
    _TABLE.append(_c)


def crc32c(data: bytes, crc: int = 0) -> int:
    """CRC32C (Castagnoli) of ``data``, continuing from ``crc`` (0 to start)."""
    crc ^= 0xFFFFFFFF
    for b in data:
        crc = (crc >> 8) ^ _TABLE[(crc ^ b) & 0xFF]
    return crc ^ 0xFFFFFFFF


def mask(crc: int) -> int:
    """The masked form of a CRC that the format stores (docs/FORMAT.md): rotated right
    by 15 bits, plus 0xA282EAD8."""
    return (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF


def read_manifest(directory: str) -> dict:
    """The parsed manifest of the index file in ``directory``; AssertionError on a bad
    magic, header or manifest checksum, or end marker."""
    with open(os.path.join(directory, "pyckpt.index"), "rb") as f:
        data = f.read()
    magic, version, flags, length, body_crc, head_crc = struct.unpack_from("<8sIIQII", data, 0)
    assert magic == b"PYCKPTIX", "bad magic"
    assert version in (1, 2), f"unknown format version {version}"
    assert mask(crc32c(data[:28])) == head_crc, "bad header crc"
    body = data[32:32 + length]
    assert mask(crc32c(body)) == body_crc, "bad manifest crc"
    assert data[32 + length:] == b"PYCKEND\n", "bad end marker"
    return json.loads(body)


def _dtype(name: str) -> np.dtype:
    if name[0] in "SUMm":
        return np.dtype(("<" if name[0] != "S" else "") + name)
    try:
        return np.dtype(name).newbyteorder("<")
    except TypeError:
        import ml_dtypes

        return np.dtype(getattr(ml_dtypes, name))


def read_all(directory: str) -> dict[str, np.ndarray]:
    """Every tensor of the checkpoint, assembled, with every chunk checksum checked."""
    doc = read_manifest(directory)
    chunk = doc["chunk_size"]
    t, b, crcs = doc["tensors"], doc["blocks"], doc["crc32c"]
    nblocks = t.get("nblocks", [1] * len(t["key"]))
    boxes = b.get("box") or [None] * len(b["file"])
    out = {}
    j = 0  # block index
    c = 0  # crc index
    for key, dname, shape, nb in zip(t["key"], t["dtype"], t["shape"], nblocks):
        dtype = _dtype(dname)
        full = np.zeros(shape, dtype=dtype)
        for _ in range(nb):
            nbytes = b["nbytes"][j]
            raw = b""
            if nbytes:
                entry = doc["files"][b["file"][j]]
                # a reference (format version 2): the file lies in the sibling directory "at"
                where = (directory if "at" not in entry else
                         os.path.join(os.path.dirname(os.path.normpath(directory)), entry["at"]))
                with open(os.path.join(where, entry["name"]), "rb") as f:
                    f.seek(b["offset"][j])
                    raw = f.read(nbytes)
            assert len(raw) == nbytes, f"{key}: short read"
            for i in range(-(-nbytes // chunk)):
                got = mask(crc32c(raw[i * chunk:(i + 1) * chunk]))
                assert got == crcs[c], f"{key}: chunk {i} checksum mismatch"
                c += 1
            if boxes[j] is not None:
                offsets, bshape = boxes[j]
                block = np.frombuffer(raw, dtype=dtype).reshape(bshape)
                full[tuple(slice(o, o + s) for o, s in zip(offsets, bshape))] = block
            else:
                full = np.frombuffer(raw, dtype=dtype).reshape(shape).copy()
            j += 1
        out[key] = full
    assert c == len(crcs), "unused checksums"
    return out
