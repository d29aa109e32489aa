"""The protobuf messages of TensorFlow checkpoints, decoded and encoded with the
wire codec (``wire.py``); field numbers in docs/TF_FORMAT.md section 4.

- ``BundleHeaderProto`` (the value under the empty key of the index);
- ``BundleEntryProto`` (every other key);
- ``TrackableObjectGraph`` (the string tensor ``_CHECKPOINTABLE_OBJECT_GRAPH``).

Decoders return plain tuples and lists and raise ``WireError``; unknown fields
are skipped (protobuf's rule), so later TensorFlow additions stay readable.
"""

from __future__ import annotations

from typing import NamedTuple

from .wire import (FIXED32, FIXED64, LEN, VARINT, WireError, field_bytes, field_fixed32, field_varint,
                   fields, read_varint, signed32, signed64)

__all__ = ["Header", "Entry", "ObjectNode", "decode_header", "decode_entry", "encode_header",
           "encode_entry", "decode_object_graph", "encode_object_graph", "MAX_DIMS"]

MAX_DIMS = 64        # dimensions per tensor (pyckpt's limit; TensorFlow's is 254)
BUNDLE_VERSION = 1   # the TensorBundle version this module reads and writes


class Header(NamedTuple):
    num_shards: int
    big_endian: bool
    producer: int
    min_consumer: int
    bad_consumers: tuple[int, ...]


class Entry(NamedTuple):
    dtype: int                 # TensorFlow DataType enum value
    shape: tuple[int, ...]
    shard: int
    offset: int
    size: int
    crc32c: int                # masked CRC-32C of the stored bytes
    slices: int                # number of TensorSliceProto (partitioned variables)


class ObjectNode(NamedTuple):
    children: list[tuple[int, str]]          # (node id, local name)
    attributes: list[tuple[str, str, str]]   # (name, full name, checkpoint key)
    slots: list[tuple[int, str, int]]        # (original variable node, slot name, slot node)


def _kind(number: int, wtype: int, want: int, what: str) -> None:
    if wtype != want:
        raise WireError(f"{what}: field {number} has wire type {wtype}, expected {want}")


def _text(buf: memoryview | bytes, span: tuple[int, int], what: str) -> str:
    try:
        return bytes(buf[span[0]:span[1]]).decode("utf-8")
    except UnicodeDecodeError:
        raise WireError(f"{what} is not UTF-8") from None


def decode_header(buf: memoryview | bytes) -> Header:
    """BundleHeaderProto: num_shards = 1, endianness = 2, version = 3 (VersionDef:
    producer = 1, min_consumer = 2, bad_consumers = 3)."""
    shards, big, producer, min_consumer, bad = 0, False, 0, 0, []
    for number, wtype, value in fields(buf):
        if number == 1:
            _kind(number, wtype, VARINT, "header")
            assert isinstance(value, int)
            shards = signed32(value)
        elif number == 2:
            _kind(number, wtype, VARINT, "header")
            if value not in (0, 1):
                raise WireError(f"header: unknown endianness {value}")
            big = value == 1
        elif number == 3:
            _kind(number, wtype, LEN, "header")
            assert isinstance(value, tuple)
            for n2, w2, v2 in fields(buf, *value):
                if n2 in (1, 2) and w2 == VARINT:
                    assert isinstance(v2, int)
                    if n2 == 1:
                        producer = signed32(v2)
                    else:
                        min_consumer = signed32(v2)
                elif n2 == 3 and w2 == VARINT:
                    assert isinstance(v2, int)
                    bad.append(signed32(v2))
                elif n2 == 3 and w2 == LEN:  # packed repeated
                    assert isinstance(v2, tuple)
                    p = v2[0]
                    while p < v2[1]:
                        x, p = read_varint(buf, p, v2[1])
                        bad.append(signed32(x))
    return Header(shards, big, producer, min_consumer, tuple(bad))


def encode_header(num_shards: int) -> bytes:
    """A little-endian header of version 1 (producer 1, as TensorFlow writes)."""
    return field_varint(1, num_shards) + field_bytes(3, field_varint(1, BUNDLE_VERSION))


def _shape(buf: memoryview | bytes, start: int, end: int) -> tuple[int, ...]:
    """TensorShapeProto: dim = 2 (Dim: size = 1, name = 2), unknown_rank = 3."""
    dims: list[int] = []
    pos = start
    while pos < end:
        # the common encoding of a dim, inline: 0x12 <len> 0x08 <size varint> (name absent)
        if buf[pos] == 0x12 and pos + 2 < end and buf[pos + 2] == 0x08:
            n = buf[pos + 1]
            if n < 0x80 and pos + 2 + n <= end:
                size, after = read_varint(buf, pos + 3, pos + 2 + n)
                if after == pos + 2 + n:
                    dims.append(signed64(size))
                    pos = after
                    if dims[-1] < 0:
                        raise WireError(f"dimension {len(dims) - 1} has size {dims[-1]}")
                    if len(dims) > MAX_DIMS:
                        raise WireError(f"shape has more than {MAX_DIMS} dimensions")
                    continue
        number, wtype, value, pos = _one_field(buf, pos, end)
        if number == 2:
            _kind(number, wtype, LEN, "shape")
            assert isinstance(value, tuple)
            size = 0
            for n2, w2, v2 in fields(buf, *value):
                if n2 == 1:
                    _kind(n2, w2, VARINT, "dim")
                    assert isinstance(v2, int)
                    size = signed64(v2)
            if size < 0:
                raise WireError(f"dimension {len(dims)} has size {size}")
            dims.append(size)
            if len(dims) > MAX_DIMS:
                raise WireError(f"shape has more than {MAX_DIMS} dimensions")
        elif number == 3 and wtype == VARINT and value:
            raise WireError("shape of unknown rank")
    return tuple(dims)


