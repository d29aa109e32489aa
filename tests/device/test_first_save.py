"""No stall on the first background save (issue 40 item 1): the pinned pool is
prepared in the background (a manager: from its creation; a plain save: from its
first call), and until it is ready a save stages into what is ready (a device
snapshot, else plain host memory), never waiting in the call for the pinning."""

import threading

import numpy as np

import pyckpt
from pyckpt.device.buffers import _SHARED, StagingBuffers
from pyckpt.testing.thread_comm import ThreadGroup
from pyckpt.device.host_memory import touch_threads, touched

from .conftest import layer_state, tensor, values_of

GiB = 1 << 30


def _gated_pinning(engine, monkeypatch):
    """Makes every pinned allocation wait for the returned event (set it once the
    call returned); records the thread of each allocation."""
    gate, threads = threading.Event(), []
    alloc = engine.alloc_host

    def gated(n):
        threads.append(threading.current_thread())
        assert gate.wait(30), "a pinned allocation was waited for in the call"
        return alloc(n)

    monkeypatch.setattr(engine, "alloc_host", gated)
    return gate, threads


def test_first_plain_save_never_waits_for_pinning(fake_device, monkeypatch, tmp_path):
    state = layer_state(5, rows=128, cols=40)
    expected = values_of(state)
    gate, threads = _gated_pinning(fake_device, monkeypatch)
    try:
        h = pyckpt.save(state, tmp_path / "a", blocking=False)
        assert h.staging.route == "plain"  # no device memory for a snapshot: plain memory
        assert h.staging.pinned_bytes == 0 and h.staging.plain_bytes > 0
        for v in state.values():
            v.add_(1.0)
    finally:
        gate.set()
    assert h.wait() == str(tmp_path / "a")
    got = pyckpt.load(tmp_path / "a")
    for k, v in expected.items():
        np.testing.assert_array_equal(got[k], v)
    assert threading.current_thread() not in threads  # pinned on a background thread
    assert threads and _SHARED.pinned_bytes > 0  # the pool is ready once the save ended
    h2 = pyckpt.save(state, tmp_path / "b", blocking=False)
    assert h2.staging.route == "pinned"  # the next save uses it
    h2.wait()
    assert len(threads) == 1


def test_first_manager_save_does_not_join_the_warm_up(fake_device, monkeypatch, tmp_path):
    w = tensor((256, 8), seed=4, key="w")
    gate, threads = _gated_pinning(fake_device, monkeypatch)
    try:
        m = pyckpt.CheckpointManager(pyckpt.Checkpoint(w=w), tmp_path)
        first = w.numpy()
        p1 = m.save(blocking=False)  # the warm-up is still pinning: plain memory
        assert m.last_staging.route == "plain"
        w.add_(1.0)
    finally:
        gate.set()
    m.wait_until_finished()
    np.testing.assert_array_equal(pyckpt.load_variable(p1, "w/.ATTRIBUTES/VARIABLE_VALUE"), first)
    m.save(blocking=False)
    assert m.last_staging.route == "pinned"  # the warm pool, from now on
    m.close()
    assert threading.current_thread() not in threads and len(threads) == 1


def test_first_multi_worker_manager_save_does_not_wait_for_pinning(fake_device, monkeypatch,
                                                                   tmp_path):
    """Two workers (threads): each stages its part in plain memory while its manager's
    pool is pinned in the background, then uses the pool from the next save."""
    gate, threads = _gated_pinning(fake_device, monkeypatch)
    group = ThreadGroup(2)

    def first(comm):
        w = tensor((256, 8), seed=4, key="w")
        m = pyckpt.CheckpointManager(pyckpt.Checkpoint(w=w), tmp_path, comm=comm)
        before = w.numpy()
        path = m.save(blocking=False)  # the warm-up is still pinning: plain memory
        route = m.last_staging.route
        w.add_(1.0)
        return m, path, before, route, threading.current_thread()

    try:
        results = group.run(first)
    finally:
        gate.set()
    for r in results:
        assert not isinstance(r, BaseException), r
    assert [r[3] for r in results] == ["plain", "plain"]

    def second(comm):
        m = results[comm.rank][0]
        m.wait_until_finished()
        m.save(blocking=False)
        route = m.last_staging.route
        m.close()
        return route

    assert group.run(second) == ["pinned", "pinned"]  # the warm pool, from now on
    path, before = results[0][1], results[0][2]
    np.testing.assert_array_equal(pyckpt.load_variable(path, "w/.ATTRIBUTES/VARIABLE_VALUE"),
                                  before)
    assert threads and not {r[4] for r in results} & set(threads)  # pinned in the background


def test_first_save_snapshots_in_device_memory_while_the_pool_is_pinned(fake_device,
                                                                         monkeypatch, tmp_path):
    fake_device.device_free = 64 * GiB
    w = tensor((256, 8), seed=6, key="w")
    gate, threads = _gated_pinning(fake_device, monkeypatch)
    try:
        m = pyckpt.CheckpointManager(pyckpt.Checkpoint(w=w), tmp_path)
        m.save(blocking=False)
        assert m.last_staging.route == "device"  # the drain takes the pool once pinned
    finally:
        gate.set()
    m.close()
    assert threading.current_thread() not in threads


def test_plain_staging_buffers_pin_nothing(fake_device):
    b = StagingBuffers(pinned=False)
    live = [fake_device.array(np.ones(1 << 16, np.float32), "x")]
    out = b.get(["x"], live)
    assert out[0].shape == live[0].shape and fake_device.host_allocs == 0
    assert b.pinned_bytes >= live[0].nbytes
    b.release()
    assert b.pinned_bytes == 0


def test_touched_memory_is_zeroed_in_parallel():
    assert touch_threads(1 << 20) == 1
    assert touch_threads(1 << 40) >= 1
    for n in (0, 1, 4097, (64 << 20) * 3 + 5):
        buf = touched(n)
        assert buf.dtype == np.uint8 and buf.shape == (n,)
        assert not buf.any()
