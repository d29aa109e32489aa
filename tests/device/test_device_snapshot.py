"""Background saves that snapshot the state in spare device memory (issue 40 item 2,
pyckpt/device/snapshot.py): the call returns after device-to-device copies, the
snapshot drains through the pinned buffers (or ring) in the background, with a copy
engine whose copies land late and out of order (pyckpt.testing.late_copies)."""

import os

import numpy as np
import pytest

import pyckpt
from pyckpt import AsyncOptions, CheckpointManagerOptions
from pyckpt.device.snapshot import (MARGIN_BYTES, DeviceSnapshot, device_need,
                                    snapshot_memory_kept)

from .conftest import tensor

MiB = 1 << 20
GiB = 1 << 30


def _state(n=6, seed=0):
    s = {f"layer{i}/w": tensor((64, 32 + i), seed=seed + i, key=f"layer{i}/w") for i in range(n)}
    s["host/step"] = np.arange(7, dtype=np.int64)  # a host value among them
    return s


def _values(state):
    return {k: (v.numpy() if hasattr(v, "numpy") else v.copy()) for k, v in state.items()}


def _change(state):
    for k, v in state.items():
        if hasattr(v, "add_"):
            v.add_(1.0)
        else:
            v += 1


def _assert_loads(path, expected):
    got = pyckpt.load(path)
    assert sorted(got) == sorted(expected)
    for k, v in expected.items():
        np.testing.assert_array_equal(got[k], v, err_msg=k)


def _device_bytes(state):
    return sum(v._data.nbytes for v in state.values() if hasattr(v, "_data"))


def _events(engine, what, direction):
    return [i for i, e in enumerate(engine.log) if e[0] == what and e[1] == direction]


def test_caller_returns_before_any_copy_to_the_host(fake_device, tmp_path):
    fake_device.device_free = 64 * GiB
    state = _state()
    expected = _values(state)
    fake_device.pause()  # no copy lands until resumed: the call must not wait for one
    try:
        h = pyckpt.save(state, tmp_path / "c", blocking=False)
        assert h.staging.route == "device"
        assert not _events(fake_device, "issue", "d2h")  # the drain has not begun
        assert not _events(fake_device, "alloc", "pinned")  # nothing pinned in the call
        assert _events(fake_device, "issue", "d2d")
        _change(state)  # the next training step, right after the call
    finally:
        fake_device.resume()
    assert h.wait() == str(tmp_path / "c")
    _assert_loads(tmp_path / "c", expected)
    # the drain copied out of the snapshot only after its copies landed
    assert max(_events(fake_device, "land", "d2d")) < min(_events(fake_device, "issue", "d2h"))
    assert h.staging.device_bytes >= _device_bytes(state)
    assert h.staging.pinned_bytes >= _device_bytes(state)  # the drain's pinned buffers
    assert h.staging.blocked_seconds >= 0


def test_saves_in_a_row_hold_the_values_of_their_call(fake_device, tmp_path):
    fake_device.device_free = 64 * GiB
    state = _state(seed=3)
    expected, handles = [], []
    for step in range(3):
        expected.append(_values(state))
        handles.append(pyckpt.save(state, tmp_path / f"c{step}", blocking=False))
        _change(state)
    for step, h in enumerate(handles):
        _assert_loads(h.wait(), expected[step])
        assert h.staging.route == "device"
    assert fake_device.device_allocs == 1  # one device buffer, reused by every save
    assert snapshot_memory_kept() >= _device_bytes(state)
    pyckpt.device.release_staging_memory()
    assert snapshot_memory_kept() == 0


def test_second_save_waits_until_the_first_snapshot_left_the_device(fake_device, tmp_path):
    fake_device.device_free = 64 * GiB
    state = _state(4)
    n = len([v for v in state.values() if hasattr(v, "_data")])
    a = pyckpt.save(state, tmp_path / "a", blocking=False)
    b = pyckpt.save(state, tmp_path / "b", blocking=False)
    a.wait(), b.wait()
    d2d, d2h = _events(fake_device, "issue", "d2d"), _events(fake_device, "land", "d2h")
    assert len(d2d) == 2 * n and len(d2h) == 2 * n
    # the second snapshot overwrote the device buffer only after the first drained it
    assert d2d[n] > d2h[n - 1]


