"""The protobuf wire format, as much of it as TensorFlow checkpoints use
(docs/TF_FORMAT.md section 4): varints, fixed32/64 and length-delimited fields.

Decoding never trusts a length: every field is checked against the end of its
message before it is sliced, so a hostile buffer costs at most one pass over
its own bytes. Errors raise ``WireError`` (a ValueError) with the byte offset;
callers add the file and key.
"""

from __future__ import annotations

import struct
from typing import Iterator

from ...errors import WireError

__all__ = ["VARINT", "FIXED64", "LEN", "FIXED32", "WireError", "read_varint", "read_field", "fields",
           "signed64", "signed32", "varint", "field_varint", "field_bytes", "field_fixed32",
           "field_double"]

# wire types
VARINT, FIXED64, LEN, FIXED32 = 0, 1, 2, 5

_U64 = 1 << 64


def read_varint(buf: bytes | memoryview, pos: int, end: int) -> tuple[int, int]:
    """The unsigned varint at ``buf[pos:]`` (at most 10 bytes, not past ``end``) and
    the position after it."""
    if pos < end:
        b = buf[pos]
        if b < 0x80:  # the common one-byte case
            return b, pos + 1
    result = shift = 0
    limit = end if end < pos + 10 else pos + 10
    while pos < limit:
        b = buf[pos]
        pos += 1
        result |= (b & 0x7F) << shift
        if b < 0x80:
            if result >= _U64:
                raise WireError(f"varint at byte {pos - 1} exceeds 64 bits")
            return result, pos
        shift += 7
    raise WireError(f"truncated or overlong varint before byte {pos}")


def read_field(buf: bytes | memoryview, pos: int, end: int,
               what: str = "") -> tuple[int, int, int, int]:
    """The field at ``buf[pos:]`` (not past ``end``, ``pos < end``): ``(field number,
    wire type, value, position after it)``. ``value`` is an int for varint and fixed
    fields; for a length-delimited field, the offset of its first byte (its bytes
    are ``buf[value:after]``). Groups (wire types 3, 4) are refused. ``what`` (the
    message being decoded) prefixes the errors."""
    tag = buf[pos]
    if tag < 0x80:
        pos += 1
    else:
        tag, pos = read_varint(buf, pos, end)
    number, wtype = tag >> 3, tag & 7
    if number == 0:
        raise WireError(f"{_prefix(what)}field number 0 at byte {pos}")
    if wtype == VARINT:
        value, pos = read_varint(buf, pos, end)
        return number, wtype, value, pos
    if wtype == LEN:
        n = buf[pos] if pos < end else 0x80
        if n < 0x80:
            pos += 1
        else:
            n, pos = read_varint(buf, pos, end)
        if n > end - pos:
            raise WireError(f"{_prefix(what)}field {number}: {n} bytes at byte {pos} run past "
                            f"the message end ({end})")
        return number, wtype, pos, pos + n
    if wtype in (FIXED32, FIXED64):
        size = 4 if wtype == FIXED32 else 8
        if pos + size > end:
            raise WireError(f"{_prefix(what)}field {number}: truncated fixed{size * 8} at "
                            f"byte {pos}")
        return number, wtype, int.from_bytes(buf[pos:pos + size], "little"), pos + size
    raise WireError(f"{_prefix(what)}field {number}: unsupported wire type {wtype} at byte {pos}")


def _prefix(what: str) -> str:
    return f"{what}: " if what else ""


def fields(buf: bytes | memoryview, start: int = 0,
           end: int | None = None) -> Iterator[tuple[int, int, int | tuple[int, int]]]:
    """``(field number, wire type, value)`` of each field of the message
    ``buf[start:end]``: an int for varint and fixed fields, ``(begin, end)`` offsets
    into ``buf`` for length-delimited ones (``read_field``)."""
    if end is None:
        end = len(buf)
    pos = start
    while pos < end:
        number, wtype, value, after = read_field(buf, pos, end)
        yield number, wtype, (value, after) if wtype == LEN else value
        pos = after


def signed64(v: int) -> int:
    """An int64 field's value (two's complement of the 64-bit varint)."""
    return v - _U64 if v >= 1 << 63 else v


def signed32(v: int) -> int:
    """An int32 field's value (negative int32s are sign-extended to 64 bits)."""
    v = signed64(v)
    if not -(1 << 31) <= v < 1 << 31:
        raise WireError(f"int32 field holds {v}")
    return v


# -- encoding -------------------------------------------------------------------------

def varint(n: int) -> bytes:
    """The varint of n (negative values as 64-bit two's complement, protobuf's rule)."""
    if n < 0:
        n += _U64
    out = bytearray()
    while n >= 0x80:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def field_varint(number: int, value: int) -> bytes:
    """A varint field; proto3 leaves zero values out."""
    return varint(number << 3 | VARINT) + varint(value) if value else b""


def field_bytes(number: int, value: bytes) -> bytes:
    """A length-delimited field (string, bytes or embedded message), always written."""
    return varint(number << 3 | LEN) + varint(len(value)) + value


def field_fixed32(number: int, value: int) -> bytes:
    """A fixed32 field; proto3 leaves zero values out."""
    return varint(number << 3 | FIXED32) + struct.pack("<I", value) if value else b""


def field_double(number: int, value: float) -> bytes:
    """A double field (always written)."""
    return varint(number << 3 | FIXED64) + struct.pack("<d", value)
