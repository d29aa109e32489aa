"""``max_pinned_bytes``: device values staged through a ring of pinned memory smaller
than the state (pyckpt/device/ring.py), with a copy engine whose copies land late
and out of order (pyckpt.testing.late_copies)."""

import os

import numpy as np
import pytest

import pyckpt
from pyckpt.device.buffers import _SHARED

from .conftest import tensor

MiB = 1 << 20
BIG = (512, 600)  # 1.17 MiB of float32: staged through the ring (>= one 1 MiB chunk)


def _state(n_big=10, n_small=5, seed=0):
    s = {f"big{i}": tensor(BIG, seed=seed + i, key=f"big{i}") for i in range(n_big)}
    s.update({f"small{i}": tensor((64, 33 + i), seed=seed + 100 + i, key=f"small{i}")
              for i in range(n_small)})
    return s


def _values(state):
    return {k: v.numpy() for k, v in state.items()}


def _pinned_sizes(engine, monkeypatch):
    sizes = []
    alloc = engine.alloc_host

    def recording(n):
        sizes.append(int(n))
        return alloc(n)

    monkeypatch.setattr(engine, "alloc_host", recording)
    return sizes


def _assert_loads(path, expected):
    got = pyckpt.load(path)
    assert sorted(got) == sorted(expected)
    for k, v in expected.items():
        np.testing.assert_array_equal(got[k], v, err_msg=k)


@pytest.mark.parametrize("blocking", [True, False])
def test_ring_smaller_than_the_state_saves_every_value(fake_device, monkeypatch, tmp_path,
                                                       blocking):
    state = _state()
    expected = _values(state)
    total = sum(v.nbytes for v in expected.values())
    budget = 4 * MiB
    sizes = _pinned_sizes(fake_device, monkeypatch)
    out = pyckpt.save(state, tmp_path / "c", blocking=blocking, max_pinned_bytes=budget)
    if not blocking:
        for v in state.values():  # the call returned: every value left the device
            v.add_(1.0)
        assert out.wait() == str(tmp_path / "c")
    _assert_loads(tmp_path / "c", expected)
    assert total > 2 * budget
    assert sizes and sum(sizes) <= budget  # the ring plus the small values' buffer
    assert _SHARED.pinned_bytes <= budget


def test_ring_slots_are_reused_only_after_their_value_was_written(fake_device, tmp_path):
    # many values through a ring of two slots: a slot overwritten before its value was
    # written would put the next value's bytes in the file (a wrong value, good CRCs)
    state = {f"v{i}": tensor(BIG, seed=i, key=f"v{i}") for i in range(24)}
    expected = _values(state)
    slot = (BIG[0] * BIG[1] * 4 + 255) // 256 * 256
    pyckpt.save(state, tmp_path / "c", max_pinned_bytes=2 * slot)
    _assert_loads(tmp_path / "c", expected)


def test_budget_smaller_than_a_value_names_it(fake_device, tmp_path):
    state = _state()
    with pytest.raises(ValueError, match=r"max_pinned_bytes=1048576 is too small.*'big\d'"):
        pyckpt.save(state, tmp_path / "c", max_pinned_bytes=MiB)
    assert not os.path.exists(tmp_path / "c")


@pytest.mark.parametrize("bad", [0, -5, 1.5, True, "1GB"])
def test_budget_must_be_a_positive_int(fake_device, tmp_path, bad):
    with pytest.raises(ValueError, match="max_pinned_bytes must be a positive int"):
        pyckpt.save(_state(2, 1), tmp_path / "c", max_pinned_bytes=bad)


def test_budget_on_a_store_that_needs_the_whole_state_raises(fake_device):
    with pytest.raises(ValueError, match="stages the whole state"):
        pyckpt.save(_state(2, 1), "memory://budget/c", max_pinned_bytes=8 * MiB)


def test_failed_copy_in_the_ring_commits_nothing(fake_device, tmp_path):
    state = _state()
    fake_device.fail_on("big6")
    with pytest.raises(RuntimeError, match="injected copy failure of 'big6'"):
        pyckpt.save(state, tmp_path / "c", max_pinned_bytes=4 * MiB)
    assert not os.path.exists(tmp_path / "c") or not any(
        n.startswith("index") for n in os.listdir(tmp_path / "c"))


