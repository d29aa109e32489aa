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
                   fields, read_field, read_varint, signed32, signed64)

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
        number, wtype, value, pos = read_field(buf, pos, end)
        if number == 2:
            _kind(number, wtype, LEN, "shape")
            size = 0
            for n2, w2, v2 in fields(buf, value, pos):
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
        number, wtype, b, pos = read_field(buf, pos, end, "object graph")
        if number != 1:
            continue
        _kind(number, wtype, LEN, "object graph")
        nodes.append(_object_node(buf, b, pos))
    return nodes


def _object_node(buf: bytes, start: int, end: int) -> ObjectNode:
    """The TrackableObject ``buf[start:end]``: its children, attributes and slot variables."""
    node = ObjectNode([], [], [])
    pos = start
    while pos < end:
        tag = buf[pos]
        n = buf[pos + 1] if pos + 1 < end else 0x80
        if tag in (0x0A, 0x12, 0x1A) and n < 0x80 and pos + 2 + n <= end:
            number, b, pos = tag >> 3, pos + 2, pos + 2 + n  # fields 1-3, one-byte length
        else:
            number, wtype, b, pos = read_field(buf, pos, end, "object graph node")
            if number not in (1, 2, 3):
                continue
            _kind(number, wtype, LEN, "object graph node")
        ints, texts = _reference(buf, b, pos)
        if number == 1:
            node.children.append((ints[1], texts[2]))
        elif number == 2:
            node.attributes.append((texts[1], texts[2], texts[3]))
        else:
            node.slots.append((ints[1], texts[2], ints[3]))
    return node


def _reference(buf: bytes, start: int, end: int) -> tuple[list[int], list[str]]:
    """Fields 1 to 3 of the ObjectReference, SerializedTensor or SlotVariableReference
    ``buf[start:end]``, by field number: the int32 varints and the UTF-8 strings
    (fields with a one-byte tag decoded inline, others by ``read_field``)."""
    ints = [0, 0, 0, 0]
    texts = ["", "", "", ""]
    pos = start
    while pos < end:
        tag = buf[pos]
        number, wtype = tag >> 3, tag & 7
        if tag >= 0x80 or number == 0:
            number, wtype, v, pos = read_field(buf, pos, end, "object graph reference")
            if number > 3:
                continue
            if wtype == VARINT:
                ints[number] = signed32(v)
            elif wtype == LEN:
                texts[number] = _text(buf, (v, pos), "a name in the object graph")
            continue
        pos += 1
        if wtype == VARINT:
            v, pos = read_varint(buf, pos, end)
            if number <= 3:
                ints[number] = signed32(v)
        elif wtype == LEN:
            ln, pos = read_varint(buf, pos, end)
            if ln > end - pos:
                raise WireError(f"object graph: a name of {ln} bytes runs past its "
                                f"message at byte {pos}")
            if number <= 3:
                texts[number] = _text(buf, (pos, pos + ln), "a name in the object graph")
            pos += ln
        elif wtype in (FIXED32, FIXED64):
            pos += 4 if wtype == FIXED32 else 8
            if pos > end:
                raise WireError("object graph: truncated fixed field")
        else:
            raise WireError(f"object graph: field {number} has wire type {wtype}")
    return ints, texts


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
