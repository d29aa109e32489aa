"""Issue 37, item 2(b): the check that blocks tile a tensor (sharded/boxes.py
``check_partition``) is exact, and O(n log n) where the old sweep on dimension 0 was
O(n^2) (blocks splitting another dimension all stayed active): 200,000 column
blocks, 1,024 blocks x 20 tensors and a 300 KB hostile index open at once. Layouts
too irregular to check within a fixed factor of their size are refused.

The time bounds are generous (seconds, for work that takes milliseconds now and
took minutes before); the cases are fuzz/hostile_open.py's."""

from __future__ import annotations

import ast
import itertools
import os
import random
import re
import sys
import time

import numpy as np
import pytest

import pyckpt.sharded.boxes as boxes
from pyckpt.errors import CorruptCheckpointError
from pyckpt.format import decode_index
from pyckpt.sharded.boxes import check_partition

sys.path.insert(0, os.path.join(os.path.dirname(__file__), os.pardir, os.pardir, "fuzz"))
import hostile_open  # noqa: E402

BOUND = 5.0  # CPU seconds of this process; each case takes well under 1 s (minutes before the fix)


def _coverage_is_exact(shape, bxs) -> bool:
    cov = np.zeros(shape, dtype=np.int64)
    for o, s in bxs:
        if any(x < 0 or n < 0 or x + n > g for x, n, g in zip(o, s, shape)):
            return False
        cov[tuple(slice(x, x + n) for x, n in zip(o, s))] += 1
    return bool((cov == 1).all())


def _guillotine(rng: random.Random, shape: tuple[int, ...], cuts: int) -> list:
    out = [((0,) * len(shape), shape)]
    for _ in range(cuts):
        i = rng.randrange(len(out))
        o, s = out[i]
        k = rng.randrange(len(shape))
        if s[k] < 2:
            continue
        c = rng.randint(1, s[k] - 1)
        out[i] = (o, s[:k] + (c,) + s[k + 1:])
        out.append((o[:k] + (o[k] + c,) + o[k + 1:], s[:k] + (s[k] - c,) + s[k + 1:]))
    return out


def _damaged(rng: random.Random, bxs: list) -> list:
    bxs = list(bxs)
    for _ in range(rng.randint(1, 3)):
        i = rng.randrange(len(bxs))
        o, s = map(list, bxs[i])
        k = rng.randrange(len(o))
        if rng.random() < 0.5:
            o[k] = max(0, o[k] + rng.choice((-1, 1)))
        else:
            s[k] = max(0, s[k] + rng.choice((-1, 1)))
        bxs[i] = (tuple(o), tuple(s))
    if rng.random() < 0.3:
        bxs.append(rng.choice(bxs))
    return bxs


@pytest.mark.parametrize("pairwise", [None, 1], ids=["as-shipped", "corners-only"])
def test_exact_against_counting_every_element(monkeypatch, pairwise):
    """Random tilings (guillotine cuts: grids and irregular layouts, 1 to 4 dimensions)
    and damaged ones (moved, resized, repeated blocks): the answer is the element
    count's, and a named element really is held by no block or by the two named."""
    if pairwise:  # even 2 blocks go through the corner check
        monkeypatch.setattr(boxes, "PAIRWISE", pairwise)
    rng = random.Random(37)
    answers = {True: 0, False: 0}
    for _ in range(1500):
        shape = tuple(rng.randint(1, 6) for _ in range(rng.randint(1, 4)))
        bxs = _guillotine(rng, shape, rng.randint(1, 25))
        if rng.random() < 0.6:
            bxs = _damaged(rng, bxs)
        rng.shuffle(bxs)
        exact = _coverage_is_exact(shape, bxs)
        got = check_partition(shape, bxs)
        assert (got is None) == exact, (shape, bxs, got)
        answers[exact] += 1
        named = re.search(r"element (\([\d, ]*\))", got or "")
        if named:
            el = ast.literal_eval(named.group(1))
            holders = [b for b in bxs if all(o <= e < o + n for o, n, e in zip(*b, el))]
            assert len(holders) == 0 if got.startswith("no block") else len(holders) >= 2
    assert answers[True] > 300 and answers[False] > 300


def test_messages():
    assert check_partition((4, 4), [((0, 0), (4, 2)), ((0, 2), (4, 2))]) is None
    assert "cover 12 of 16" in check_partition((4, 4), [((0, 0), (4, 2)), ((0, 2), (2, 2))])
    assert "not inside" in check_partition((4, 4), [((0, 0), (4, 2)), ((0, 3), (4, 2))])
    cols = [((0, j), (2, 1)) for j in range(20)]
    assert check_partition((2, 20), cols) is None
    # a block moved onto its neighbour: the element count still matches
    moved = cols[:5] + [((0, 4), (2, 1))] + cols[6:]
    assert check_partition((2, 20), moved) == \
        "blocks at (0, 4) and (0, 4) overlap (at element (0, 4))"
    assert check_partition((2, 20), moved[:3]) == "blocks cover 6 of 40 elements"
    assert check_partition((), [((), ())]) is None
    assert check_partition((3, 0), [((0, 0), (3, 0)), ((0, 0), (3, 0))]) is None  # empty


def _within(fn, *args):
    t = time.process_time()
    out = fn(*args)
    took = time.process_time() - t
    assert took < BOUND, f"{took:.1f} s"
    return out


def test_many_column_blocks_are_checked_in_n_log_n():
    """200,000 blocks splitting dimension 1 (the old sweep compared every pair)."""
    n = 200_000
    assert _within(check_partition, (2, n), hostile_open.columns(n)) is None
    grid = [((i, j), (1, 1)) for i, j in itertools.product(range(400), range(500))]
    assert _within(check_partition, (400, 500), grid) is None
    bad = hostile_open.columns(n)
    bad[n // 2] = ((0, n // 2 + 1), (2, 1))  # a gap and an overlap
    assert "overlap" in _within(check_partition, (2, n), bad)


def test_irregular_layouts_are_checked_or_refused_within_bounds():
    """Random irregular tilings: checked up to 4 dimensions; in 10 dimensions refused as
    too irregular, quickly, instead of checked slowly."""
    shape, bxs = hostile_open.irregular_boxes(4, 20_000)
    assert _within(check_partition, shape, bxs) is None
    shape, bxs = hostile_open.irregular_boxes(10, 20_000)
    assert "too irregularly" in _within(check_partition, shape, bxs)


def test_indexes_of_many_blocks_open_quickly():
    """1,024 column blocks x 20 tensors (24 s before), and the 300 KB hostile index
    (about 2 minutes before)."""
    m = _within(decode_index, hostile_open.index_columns(20, 1024), "pyckpt.index")
    assert m.blocks.tensor_begin[-1] == 20 * 1024
    data = hostile_open.index_sized(300_000)
    assert 250_000 < len(data) < 350_000
    _within(decode_index, data, "pyckpt.index")


def test_index_with_too_irregular_blocks_is_refused():
    """Blocks cutting 10 dimensions irregularly: refused (docs/FORMAT.md, section 7)."""
    shape, bxs = _small_irregular(10, 600)
    with pytest.raises(CorruptCheckpointError, match=r"tensor 't0': .*too irregularly"):
        _within(decode_index, hostile_open.index_of_boxes([shape], [bxs]), "pyckpt.index")


def _small_irregular(dims: int, cuts: int) -> tuple[tuple[int, ...], list]:
    """A guillotine tiling of a (3,) * dims tensor, made by up to ``cuts`` cuts."""
    shape = (3,) * dims
    return shape, _guillotine(random.Random(5), shape, cuts)
