"""How a read plan becomes ranged requests (read_executor._requests): full requests
of at most ``request_max`` bytes, items split only at their chunk boundaries, every
byte asked for exactly once, and every piece's CRC range its own chunks."""

import numpy as np
import pytest

import pyckpt
from pyckpt.engine import read_executor as rx

CHUNK = 1 << 10


def _plan(sizes, file=None, gap=64):
    """Items of ``sizes`` bytes laid out one after another (``gap`` bytes apart)."""
    offsets, at = [], 0
    for n in sizes:
        offsets.append(at)
        at += n + gap
    lens = [-(-n // CHUNK) for n in sizes]
    crc_begin = np.zeros(len(sizes) + 1, np.uint64)
    np.cumsum(lens, out=crc_begin[1:])
    return rx.BlockReads([f"k{i}" for i in range(len(sizes))],
                       np.asarray(file or [0] * len(sizes), np.int64),
                       np.asarray(offsets, np.int64), np.asarray(sizes, np.int64),
                       np.arange(int(crc_begin[-1]), dtype=np.uint32), crc_begin)


def _check_cover(plan, reqs):
    """Each item's bytes are its pieces', in order, each piece starting at a chunk
    boundary of its item and owning exactly its chunks' CRCs."""
    by_key: dict = {}
    for f, s, e, members in reqs:
        assert s == members[0].start and e == max(p.end for p in members)
        for p in members:
            assert p.file == f and s <= p.start < p.end <= e
            by_key.setdefault(p.key, []).append(p)
    for i, key in enumerate(plan.keys):
        o, n = int(plan.offset[i]), int(plan.nbytes[i])
        pieces = by_key.get(key, [])
        assert [p.start for p in pieces] == [o] + [p.end for p in pieces[:-1]]
        assert pieces[-1].end == o + n
        for p in pieces:
            assert (p.start - o) % CHUNK == 0
            first = int(plan.crc_begin[i]) + (p.start - o) // CHUNK
            assert (p.c0, p.c1) == (first, first + -(-(p.end - p.start) // CHUNK))


def test_requests_are_filled_to_the_limit_splitting_items_at_chunk_boundaries():
    sizes = [12 * CHUNK] * 8  # each alone would leave a quarter of its request empty
    plan = _plan(sizes, gap=0)
    reqs = rx._requests(plan, [None] * 8, CHUNK, 16 * CHUNK, gap=CHUNK, post=[])
    _check_cover(plan, reqs)
    assert [e - s for _, s, e, _ in reqs] == [16 * CHUNK] * 6  # 96 chunks, 6 requests


def test_odd_sizes_gaps_and_files_are_covered_once():
    rng = np.random.default_rng(3)
    sizes = rng.integers(1, 40 * CHUNK, 60).tolist()
    files = sorted(rng.integers(0, 3, 60).tolist())
    plan = _plan(sizes, file=files, gap=100)
    reqs = rx._requests(plan, [None] * 60, CHUNK, 16 * CHUNK, gap=CHUNK, post=[])
    _check_cover(plan, reqs)
    assert all(e - s <= 16 * CHUNK for _, s, e, _ in reqs)
    assert all(len({p.file for p in m}) == 1 for *_, m in reqs)  # one file per request


def test_items_farther_apart_than_the_gap_start_new_requests():
    plan = _plan([CHUNK, CHUNK], gap=5 * CHUNK)
    reqs = rx._requests(plan, [None] * 2, CHUNK, 16 * CHUNK, gap=CHUNK, post=[])
    assert len(reqs) == 2


def test_a_limit_below_one_chunk_still_takes_a_chunk_per_request():
    plan = _plan([3 * CHUNK + 5])
    reqs = rx._requests(plan, [None], CHUNK, CHUNK // 2, gap=0, post=[])
    _check_cover(plan, reqs)
    assert [e - s for _, s, e, _ in reqs] == [CHUNK, CHUNK, CHUNK, 5]


@pytest.mark.parametrize("into", [False, True])
def test_loads_through_split_requests_round_trip(into, rng):
    """Tensors that straddle request boundaries, from an fsspec memory store."""
    url = "memory://read-requests/ckpt"
    tree = {f"t{i}": rng.standard_normal(int(n)) for i, n in
            enumerate(rng.integers(1, 400_000, 12))}
    opts = {"pyckpt": {"read_request_max": 1 << 20, "read_batch_bytes": 4 << 20}}
    pyckpt.save(tree, url, storage_options=opts)
    dst = {k: np.zeros_like(v) for k, v in tree.items()} if into else None
    out = pyckpt.load(url, storage_options=opts, into=dst)
    for k, v in tree.items():
        np.testing.assert_array_equal(out[k], v)
