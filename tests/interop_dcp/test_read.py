"""Reading the DCP checkpoint that torch wrote from 2 processes (fixtures/, see
make_fixtures.py): values exactly as torch saved them, keys, chunks, bytes entries,
the ranges a read touches, resharding into other blocks, and object stores."""

import os

import numpy as np
import pytest

import pyckpt
from pyckpt.codecs.distcp import DCPCheckpoint
from pyckpt.errors import CheckpointKeyError
from pyckpt.sharded import ShardedArray


def test_every_tensor_has_the_saved_value(ckpt, expected, same_value):
    reader = pyckpt.load_checkpoint(ckpt)
    assert reader.source.format == "dcp"
    assert sorted(expected["tensors"]) == reader.keys()
    for key, want in expected["tensors"].items():
        got = reader.get_tensor(key)
        assert same_value(got, want), key
    assert reader.get_tensor("plain.scalar").shape == ()
    assert reader.get_tensor("plain.i64")[0] == 2 ** 40


def test_list_variables_and_chunks(ckpt, expected):
    listed = pyckpt.list_variables(ckpt)
    assert listed == sorted((k, v.shape) for k, v in expected["tensors"].items())
    src = pyckpt.load_checkpoint(ckpt).source
    for key, rows in expected["chunks"].items():
        i = src.index[key]
        assert src.blocks(i) == len(rows) == 2
        got = sorted(list(c.offsets) + list(c.sizes) for c in src.tensors[i].chunks)
        assert got == sorted(rows.tolist())
    # the chunks came from both ranks' files
    files = {c.storage.relative_path for c in src.tensors[src.index["model.sharded"]].chunks}
    assert files == {"__0_0.distcp", "__1_0.distcp"}


def test_bytes_entries_are_listed_not_decoded(ckpt, expected):
    src = pyckpt.load_checkpoint(ckpt).source
    assert not set(expected["bytes"]) & set(src.keys)  # not tensors
    described = {e["key"]: e for e in src.describe()["bytes_entries"]}
    assert set(described) == set(expected["bytes"]) == {"nested.step", "nested.blob"}
    for key, raw in expected["bytes"].items():
        assert src.bytes_entry(key) == raw
        assert described[key]["bytes"] == len(raw)
    with pytest.raises(CheckpointKeyError):
        src.bytes_entry("model.sharded")


def test_load_returns_values_and_bytes(ckpt, expected, same_value):
    state = pyckpt.load(ckpt)
    assert set(state) == set(expected["tensors"]) | set(expected["bytes"])
    for key, want in expected["tensors"].items():
        assert isinstance(state[key], np.ndarray) and same_value(state[key], want), key
    for key, raw in expected["bytes"].items():
        assert state[key] == raw
    some = pyckpt.load(ckpt, select=["model.sharded", "plain.bf16"])
    assert set(some) == {"model.sharded", "plain.bf16"}


def _item_ranges(src, key):
    return [(c.storage.relative_path, c.storage.offset, c.storage.offset + c.storage.length)
            for c in src.tensors[src.index[key]].chunks]


@pytest.mark.parametrize("key", ["model.sharded", "plain.i64", "plain.scalar"])
def test_get_tensor_reads_only_its_byte_ranges(ckpt, recording_store, expected, same_value, key):
    store = recording_store()
    src = DCPCheckpoint(store, ckpt)
    assert store.reads == [(".metadata", 0, os.path.getsize(os.path.join(ckpt, ".metadata")))]
    store.reads.clear()
    got = src.read_new([src.index[key]])[0]
    assert same_value(got, expected["tensors"][key])
    items = _item_ranges(src, key)
    assert store.reads, "nothing was read"
    for name, b, e in store.reads:
        assert any(name == f and s <= b <= e <= t for f, s, t in items), (name, b, e, items)
    assert len(store.reads) == len(items)  # small items: one read each


def test_reshard_into_three_row_blocks(ckpt, expected):
    """The 5x3 tensor saved as rows 0-2 and 3-4 (two ranks) read as 3 blocks of other
    rows, each crossing or inside the stored chunks."""
    want = expected["tensors"]["model.sharded"]
    for lo, hi in [(0, 2), (2, 4), (4, 5)]:
        block = ShardedArray(np.zeros((hi - lo, 3), np.float32), (5, 3), (lo, 0))
        pyckpt.load(ckpt, into={"model.sharded": block})
        assert np.array_equal(block.local, want[lo:hi])


def test_reshard_two_dimensional(ckpt, expected):
    """The 2x4 bfloat16 tensor saved as two column chunks (columns 0-1, 2-3), read
    as blocks of other columns and single rows."""
    want = expected["tensors"]["model.cols"]
    src = pyckpt.load_checkpoint(ckpt).source
    i = src.index["model.cols"]
    blocks = [ShardedArray(np.zeros((1, 2), want.dtype), (2, 4), (r, c))
              for r in (0, 1) for c in (1, 2)]  # columns 1-2 straddle the two chunks
    src.read([i] * len(blocks), blocks)
    for b in blocks:
        r, c = b.offsets
        assert b.local.tobytes() == want[r:r + 1, c:c + 2].tobytes()


def test_load_into_existing_arrays(ckpt, expected):
    target = {"plain.i64": np.zeros(3, np.int64), "model.replicated": np.zeros(3, np.float64)}
    pyckpt.load(ckpt, into=target)
    assert np.array_equal(target["plain.i64"], expected["tensors"]["plain.i64"])
    assert np.array_equal(target["model.replicated"], expected["tensors"]["model.replicated"])


def test_verify_passes(ckpt):
    pyckpt.load_checkpoint(ckpt).verify()


def test_read_from_an_object_store(ckpt, expected, same_value):
    """The same directory in fsspec's memory filesystem: ranged reads through the
    remote store."""
    fsspec = pytest.importorskip("fsspec")
    fs = fsspec.filesystem("memory")
    for name in os.listdir(ckpt):
        with open(os.path.join(ckpt, name), "rb") as f:
            fs.pipe(f"/dcpremote/ckpt/{name}", f.read())
    url = "memory://dcpremote/ckpt"
    reader = pyckpt.load_checkpoint(url)
    assert reader.source.format == "dcp"
    for key, want in expected["tensors"].items():
        assert same_value(reader.get_tensor(key), want), key
    assert pyckpt.load(url)["nested.blob"] == expected["bytes"]["nested.blob"]
    reader.verify()
