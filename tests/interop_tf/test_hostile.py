"""Bad input: truncated, bit-flipped and hostile TensorFlow index tables, entries and
state files. Every one must raise a clean CheckpointError (CorruptCheckpointError for
damage), quickly, without a crash or a large allocation."""

import os
import random
import struct
import time
import tracemalloc

import numpy as np
import pytest

from pyckpt.errors import CheckpointError, CorruptCheckpointError
from pyckpt.format import tf_state
from pyckpt.interop.tensorflow import TensorFlowCheckpoint
from pyckpt.codecs.tensorflow import messages, object_graph, strings, table, wire
from pyckpt.storage import resolve


def parse(data: bytes, tmp_path=None) -> TensorFlowCheckpoint:
    store, p = resolve(str(tmp_path or "/nonexistent") + "/x")
    return TensorFlowCheckpoint.from_index_bytes(store, p, data)


def index_of(fixtures, *parts) -> bytes:
    with open(os.path.join(fixtures, *parts) + ".index", "rb") as f:
        return f.read()


def entry(dtype=1, shape=(2,), shard=0, offset=0, size=8, crc=1) -> bytes:
    return messages.encode_entry(dtype, shape, shard, offset, size, crc)


def bundle(entries, header=None) -> bytes:
    return table.build_table([(b"", header if header is not None else messages.encode_header(1))]
                             + sorted(entries))


def footer(meta, index) -> bytes:
    h = wire.varint(meta[0]) + wire.varint(meta[1]) + wire.varint(index[0]) + wire.varint(index[1])
    return h + bytes(40 - len(h)) + struct.pack("<Q", table.TABLE_MAGIC)


def block(raw_entries: bytes, restarts=(0,)) -> bytes:
    contents = raw_entries + struct.pack(f"<{len(restarts)}I", *restarts) + \
        struct.pack("<I", len(restarts))
    return table._with_trailer(contents)


def table_from_blocks(data_blocks: list[bytes], index_entries: list[tuple[bytes, int, int]]) -> bytes:
    """Data blocks laid out in order, then an empty metaindex, an index whose entries
    point wherever the test says ((key, offset, size)), and a footer."""
    out = b"".join(data_blocks)
    meta_off = len(out)
    meta = block(b"")
    out += meta
    idx = b""
    for k, off, size in index_entries:
        v = wire.varint(off) + wire.varint(size)
        idx += wire.varint(0) + wire.varint(len(k)) + wire.varint(len(v)) + k + v
    index_off = len(out)
    ib = block(idx, tuple(range(0, 0)) or (0,))
    out += ib
    return out + footer((meta_off, len(meta) - 5), (index_off, len(ib) - 5))


def raw_entry(shared: int, key: bytes, value: bytes) -> bytes:
    return wire.varint(shared) + wire.varint(len(key)) + wire.varint(len(value)) + key + value


def expect_clean(data: bytes, match: str | None = None) -> CheckpointError:
    t = time.perf_counter()
    with pytest.raises(CheckpointError, match=match) as e:
        parse(data)
    assert time.perf_counter() - t < 5
    return e.value


def test_valid_tables_parse(fixtures):
    for parts in [("mixed", "ckpt-1"), ("training", "ckpt-5"), ("raw", "dtypes"),
                  ("tf1", "run_0", "model.ckpt-5")]:
        ck = parse(index_of(fixtures, *parts))
        assert len(ck.keys) > 0


def test_every_truncation(fixtures):
    data = index_of(fixtures, "mixed", "ckpt-1")
    for n in range(len(data)):
        with pytest.raises(CorruptCheckpointError):
            parse(data[:n])


def test_every_bit_flip(fixtures):
    data = index_of(fixtures, "training", "ckpt-5")
    original = parse(data)
    same = 0
    for pos in range(len(data)):
        for bit in range(8):
            bad = bytearray(data)
            bad[pos] ^= 1 << bit
            try:
                ck = parse(bytes(bad))
            except CheckpointError:
                continue
            # only the footer's padding carries no information
            assert len(data) - 48 <= pos < len(data) - 8, (pos, bit)
            assert list(ck.keys) == list(original.keys)
            same += 1
    assert same <= 8 * 40