def test_no_snapshot_when_free_device_memory_is_short(fake_device, tmp_path):
    state = _state()
    need = sum((v._data.nbytes + 255) // 256 * 256 for v in state.values() if hasattr(v, "_data"))
    fake_device.device_total = 8 * GiB  # the margin: max(2 GiB, 10% of it) = 2 GiB
    fake_device.device_free = need + MARGIN_BYTES - 1  # below the safety margin
    expected = _values(state)
    h = pyckpt.save(state, tmp_path / "c", blocking=False)
    assert h.staging.route in ("plain", "pinned")
    assert fake_device.device_allocs == 0 and not _events(fake_device, "issue", "d2d")
    _assert_loads(h.wait(), expected)
    fake_device.device_free = need + 2 * MARGIN_BYTES  # now it fits
    h = pyckpt.save(state, tmp_path / "d", blocking=False)
    assert h.staging.route == "device"
    h.wait()


@pytest.mark.parametrize("budget,route", [(0, "host-staged"), (1 << 10, "host-staged"),
                                          (64 * MiB, "device")])
def test_an_explicit_budget_decides(fake_device, tmp_path, budget, route):
    fake_device.device_free = 64 * GiB
    state = _state()
    h = pyckpt.save(state, tmp_path / "c", blocking=False, max_device_snapshot_bytes=budget)
    assert (h.staging.route == "device") == (route == "device")
    h.wait()


def test_budget_is_checked():
    with pytest.raises(ValueError, match="max_device_snapshot_bytes"):
        DeviceSnapshot(-1)
    with pytest.raises(ValueError, match="max_device_snapshot_bytes"):
        AsyncOptions(max_device_snapshot_bytes=1.5)


def test_snapshot_through_a_pinned_ring(fake_device, tmp_path):
    fake_device.device_free = 64 * GiB
    state = {f"big{i}": tensor((512, 600), seed=i, key=f"big{i}") for i in range(8)}
    expected = _values(state)
    budget = 4 * MiB
    h = pyckpt.save(state, tmp_path / "c", blocking=False, max_pinned_bytes=budget)
    assert h.staging.route == "device"
    _change(state)
    _assert_loads(h.wait(), expected)
    assert 0 < h.staging.pinned_bytes <= budget


def test_failed_drain_is_raised_by_wait_and_the_next_save_works(fake_device, tmp_path):
    fake_device.device_free = 64 * GiB
    state = _state()
    fake_device.fail_on("layer2/w")
    h = pyckpt.save(state, tmp_path / "c", blocking=False)
    with pytest.raises(RuntimeError, match="layer2/w"):
        h.wait()
    assert pyckpt.latest_checkpoint(tmp_path) is None
    assert not (tmp_path / "c").exists() or os.listdir(tmp_path / "c") == []
    fake_device.failing.clear()
    expected = _values(state)
    _assert_loads(pyckpt.save(state, tmp_path / "d", blocking=False).wait(), expected)


def test_manager_snapshots_reports_and_frees_on_close(fake_device, tmp_path):
    fake_device.device_free = 64 * GiB
    w = tensor((256, 8), seed=4, key="w")
    opts = CheckpointManagerOptions(async_options=AsyncOptions(max_device_snapshot_bytes=None))
    m = pyckpt.CheckpointManager(pyckpt.Checkpoint(w=w), tmp_path, options=opts)
    first = w.numpy()
    p1 = m.save(blocking=False)
    w.add_(5.0)
    report = m.last_staging
    assert report.route == "device" and report.device_bytes >= w._data.nbytes
    assert report.blocked_seconds > 0
    m.save(blocking=False)
    m.wait_until_finished()
    np.testing.assert_array_equal(pyckpt.load_variable(p1, "w/.ATTRIBUTES/VARIABLE_VALUE"), first)
    assert fake_device.device_allocs == 1
    assert m._keeper.background.snapshot.device_bytes > 0
    m.close()
    assert m._keeper.background.snapshot.device_bytes == 0


def test_manager_with_snapshots_off_stages_in_the_call(fake_device, tmp_path):
    fake_device.device_free = 64 * GiB
    w = tensor((256, 8), seed=5, key="w")
    opts = CheckpointManagerOptions(async_options=AsyncOptions(max_device_snapshot_bytes=0))
    m = pyckpt.CheckpointManager(pyckpt.Checkpoint(w=w), tmp_path, options=opts)
    m._keeper.background.ready()
    m.save(blocking=False)
    assert m.last_staging.route == "pinned" and m.last_staging.device_bytes == 0
    m.close()
    assert fake_device.device_allocs == 0


def test_snapshot_buffers_follow_the_layout(fake_device):
    snap = DeviceSnapshot()
    a = [fake_device.array(np.ones(1000, np.float32), "a")]
    b = [fake_device.array(np.ones(3000, np.float32), "b")]
    snap.hold()
    try:
        assert snap.prepare(a, device_need(a)) and snap.prepare(a, device_need(a))
        assert fake_device.device_allocs == 1
        assert snap.prepare(b, device_need(b)) and fake_device.device_allocs == 2  # re-fitted
        values, tickets = snap.take(b)
        for t in tickets:
            t.wait()
        np.testing.assert_array_equal(values[0].obj, np.ones(3000, np.float32))
    finally:
        snap.unhold()
    snap.release()
    assert snap.device_bytes == 0


def test_an_engine_without_device_snapshots_never_takes_the_route(fake_device, tmp_path):
    """An engine that reports no device memory (CopyEngine's default: (0, 0), as JAX's)
    is never asked for device buffers, whatever the budget: its saves stage on the host
    without trying (and failing) an allocation first."""
    fake_device.device_free = None  # device_memory() -> (0, 0)
    h = pyckpt.save(_state(), tmp_path / "c", blocking=False,
                    max_device_snapshot_bytes=64 * MiB)
    assert h.staging.route != "device" and fake_device.device_allocs == 0
    h.wait()