def _one_field(buf: memoryview | bytes, pos: int,
               end: int) -> tuple[int, int, int | tuple[int, int], int]:
    """The field at ``pos`` (as ``fields`` yields it) and the position after it."""
    for number, wtype, value in fields(buf, pos, end):
        if wtype == LEN:
            assert isinstance(value, tuple)
            return number, wtype, value, value[1]
        return number, wtype, value, _after(buf, pos, end)
    raise WireError(f"no field at byte {pos}")


def _after(buf: memoryview | bytes, pos: int, end: int) -> int:
    """The position after the (non length-delimited) field at ``pos``."""
    tag, pos = read_varint(buf, pos, end)
    wtype = tag & 7
    if wtype == VARINT:
        return read_varint(buf, pos, end)[1]
    return pos + (4 if wtype == FIXED32 else 8)


_ENTRY_TYPES = {1: VARINT, 2: LEN, 3: VARINT, 4: VARINT, 5: VARINT, 6: FIXED32, 7: LEN}


def decode_entry(buf: memoryview | bytes, start: int = 0, end: int | None = None) -> Entry:
    """BundleEntryProto (``buf[start:end]``): dtype = 1, shape = 2, shard_id = 3,
    offset = 4, size = 5, crc32c = 6 (fixed32), slices = 7 (repeated TensorSliceProto)."""
    if end is None:
        end = len(buf)
    dtype = shard = offset = size = crc = slices = 0
    shape: tuple[int, ...] = ()
    pos = start
    while pos < end:  # the fields, decoded inline: this runs once per tensor on open
        tag, pos = read_varint(buf, pos, end)
        number, wtype = tag >> 3, tag & 7
        want = _ENTRY_TYPES.get(number)
        if want is not None and want != wtype:
            raise WireError(f"entry: field {number} has wire type {wtype}, expected {want}")
        if wtype == VARINT:
            value, pos = read_varint(buf, pos, end)
            if number == 1:
                dtype = signed32(value)
            elif number == 3:
                shard = signed32(value)
            elif number == 4:
                offset = signed64(value)
            elif number == 5:
                size = signed64(value)
        elif wtype == LEN:
            n, pos = read_varint(buf, pos, end)
            if n > end - pos:
                raise WireError(f"field {number}: {n} bytes at byte {pos} run past the "
                                f"message end ({end})")
            if number == 2:
                shape = _shape(buf, pos, pos + n)
            elif number == 7:
                slices += 1
            pos += n
        elif wtype == FIXED32:
            if pos + 4 > end:
                raise WireError(f"field {number}: truncated fixed32 at byte {pos}")
            if number == 6:
                crc = int.from_bytes(buf[pos:pos + 4], "little")
            pos += 4
        elif wtype == FIXED64:
            if pos + 8 > end:
                raise WireError(f"field {number}: truncated fixed64 at byte {pos}")
            pos += 8
        else:
            raise WireError(f"field {number}: unsupported wire type {wtype} at byte {pos}")
        if number == 0:
            raise WireError(f"field number 0 at byte {pos}")
    if shard < 0 or offset < 0 or size < 0:
        raise WireError(f"negative shard ({shard}), offset ({offset}) or size ({size})")
    return Entry(dtype, shape, shard, offset, size, crc, slices)


def encode_entry(dtype: int, shape: tuple[int, ...], shard: int, offset: int, size: int,
                 crc32c: int) -> bytes:
    """A BundleEntryProto of a whole (unsliced) tensor."""
    dims = b"".join(field_bytes(2, field_varint(1, d)) for d in shape)
    return (field_varint(1, dtype) + field_bytes(2, dims) + field_varint(3, shard)
            + field_varint(4, offset) + field_varint(5, size) + field_fixed32(6, crc32c))