def test_random_mutations(fixtures):
    rng = random.Random(15)
    data = index_of(fixtures, "raw", "dtypes")
    for _ in range(3000):
        bad = bytearray(data)
        for _ in range(rng.randint(1, 8)):
            op = rng.random()
            pos = rng.randrange(len(bad))
            if op < 0.5:
                bad[pos] = rng.randrange(256)
            elif op < 0.75:
                del bad[pos:pos + rng.randint(1, 16)]
            else:
                bad[pos:pos] = bytes(rng.randrange(256) for _ in range(rng.randint(1, 16)))
        try:
            parse(bytes(bad))
        except CheckpointError:
            pass


def test_not_a_table(tmp_path):
    expect_clean(b"", "shorter than a table footer")
    expect_clean(b"PYCKPTIX" + bytes(100), "bad table magic")


def test_handles_past_the_end():
    good = bundle([(b"a", entry())])
    body = good[:-48]
    expect_clean(body + footer((10 ** 6, 5), (0, 5)), "points past the end")
    mo, pos = wire.read_varint(good, len(good) - 48, len(good))
    ms, _ = wire.read_varint(good, pos, len(good))
    expect_clean(body + footer((mo, ms), (0, 2 ** 60)), "index block handle .* points past")
    expect_clean(body + footer((2 ** 63, 2 ** 63), (0, 5)), "points past the end")


def test_overlong_varint_in_footer():
    good = bundle([(b"a", entry())])
    bad = good[:-48] + b"\xff" * 11 + bytes(29) + struct.pack("<Q", table.TABLE_MAGIC)
    expect_clean(bad, "block handle")


def test_index_pointing_twice_at_one_block_or_at_itself():
    header = raw_entry(0, b"", messages.encode_header(1))
    d = block(header + raw_entry(0, b"a", entry()))
    size = len(d) - 5
    expect_clean(table_from_blocks([d], [(b"a", 0, size), (b"b", 0, size)]), "overlaps")
    # a data block handle that names the index block itself (a loop)
    data = table_from_blocks([d], [(b"a", 0, size)])
    index_off = len(d) + len(block(b""))
    expect_clean(table_from_blocks([d], [(b"a", 0, size), (b"z", index_off, 10)]),
                 "past the end of the blocks|checksum")
    assert parse(data).keys == ["a"]


def test_keys_out_of_order_and_duplicates():
    header = raw_entry(0, b"", messages.encode_header(1))
    for keys in [[b"b", b"a"], [b"a", b"a"]]:
        d = block(header + b"".join(raw_entry(0, k, entry()) for k in keys))
        expect_clean(table_from_blocks([d], [(b"z", 0, len(d) - 5)]), "strictly increase")


def test_bad_prefix_compression():
    header = raw_entry(0, b"", messages.encode_header(1))
    d = block(header + raw_entry(0, b"ab", entry()) + raw_entry(5, b"c", entry()))
    expect_clean(table_from_blocks([d], [(b"z", 0, len(d) - 5)]), "shares 5 bytes")
    d = block(raw_entry(3, b"abc", entry()))
    expect_clean(table_from_blocks([d], [(b"z", 0, len(d) - 5)]), "shares a prefix")


def test_restart_points():
    header = raw_entry(0, b"", messages.encode_header(1))
    entries = header + raw_entry(0, b"a", entry())
    for restarts, match in [((0, 3), "not at an entry|restart"), ((0, 10 ** 6), "restart"),
                            (tuple(range(0, 5)), "restart")]:
        d = block(entries, restarts)
        expect_clean(table_from_blocks([d], [(b"z", 0, len(d) - 5)]), match)
    huge = entries + struct.pack("<I", 2 ** 31)
    d = table._with_trailer(huge)
    expect_clean(table_from_blocks([d], [(b"z", 0, len(d) - 5)]), "restart points")


def test_prefix_bomb_is_bounded():
    """Each entry shares the whole previous key plus one byte: the rebuilt keys would
    total ~ N^2 / 2 bytes. The key budget stops it after linear work."""
    header = raw_entry(0, b"", messages.encode_header(1))
    parts = [raw_entry(0, b"k", b"")]
    for i in range(1, 60000):
        parts.append(raw_entry(i, b"k", b""))
    d = block(header + b"".join(parts))
    t = time.perf_counter()
    expect_clean(table_from_blocks([d], [(b"\xff", 0, len(d) - 5)]), "hostile|sort")
    assert time.perf_counter() - t < 5


