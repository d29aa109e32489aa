"""How a DCP ``.metadata`` opens (issue 37 item 2: 200,000 chunks in under 2 s): the
pickle machine runs no Python per opcode (C++), the records DCP writes take the
plain path of the checks (a few steps per chunk), the cyclic GC does not walk the
records while they are built and checked, and the plain path gives what the full
checks give, on real files and on thousands of mutations of them."""

from __future__ import annotations

import gc
import os
import random
import sys

import pytest

from pyckpt.codecs.distcp import metadata
from pyckpt.codecs.distcp.allowed import METADATA_GLOBALS
from pyckpt.codecs.distcp.metadata import decode_metadata
from pyckpt.codecs.distcp.unpickler import restricted_load
from pyckpt.errors import CorruptCheckpointError

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, os.pardir, os.pardir, "fuzz"))
import hostile_open  # noqa: E402

CKPT = os.path.join(HERE, "fixtures", "ckpt")


@pytest.fixture(scope="module")
def columns() -> bytes:
    pytest.importorskip("torch")
    return hostile_open.dcp_columns(2, 3000)


def _python_calls(data: bytes) -> dict[str, int]:
    """Python functions called by restricted_load(data): {file:function: count}."""
    calls: dict[str, int] = {}

    def profile(frame, event, arg):
        if event == "call":
            name = f"{os.path.basename(frame.f_code.co_filename)}:{frame.f_code.co_name}"
            calls[name] = calls.get(name, 0) + 1
    sys.setprofile(profile)
    try:
        restricted_load(data, METADATA_GLOBALS, where="t")
    finally:
        sys.setprofile(None)
    return calls


def test_the_pickle_machine_runs_no_python_per_opcode(columns):
    """The Python code of unpickler.py runs a fixed number of times per load (the
    entry point, a stand-in's attributes once), whatever the file's size; Python
    otherwise runs only for the stand-ins' calls (allowed.py), one per REDUCE, but
    torch.Size's (``unpickler.int_tuple``: once per chunk box), which the machine runs
    itself on a tuple or list of ints."""
    big = _python_calls(columns)
    small = _python_calls(hostile_open.dcp_columns(2, 30))
    mine = {k: v for k, v in big.items() if k.startswith("unpickler.py")}
    assert mine["unpickler.py:restricted_load"] == 1
    assert mine == {k: v for k, v in small.items() if k.startswith("unpickler.py")}
    assert "unpickler.py:int_tuple" not in big  # 3 * 2 * 3000 + 2 torch.Size calls


def test_chunks_dcp_writes_take_the_plain_path(columns, monkeypatch):
    full = {"chunk": 0, "storage": 0}
    chunk, storage = metadata._chunk, metadata._storage

    def count_chunk(*a):
        full["chunk"] += 1
        return chunk(*a)

    def count_storage(*a):
        full["storage"] += 1
        return storage(*a)
    monkeypatch.setattr(metadata, "_chunk", count_chunk)
    monkeypatch.setattr(metadata, "_storage", count_storage)
    meta = decode_metadata(columns, "/ck/.metadata")
    assert [len(e.chunks) for e in meta.entries] == [3000, 3000]
    assert full == {"chunk": 0, "storage": 0}


def test_no_cyclic_collection_while_a_metadata_opens(columns):
    """(Each collection walked every record built so far: half the open's time.)"""
    starts = []

    def callback(phase, info):
        if phase == "start":
            starts.append(info["generation"])
    gc.collect()
    gc.callbacks.append(callback)
    try:
        decode_metadata(columns, "/ck/.metadata")
    finally:
        gc.callbacks.remove(callback)
    assert len(starts) <= 1  # (once on again, the GC may look at what is left, once)
    assert gc.isenabled()


def test_the_gc_stays_paused_when_the_caller_paused_it(columns):
    gc.disable()
    try:
        decode_metadata(columns, "/ck/.metadata")
        assert not gc.isenabled()
    finally:
        gc.enable()


def _outcome(data: bytes):
    try:
        return "value", decode_metadata(data, "/ck/.metadata")
    except CorruptCheckpointError as e:
        return "refused", str(e)


def _mutate(data: bytes, rng: random.Random) -> bytes:
    out = bytearray(data)
    for _ in range(rng.randint(1, 3)):
        pos = rng.randrange(len(out))
        kind = rng.randrange(4)
        if kind == 0:
            out[pos] ^= 1 << rng.randrange(8)
        elif kind == 1:
            out[pos] = rng.choice([0, 1, 2, 0x7F, 0x80, 0xFF, ord("N"), ord("K"), 0x88])
        elif kind == 2:
            out[pos:pos] = out[pos:pos + rng.randint(1, 16)]
        else:
            del out[pos:pos + rng.randint(1, 4)]
    return bytes(out)


def test_the_plain_path_gives_what_the_full_checks_give(monkeypatch):
    """Real metadata and 1,500 mutations of it, decoded with and without the plain
    path: equal entries, or the same refusal."""
    pytest.importorskip("torch")
    bases = [open(os.path.join(CKPT, ".metadata"), "rb").read(),
             hostile_open.dcp_metadata({"a": ((4, 6), [((0, 0), (4, 3)), ((0, 3), (4, 3))]),
                                        "b": ((5,), [((0,), (5,))])},
                                       {"e": ("__1_0.distcp", 0, 10)})]
    rng = random.Random(40)
    inputs = bases + [_mutate(bases[n % 2], rng) for n in range(1500)]
    plain = [_outcome(d) for d in inputs]
    monkeypatch.setattr(metadata, "_plain_chunk", lambda *a: None)
    monkeypatch.setattr(metadata, "_plain_storage_record", lambda *a: None)
    full = [_outcome(d) for d in inputs]
    assert plain[:2] == full[:2] and plain[0][0] == plain[1][0] == "value"
    assert sum(p[0] == "value" for p in plain) > 20
    for d, p, f in zip(inputs, plain, full):
        assert p == f, d


@pytest.mark.parametrize("value", [b"}", b"]", b")"])  # an empty dict, list, tuple
def test_a_storage_record_whose_file_name_is_no_string_is_refused(value):
    """A storage record naming its file by a dict (unhashable) once left the plain path
    with a TypeError (found by the mutations of test_fuzz.py): any kind there is
    refused by the full checks, naming the record."""
    with open(os.path.join(CKPT, ".metadata"), "rb") as f:
        data = f.read()
    name = b"\x8c\x0c__0_0.distcp"
    assert name in data
    with pytest.raises(CorruptCheckpointError, match="storage record"):
        decode_metadata(data.replace(name, value), "/ck/.metadata")