def _len_field(buf: memoryview | bytes, pos: int, end: int, what: str) -> tuple[int, int, int, int]:
    """(field number, wire type, begin, end) of the field at ``pos``; for fields that
    are not length-delimited, ``begin`` is the value (varint) and ``end`` the next field."""
    tag, pos = read_varint(buf, pos, end)
    number, wtype = tag >> 3, tag & 7
    if number == 0:
        raise WireError(f"{what}: field number 0 at byte {pos}")
    if wtype == LEN:
        n, pos = read_varint(buf, pos, end)
        if n > end - pos:
            raise WireError(f"{what}: field {number}: {n} bytes at byte {pos} run past the "
                            f"message end ({end})")
        return number, wtype, pos, pos + n
    if wtype == VARINT:
        value, after = read_varint(buf, pos, end)
        return number, wtype, value, after
    if wtype in (FIXED32, FIXED64):
        after = pos + (4 if wtype == FIXED32 else 8)
        if after > end:
            raise WireError(f"{what}: field {number}: truncated fixed field at byte {pos}")
        return number, wtype, 0, after
    raise WireError(f"{what}: field {number} has unsupported wire type {wtype}")


def decode_object_graph(buf: bytes) -> list[ObjectNode]:
    """TrackableObjectGraph: nodes = 1, each a TrackableObject: children = 1
    (ObjectReference: node_id = 1, local_name = 2), attributes = 2 (SerializedTensor:
    name = 1, full_name = 2, checkpoint_key = 3), slot_variables = 3
    (SlotVariableReference: original_variable_node_id = 1, slot_name = 2,
    slot_variable_node_id = 3). Other fields (registered savers, has_checkpoint_values)
    are skipped. (One pass with the common one-byte tags and lengths inline: graphs
    of 100,000 objects decode in about a second.)"""
    buf = bytes(buf)
    nodes = []
    end = len(buf)
    pos = 0
    while pos < end:
        number, wtype, b, pos = _len_field(buf, pos, end, "object graph")
        if number != 1:
            continue
        _kind(number, wtype, LEN, "object graph")
        children: list[tuple[int, str]] = []
        attributes: list[tuple[str, str, str]] = []
        slots: list[tuple[int, str, int]] = []
        p2, e2 = b, pos
        while p2 < e2:
            tag = buf[p2]
            n = buf[p2 + 1] if p2 + 1 < e2 else 0x80
            if tag in (0x0A, 0x12, 0x1A) and n < 0x80 and p2 + 2 + n <= e2:
                n2, b2, p2 = tag >> 3, p2 + 2, p2 + 2 + n
            else:
                n2, w2, b2, p2 = _len_field(buf, p2, e2, "object graph node")
                if n2 not in (1, 2, 3):
                    continue
                _kind(n2, w2, LEN, "object graph node")
            ints = [0, 0, 0, 0]
            texts = ["", "", "", ""]
            p3 = b2
            while p3 < p2:
                t3 = buf[p3]
                n3, w3 = t3 >> 3, t3 & 7
                if t3 >= 0x80 or n3 == 0:
                    n3, w3, v3, p3 = _len_field(buf, p3, p2, "object graph reference")
                    if n3 > 3:
                        continue
                    if w3 == VARINT:
                        ints[n3] = signed32(v3)
                    elif w3 == LEN:
                        texts[n3] = _text(buf, (v3, p3), "a name in the object graph")
                    continue
                p3 += 1
                if w3 == VARINT:
                    v, p3 = read_varint(buf, p3, p2)
                    if n3 <= 3:
                        ints[n3] = signed32(v)
                elif w3 == LEN:
                    ln, p3 = read_varint(buf, p3, p2)
                    if ln > p2 - p3:
                        raise WireError(f"object graph: a name of {ln} bytes runs past its "
                                        f"message at byte {p3}")
                    if n3 <= 3:
                        try:
                            texts[n3] = buf[p3:p3 + ln].decode("utf-8")
                        except UnicodeDecodeError:
                            raise WireError("a name in the object graph is not UTF-8") from None
                    p3 += ln
                elif w3 in (FIXED32, FIXED64):
                    p3 += 4 if w3 == FIXED32 else 8
                    if p3 > p2:
                        raise WireError("object graph: truncated fixed field")
                else:
                    raise WireError(f"object graph: field {n3} has wire type {w3}")
            if n2 == 1:
                children.append((ints[1], texts[2]))
            elif n2 == 2:
                attributes.append((texts[1], texts[2], texts[3]))
            else:
                slots.append((ints[1], texts[2], ints[3]))
        nodes.append(ObjectNode(children, attributes, slots))
    return nodes


def encode_object_graph(nodes: list[ObjectNode], has_values: list[bool] | None = None) -> bytes:
    """A TrackableObjectGraph (``has_values[i]``: has_checkpoint_values of node i,
    a BoolValue wrapper in field 5)."""
    out = bytearray()
    for i, node in enumerate(nodes):
        body = bytearray()
        for node_id, name in node.children:
            body += field_bytes(1, field_varint(1, node_id) + field_bytes(2, name.encode()))
        for name, full, key in node.attributes:
            body += field_bytes(2, field_bytes(1, name.encode()) + field_bytes(2, full.encode())
                                + field_bytes(3, key.encode()))
        for orig, slot, slot_node in node.slots:
            body += field_bytes(3, field_varint(1, orig) + field_bytes(2, slot.encode())
                                + field_varint(3, slot_node))
        if has_values is not None:
            body += field_bytes(5, field_varint(1, int(has_values[i])))
        out += field_bytes(1, bytes(body))
    return bytes(out)
