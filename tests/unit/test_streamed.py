"""storage/streamed.py: a sequential producer behind ``NewFile.fill``, asked for parts
in any order, from several threads, and again after a failed attempt."""

import concurrent.futures
import random

import pytest

from pyckpt.storage.streamed import StreamedFile

DATA = bytes(random.Random(0).randrange(256) for _ in range(100_003))


def _producer(runs, piece=7_001):
    def produce():
        runs.append(1)
        for b in range(0, len(DATA), piece):
            yield DATA[b:b + piece]
    return produce


def _parts(size, part):
    return [(b, min(b + part, size)) for b in range(0, size, part)]


def test_parts_in_any_order_and_from_threads():
    runs = []
    f = StreamedFile("x", len(DATA), _producer(runs))
    parts = _parts(len(DATA), 8_192)
    order = parts[:]
    random.Random(1).shuffle(order[:6])  # out of order within a window of in-flight parts
    order = order[:6][::-1] + order[6:]
    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        got = dict(zip(order, pool.map(lambda p: bytes(f.fill(p[0], bytearray(p[1] - p[0]))),
                                       order)))
    assert b"".join(got[p] for p in parts) == DATA
    assert len(runs) == 1
    assert f._pieces == [] or all(off + len(p) > f._done for off, p in f._pieces)


def test_a_retry_from_the_start_runs_the_producer_again():
    runs = []
    f = StreamedFile("x", len(DATA), _producer(runs))
    first = [bytes(f.fill(b, bytearray(e - b))) for b, e in _parts(len(DATA), 30_000)]
    again = [bytes(f.fill(b, bytearray(e - b))) for b, e in _parts(len(DATA), 30_000)]
    assert b"".join(first) == b"".join(again) == DATA and len(runs) == 2


def test_a_short_or_long_producer_is_an_error():
    short = StreamedFile("x", len(DATA) + 1, _producer([]))
    with pytest.raises(ValueError, match="stopped at byte 100003 of 100004"):
        short.fill(0, bytearray(len(DATA) + 1))
    long = StreamedFile("x", len(DATA) - 1, _producer([]))
    with pytest.raises(ValueError, match="more than"):
        long.fill(0, bytearray(len(DATA) - 1))
