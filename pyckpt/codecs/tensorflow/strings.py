"""String tensors (DT_STRING) in a TensorBundle data file (docs/TF_FORMAT.md
section 5):

    [varint64 length of element 0] ... [varint64 length of element n-1]
    [4 bytes: masked CRC-32C of the lengths]
    [bytes of element 0] ... [bytes of element n-1]

The lengths' checksum covers each length as 4 little-endian bytes (8 when it
does not fit in 32 bits), not the varints. The entry's CRC-32C covers the same
length bytes, then the 4 checksum bytes, then the strings' bytes.
"""

from __future__ import annotations

import struct

import numpy as np

from ..._native import core as _core
from .wire import WireError, read_varint, varint

__all__ = ["decode_strings", "encode_strings"]


def _length_bytes(n: int) -> bytes:
    return struct.pack("<I", n) if n <= 0xFFFFFFFF else struct.pack("<Q", n)


def decode_strings(raw: bytes | memoryview, count: int) -> tuple[list[bytes], int]:
    """The ``count`` elements stored in ``raw`` (one entry's bytes) and the masked
    CRC-32C of the entry computed from them. Raises WireError when the lengths,
    their checksum or the total size do not add up."""
    raw = memoryview(raw)
    size = len(raw)
    if count > size:  # every element takes at least one varint byte
        raise WireError(f"{count} strings cannot fit in {size} bytes")
    lengths = []
    pos = 0
    for _ in range(count):
        n, pos = read_varint(raw, pos, size)
        lengths.append(n)
    if pos + 4 > size:
        raise WireError(f"the lengths' checksum at byte {pos} runs past the entry ({size} bytes)")
    length_blob = b"".join(_length_bytes(n) for n in lengths)
    crc = _core.crc32c(length_blob)
    stored = int.from_bytes(raw[pos:pos + 4], "little")
    if stored != _core.crc32c_mask(crc):
        raise WireError(f"checksum mismatch of the string lengths (stored 0x{stored:08x}, "
                        f"computed 0x{_core.crc32c_mask(crc):08x})")
    crc = _core.crc32c(raw[pos:pos + 4], crc)
    pos += 4
    if sum(lengths) != size - pos:
        raise WireError(f"the string lengths add up to {sum(lengths)} bytes, the entry "
                        f"holds {size - pos} after them")
    crc = _core.crc32c(raw[pos:], crc)
    out = []
    for n in lengths:
        out.append(bytes(raw[pos:pos + n]))
        pos += n
    return out, _core.crc32c_mask(crc)


def encode_strings(values: np.ndarray) -> tuple[bytes, int]:
    """The stored bytes of a string tensor (elements as bytes, or str encoded as
    UTF-8, in C order) and their masked CRC-32C."""
    items = [v.encode("utf-8") if isinstance(v, str) else bytes(v) for v in values.reshape(-1)]
    lengths = b"".join(varint(len(v)) for v in items)
    crc = _core.crc32c(b"".join(_length_bytes(len(v)) for v in items))
    check = struct.pack("<I", _core.crc32c_mask(crc))
    body = b"".join(items)
    crc = _core.crc32c(body, _core.crc32c(check, crc))
    return lengths + check + body, _core.crc32c_mask(crc)


def check_variants(raw: bytes | memoryview, count: int) -> int:
    """Checks the stored form of a variant tensor (DT_VARIANT, e.g. a dataset
    iterator's state; pyckpt does not decode it):

        [varint64 length][serialized element][4 bytes: masked CRC-32C so far] x count

    where the running CRC-32C covers each length as 8 little-endian bytes, the
    element's bytes and the previous checksums. Returns the entry's masked CRC-32C;
    raises WireError when the layout or an element's checksum is wrong."""
    raw = memoryview(raw)
    size = len(raw)
    if count > size:
        raise WireError(f"{count} variant elements cannot fit in {size} bytes")
    pos = crc = 0
    for k in range(count):
        n, pos = read_varint(raw, pos, size)
        if n > size - pos - 4:
            raise WireError(f"variant element {k} of {n} bytes runs past the entry")
        crc = _core.crc32c(struct.pack("<Q", n), crc)
        crc = _core.crc32c(raw[pos:pos + n], crc)
        pos += n
        stored = int.from_bytes(raw[pos:pos + 4], "little")
        if stored != _core.crc32c_mask(crc):
            raise WireError(f"checksum mismatch of variant element {k}")
        crc = _core.crc32c(raw[pos:pos + 4], crc)
        pos += 4
    if pos != size:
        raise WireError(f"{size - pos} bytes follow the last variant element")
    return _core.crc32c_mask(crc)
