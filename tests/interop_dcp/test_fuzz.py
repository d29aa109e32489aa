"""Bounded fuzzing of the DCP reader's parsers: the restricted unpickler, the metadata
decoder, the zip reader and the tensor decoder, fed mutated real files and generated
opcode streams. Only pyckpt's CheckpointError classes may escape, never another
exception, a hang or a large allocation. Seeded; a few seconds each (the longer
runs are marked slow)."""

import os
import random
import sys
import time
import tracemalloc

import pytest

from pyckpt.codecs.distcp import DCPCheckpoint
from pyckpt.codecs.distcp.allowed import ARCHIVE_GLOBALS, METADATA_GLOBALS
from pyckpt.codecs.distcp.archive import Item, Place, decode_tensor, read_directory, read_member
from pyckpt.codecs.distcp.metadata import decode_metadata
from pyckpt.codecs.distcp.unpickler import restricted_load
from pyckpt.errors import CheckpointError
from pyckpt.storage.local import LocalStore

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from mutations import mutate  # noqa: E402 (tests/interop_dcp/mutations.py)

CKPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "fixtures", "ckpt")


def _read(name: str) -> bytes:
    with open(os.path.join(CKPT, name), "rb") as f:
        return f.read()


def _only_checkpoint_errors(fn, inputs, budget_s: float) -> int:
    """Runs fn on each input; anything but a CheckpointError fails; returns how many ran."""
    tracemalloc.start()
    t0, n = time.perf_counter(), 0
    try:
        for data in inputs:
            try:
                fn(data)
            except CheckpointError:
                pass
            n += 1
            if time.perf_counter() - t0 > budget_s:
                break
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 256 << 20, f"a parse allocated {peak} bytes"
    return n


def _mutations(seed: int, base: bytes, count: int):
    rng = random.Random(seed)
    for _ in range(count):
        yield mutate(base, rng)


def test_mutated_metadata():
    base = _read(".metadata")
    ran = _only_checkpoint_errors(lambda d: decode_metadata(d, "fuzz"), _mutations(1, base, 400), 20)
    assert ran >= 50


def test_mutated_metadata_then_read():
    """Mutated metadata that still opens is read against the real data files."""
    base = _read(".metadata")
    store = LocalStore()

    def run(data: bytes) -> None:
        src = DCPCheckpoint.from_metadata_bytes(store, CKPT, data)
        src.read_new(range(len(src.keys)))
        src.tree
    ran = _only_checkpoint_errors(run, _mutations(2, base, 150), 20)
    assert ran >= 30


def _items():
    """(archive bytes, torch dtype) of every tensor chunk of the fixture."""
    src = DCPCheckpoint(LocalStore(), CKPT)
    out = []
    for e in src.tensors:
        for ch in e.chunks:
            raw = _read(ch.storage.relative_path)
            out.append((raw[ch.storage.offset:ch.storage.offset + ch.storage.length], e.torch_dtype))
    return out


def _decode_archive(data: bytes, dtype: str) -> None:
    item = Item(Place("tensor", "k", "fuzz", 0, len(data)), lambda b, e: data[b:e], [])
    t = decode_tensor(item, dtype)
    read_member(item, t.storage)
    for m in read_directory(item).values():
        read_member(item, m)


def test_mutated_archives():
    rng = random.Random(3)
    items = _items()
    inputs = ((mutate(d, rng), t) for d, t in (rng.choice(items) for _ in range(400)))
    ran = _only_checkpoint_errors(lambda x: _decode_archive(*x), inputs, 20)
    assert ran >= 50


_OPS = [b"(", b")", b"]", b"}", b"N", b"\x88", b"\x89", b"K\x01", b"M\x01\x00", b"J\xff\xff\xff\xff",
        b"\x8a\x02\xff\x7f", b"\x8c\x01a", b"X\x01\x00\x00\x00b", b"C\x02xy", b"t", b"\x85", b"\x86",
        b"\x87", b"a", b"e", b"s", b"u", b"d", b"l", b"0", b"1", b"2", b"\x94", b"q\x00", b"h\x00",
        b"r\x05\x00\x00\x00", b"j\x05\x00\x00\x00", b"R", b"\x81", b"b", b"Q", b"\x92",
        b"\x8c\x05torch\x8c\x04Size\x93", b"ctorch\nfloat32\n", b"ctorch._utils\n_rebuild_tensor_v2\n",
        b"\x8c&torch.distributed.checkpoint.metadata\x8c\x08Metadata\x93", b"cos\nsystem\n",
        b"ccollections\nOrderedDict\n", b"ctorch\nFloatStorage\n", b"\x95\x00\x00\x00\x00\x00\x00\x00\x00",
        b"G\x3f\xf0\x00\x00\x00\x00\x00\x00", b"\xff", b"i", b"\x82\x01"]


def _opcode_streams(seed: int, count: int):
    rng = random.Random(seed)
    for _ in range(count):
        yield b"\x80\x04" + b"".join(rng.choice(_OPS) for _ in range(rng.randint(1, 40))) + b"."


def test_generated_opcode_streams():
    def run(data: bytes) -> None:
        restricted_load(data, METADATA_GLOBALS, where="fuzz")
        restricted_load(data, ARCHIVE_GLOBALS, where="fuzz", persistent=lambda pid: pid)
    ran = _only_checkpoint_errors(run, _opcode_streams(4, 3000), 20)
    assert ran >= 500


def test_hypothesis_restricted_load():
    hypothesis = pytest.importorskip("hypothesis")
    st = hypothesis.strategies

    @hypothesis.settings(max_examples=300, deadline=None, database=None, derandomize=True)
    @hypothesis.given(st.lists(st.sampled_from(_OPS), max_size=30), st.binary(max_size=16))
    def check(ops, tail):
        data = b"\x80\x04" + b"".join(ops) + tail
        try:
            restricted_load(data, METADATA_GLOBALS, where="fuzz")
        except CheckpointError:
            pass
        try:
            decode_metadata(data, "fuzz")
        except CheckpointError:
            pass
    check()


@pytest.mark.slow
def test_long_fuzz():
    base, items = _read(".metadata"), _items()
    rng = random.Random(5)
    _only_checkpoint_errors(lambda d: decode_metadata(d, "fuzz"), _mutations(6, base, 20000), 60)
    inputs = ((mutate(d, rng), t) for d, t in (rng.choice(items) for _ in range(20000)))
    _only_checkpoint_errors(lambda x: _decode_archive(*x), inputs, 60)
    _only_checkpoint_errors(lambda d: restricted_load(d, METADATA_GLOBALS, where="f"),
                            _opcode_streams(7, 200000), 60)