def test_manager_async_saves_within_the_budget_reuse_one_ring(fake_device, monkeypatch,
                                                             tmp_path):
    state = _state()
    sizes = _pinned_sizes(fake_device, monkeypatch)
    ckpt = pyckpt.Checkpoint(state=state)
    budget = 4 * MiB
    mgr = pyckpt.CheckpointManager(ckpt, tmp_path / "run", max_to_keep=2,
                                   max_pinned_bytes=budget)
    try:
        for step in range(6):
            expected = _values(state)  # as of the last save
            mgr.save(checkpoint_number=step, blocking=False)
            for v in state.values():
                v.add_(1.0)
        mgr.wait_until_finished()
        assert sum(sizes) <= budget and len(sizes) <= 2  # allocated once, then reused
    finally:
        mgr.close()
    fresh = {k: tensor(v.shape, seed=99) for k, v in expected.items()}
    pyckpt.Checkpoint(state=fresh).restore(mgr.latest_checkpoint).assert_consumed()
    for k, v in expected.items():
        np.testing.assert_array_equal(fresh[k].numpy(), v, err_msg=k)


def test_a_slot_is_refilled_only_after_its_last_value_was_written():
    # the ring protocol on its own: every copy into a slot is issued after the
    # writers said that each earlier value overlapping that slot was written
    from pyckpt.device.ring import stage_ring
    from pyckpt.testing.late_copies import LateCopyEngine

    eng = LateCopyEngine(delay=0.0, seed=3)
    sizes = [300_000, 700_000, 120_000, 900_000, 50_000, 640_000, 333_333, 800_000] * 3
    live = [eng.array(np.full(n, i % 250, np.uint8), f"v{i}") for i, n in enumerate(sizes)]
    ring = np.zeros(2_000_000, np.uint8)
    base = ring.__array_interface__["data"][0]
    events, spans, landed = [], {}, {}
    issue = eng.to_host

    def to_host(srcs, dsts):
        for s, d in zip(srcs, dsts):
            i = int(eng.key_of(s)[1:])
            b = d.__array_interface__["data"][0] - base
            spans[i] = (b, b + d.nbytes)
            events.append(("issue", i))
        return issue(srcs, dsts)

    eng.to_host = to_host

    def mark(i, slot):
        landed[i] = slot.copy()  # what the writers would write now
        events.append(("mark", i))

    def written(i):
        events.append(("written", i))

    order = list(range(len(live)))
    stage_ring(live, order, {eng: ring}, mark=mark, written=written)
    for i in order:
        np.testing.assert_array_equal(landed[i], np.full(sizes[i], i % 250, np.uint8))
    pos = {e: k for k, e in enumerate(events)}
    for i in order:
        for j in range(i):
            (b1, e1), (b2, e2) = spans[i], spans[j]
            if b1 < e2 and b2 < e1:  # i reuses memory of j
                assert pos[("written", j)] < pos[("issue", i)], (i, j)
                assert pos[("mark", j)] < pos[("written", j)]
    assert sum(1 for e in events if e[0] == "written") >= len(order) - 4  # it wrapped


def test_a_value_spanning_many_pieces_across_files_does_not_stall_the_ring(fake_device,
                                                                           tmp_path):
    # one value of many slices next to many small ones in other files, through a ring
    # that holds the big one and only a few others: the writers must reach the big
    # value's last slice without waiting for values still outside the ring (they do
    # when each value's slices are written in a row; they did not when the files
    # took turns slice by slice: the save hung)
    import threading

    state = {"big": tensor((15 << 20,), seed=1, key="big")}  # 60 MiB: 8 slices
    state.update({f"v{i:03d}": tensor(BIG, seed=10 + i, key=f"v{i:03d}") for i in range(110)})
    expected = _values(state)
    done: list = []

    def save() -> None:
        try:
            pyckpt.save(state, tmp_path / "c", max_pinned_bytes=66 * MiB)
            done.append(None)
        except BaseException as e:  # noqa: BLE001 - reported below
            done.append(e)

    t = threading.Thread(target=save, daemon=True)
    t.start()
    t.join(60)
    assert done, "the save through the ring did not finish within 60 s"
    assert done[0] is None, done[0]
    assert len([n for n in os.listdir(tmp_path / "c") if n.startswith("data-")]) > 1
    _assert_loads(tmp_path / "c", expected)


def test_budget_counts_buffers_left_by_an_earlier_full_save(fake_device, tmp_path):
    # the process-wide staging buffers of a save without a budget are re-fitted: the
    # next save with one holds no more pinned memory than its budget
    state = _state()
    pyckpt.save(state, tmp_path / "full")
    assert _SHARED.pinned_bytes > 4 * MiB
    pyckpt.save(state, tmp_path / "ring", max_pinned_bytes=4 * MiB)
    assert 0 < _SHARED.pinned_bytes <= 4 * MiB
    _assert_loads(tmp_path / "ring", _values(state))