@pytest.mark.parametrize("value,match", [
    (entry(shape=(2 ** 40, 2 ** 40), size=0), "needs"),
    (entry(shape=(2 ** 31, 2 ** 31), size=2 ** 64 - 1), "impossible|negative"),
    (entry(shape=(2 ** 31, 2 ** 31), size=2 ** 62), "needs|too large"),
    (entry(shape=(1,) * 65, size=4), "dimensions"),
    (entry(shape=(-5,), size=0), "size -5|negative"),
    (entry(dtype=7, shape=(10 ** 9,), size=100), "strings cannot fit"),
    (entry(dtype=999), "unknown dtype"),
    (entry(shard=3), "shard 3"),
    (b"\x08", "truncated"),
    (b"\x12\xff\xff\xff\xff\x0f", "run past"),
    (b"\x0a\x01\x00", "wire type"),
    (b"\x0b\x00", "wire type"),
])
def test_hostile_entries(value, match):
    tracemalloc.start()
    try:
        err = expect_clean(bundle([(b"evil", value)]), match)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 10 << 20
    assert "evil" in str(err) or match in ("truncated", "run past", "wire type")


def test_hostile_headers():
    expect_clean(table.build_table([(b"a", entry())]), "no header")
    expect_clean(bundle([], messages.encode_header(0)), "0 shards")
    expect_clean(bundle([], wire.field_varint(1, 2 ** 31 - 1)), "shards")
    newer = wire.field_varint(1, 1) + wire.field_bytes(3, wire.field_varint(2, 7))
    with pytest.raises(CheckpointError, match="bundle version 7"):
        parse(bundle([], newer))


def test_hostile_strings_and_variants():
    for raw, count in [(b"", 1), (b"\xff" * 20, 2), (b"\x05" + bytes(4) + b"ab", 1),
                       (wire.varint(2 ** 40) + bytes(4), 1)]:
        with pytest.raises(wire.WireError):
            strings.decode_strings(raw, count)
    good, crc = strings.encode_strings(np.array([b"ab", b""], dtype=object))
    assert strings.decode_strings(good, 2) == ([b"ab", b""], crc)
    with pytest.raises(wire.WireError):
        strings.decode_strings(good + b"x", 2)
    for raw in [b"", wire.varint(2 ** 60) + bytes(8), b"\x01x" + bytes(4)]:
        with pytest.raises(wire.WireError):
            strings.check_variants(raw, 1)


def test_hostile_object_graphs():
    bad = lambda m: CorruptCheckpointError(m)  # noqa: E731
    node = messages.ObjectNode([(5, "x")], [], [])
    with pytest.raises(CorruptCheckpointError, match="points to node 5"):
        object_graph.to_pyckpt_graph([node], {}, bad)
    with pytest.raises(CorruptCheckpointError, match="no nodes"):
        object_graph.to_pyckpt_graph([], {}, bad)
    with pytest.raises(wire.WireError):
        messages.decode_object_graph(b"\x0a\x05\x0a\x03\x08")
    nodes = messages.decode_object_graph(messages.encode_object_graph(
        [messages.ObjectNode([(1, "a.b/c")], [], []),
         messages.ObjectNode([], [("VARIABLE_VALUE", "v", "k")], [])]))
    g = object_graph.to_pyckpt_graph(nodes, {"k": 0}, bad)
    assert g["children"][0] == [["a.b/c", 1]] and g["value"] == [None, "k"]


def test_state_file_parser():
    s = tf_state.parse_state(b'# c\nmodel_checkpoint_path: "a\\"b\\\\c\\303\\251"\n'
                             b"all_model_checkpoint_paths: 'x' 'y'\n"
                             b"all_model_checkpoint_timestamps: 1.5e9\nunknown { a: 1 }\n")
    assert s.model_checkpoint_path == 'a"b\\c\u00e9'
    assert s.all_model_checkpoint_paths == ["xy"]
    assert s.all_model_checkpoint_timestamps == [1.5e9]
    back = tf_state.parse_state(tf_state.format_state(s))
    assert back == s
    for bad in [b"model_checkpoint_path", b'model_checkpoint_path: "x', b"{", b"x: {",
                b"model_checkpoint_path: 3", b"a" * (17 << 20)]:
        with pytest.raises(CorruptCheckpointError):
            tf_state.parse_state(bad)
    assert tf_state.checkpoint_name("/a/b/ckpt-3") == "ckpt-3"
    assert tf_state.checkpoint_name("..\\..\\ckpt-3") == "ckpt-3"
    for bad_name in ["", "..", "a/..", "/", "x\0"]:
        with pytest.raises(CorruptCheckpointError):
            tf_state.checkpoint_name(bad_name)
