"""S3 bodies received straight into their destinations (``Store.fetch(into=)``): the
reader passes, for a request that is one piece of one destination array, that array's
bytes; the store receives the body there and the core verifies it in place. The
checks that guard the bytes are the same: a wrong length or a flipped byte raises."""

import asyncio
import uuid

import numpy as np
import pytest

import pyckpt
from pyckpt.storage import fsspec_store
from pyckpt.storage.remote_client import _receive_into


class _Content:
    """aiohttp's StreamReader, as far as ``_receive_into`` uses it."""

    def __init__(self, pieces):
        self.pieces = list(pieces)

    async def readchunk(self):
        if self.pieces:
            piece = self.pieces.pop(0)
            return piece, piece == b""  # b"": the end of an HTTP chunk
        return b"", False

    def at_eof(self):
        return not self.pieces


class _Body:
    def __init__(self, pieces):
        self.raw_stream = type("Response", (), {"content": _Content(pieces)})()


class _Attempt:
    def __init__(self):
        self.progressed = 0

    def progress(self):
        self.progressed += 1


def _receive(pieces, *sizes):
    into = [np.zeros(n, np.uint8) for n in sizes]
    att = _Attempt()
    got = asyncio.run(_receive_into(_Body(pieces), into, att, "s3://b/k", 0, sum(sizes)))
    return into, got, att


def test_a_body_lands_in_place_piece_by_piece():
    into, got, att = _receive([b"abc", b"", b"defg", b"h"], 8)
    assert got is into
    assert into[0].tobytes() == b"abcdefgh"
    assert att.progressed == 3  # one per piece of the body


def test_a_body_is_scattered_over_its_buffers_across_piece_boundaries():
    into, got, _ = _receive([b"ab", b"cdefg", b"hij"], 3, 1, 4, 2)
    assert got is into
    assert [b.tobytes() for b in into] == [b"abc", b"d", b"efgh", b"ij"]


def test_a_short_body_comes_back_as_the_part_received():
    into, got, _ = _receive([b"abcd"], 3, 5)
    assert got is not into
    assert [bytes(b) for b in got] == [b"abc", b"d"]  # the caller's length check names it


def test_a_body_longer_than_asked_is_corruption_naming_the_range():
    with pytest.raises(pyckpt.CorruptCheckpointError,
                       match=r"s3://b/k' returned more than the 4 bytes of bytes \[0, 4\)"):
        _receive([b"abc", b"de"], 4)


@pytest.fixture
def fetched(monkeypatch):
    """What FsspecStore.fetch was given and gave back."""
    calls = []
    real = fsspec_store.FsspecStore.fetch

    def spy(self, ranges, into=None):
        out = real(self, ranges, into)
        calls.append((list(into or [None] * len(ranges)), out))
        return out

    monkeypatch.setattr(fsspec_store.FsspecStore, "fetch", spy)
    return calls


def test_loads_from_s3_receive_into_the_destinations(seaweed_options, fetched, rng):
    opts = {**seaweed_options, "pyckpt": {"read_request_max": 1 << 20}}
    url = f"s3://pyckpt/into-{uuid.uuid4().hex[:8]}"
    tree = {"big": rng.standard_normal(600_000),                # 5 requests of 1 MiB or less
            "t": np.asfortranarray(rng.standard_normal((300, 200))),  # not contiguous
            "small": np.arange(10, dtype=np.int16)}
    pyckpt.save(tree, url, storage_options=opts)
    into = {"big": np.zeros(600_000), "t": np.asfortranarray(np.zeros((300, 200))),
            "small": np.zeros(10, np.int16)}
    pyckpt.load(url, storage_options=opts, into=into)
    for k in tree:
        np.testing.assert_array_equal(into[k], tree[k])
    landed = [(d, b) for dsts, bufs in fetched for d, b in zip(dsts, bufs) if d is not None]
    assert landed and all(b is d for d, b in landed)  # no second buffer, no copy
    segments = [s for d, _ in landed for s in d]
    for k in ("big", "small"):  # the small one in a request merged with its neighbours
        assert any(np.shares_memory(s, into[k]) for s in segments), k
    assert sum(s.nbytes for s in segments if np.shares_memory(s, into["big"])) == \
        into["big"].nbytes
    out = pyckpt.load(url, storage_options=opts)  # new arrays: the same way
    for k in tree:
        np.testing.assert_array_equal(out[k], tree[k])


def test_a_flipped_byte_received_in_place_is_caught(seaweed_options, rng):
    import s3fs

    url = f"s3://pyckpt/into-flip-{uuid.uuid4().hex[:8]}"
    pyckpt.save({"a": rng.standard_normal(200_000)}, url, storage_options=seaweed_options)
    fs = s3fs.S3FileSystem(**{k: v for k, v in seaweed_options.items() if k != "pyckpt"})
    name = next(p for p in fs.ls(url.removeprefix("s3://")) if "/data-" in p)
    data = bytearray(fs.cat_file(name))
    data[123_456] ^= 0x10
    fs.pipe_file(name, bytes(data))
    with pytest.raises(pyckpt.CorruptCheckpointError, match=r"data-.*bytes \["):
        pyckpt.load(url, storage_options=seaweed_options, into={"a": np.zeros(200_000)})


def test_bytes_received_in_place_count_a_quarter_against_the_batch_limit():
    from pyckpt.engine import read_executor as rx

    def req(n, dst=True):
        p = rx._Piece(0, 0, n, "k", 0, 1, np.empty(n, np.uint8) if dst else None)
        return (0, 0, n, [p])

    landed = [req(100) for _ in range(8)]   # 800 bytes received into destinations
    own = [req(100, dst=False) for _ in range(4)]  # 400 bytes needing buffers
    assert [len(b) for b in rx._batches(landed + own, 200, lands=True)] == [10, 2]
    assert [len(b) for b in rx._batches(landed + own, 200, lands=False)] == [2] * 6
