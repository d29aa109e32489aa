"""Saves of values in device memory, through a copy engine whose copies land late
and out of order (pyckpt.testing.late_copies)."""

import os

import numpy as np
import pytest

import pyckpt
from pyckpt.device.buffers import _SHARED, StagingBuffers
from pyckpt.device.staging import stage_values

from .conftest import layer_state, tensor
from .conftest import values_of as _expect


def _state(n=12, seed=0):
    return layer_state(n, seed)


def test_blocking_save_of_device_values(fake_device, tmp_path):
    state = _state()
    mixed = dict(state, host=np.arange(10.0))
    pyckpt.save(mixed, tmp_path / "c")
    exp = _expect(state)
    exp["host"] = np.arange(10.0)
    got = pyckpt.load(tmp_path / "c")
    np.testing.assert_array_equal(got["host"], exp.pop("host"))
    for k, v in exp.items():
        np.testing.assert_array_equal(got[k], v)
    issued = [e for e in fake_device.log if e[0] == "issue"]
    landed = [e for e in fake_device.log if e[0] == "land"]
    assert len(issued) == len(landed) == len(state)  # every device value copied once
    assert [e[2] for e in landed] != [e[2] for e in issued]  # and out of order


@pytest.mark.parametrize("where", ["local", "memory"])
def test_async_save_holds_the_values_of_the_call(fake_device, tmp_path, where):
    state = _state(6)
    base = str(tmp_path) if where == "local" else f"memory://dev-{os.getpid()}-{id(tmp_path)}"
    expected, handles = [], []
    for step in range(3):
        expected.append(_expect(state))
        handles.append(pyckpt.save(state, f"{base}/ckpt-{step}", blocking=False))
        for t in state.values():  # changed on the "device" right after the call
            t.add_(1.0)
    for step, h in enumerate(handles):
        path = h.wait()
        got = pyckpt.load(path)
        for k, v in expected[step].items():
            np.testing.assert_array_equal(got[k], v)


def test_staging_buffers_are_allocated_once_and_bounded(fake_device, tmp_path):
    state = _state(8)
    for i in range(3):
        pyckpt.save(state, tmp_path / f"c{i}", blocking=False).wait()
    assert fake_device.host_allocs == 1  # pinned once, reused by every later save
    nbytes = sum(v._data.nbytes for v in state.values())
    assert nbytes <= _SHARED.pinned_bytes <= nbytes + 256 * len(state)
    pyckpt.device.release_staging_memory()
    assert _SHARED.pinned_bytes == 0


def test_failed_copy_raises_and_commits_nothing(fake_device, tmp_path):
    state = _state(5)
    fake_device.fail_on("layer3/w")
    with pytest.raises(RuntimeError, match="injected copy failure of 'layer3/w'"):
        pyckpt.save(state, tmp_path / "c")
    assert pyckpt.latest_checkpoint(tmp_path) is None
    assert os.listdir(tmp_path / "c") == []


def test_failed_copy_in_async_save_is_raised_by_the_call(fake_device, tmp_path):
    state = _state(4)
    fake_device.fail_on("layer1/w")
    with pytest.raises(RuntimeError, match="layer1/w"):
        pyckpt.save(state, tmp_path / "c", blocking=False)
    assert os.listdir(tmp_path / "c") == []


def test_stage_values_marks_in_writer_order_only_after_landing(fake_device):
    live = [fake_device.array(np.full(1000, float(i)), f"v{i}") for i in range(10)]
    staging = [np.zeros(1000) for _ in live]
    order = [3, 1, 4, 0, 5, 9, 2, 6, 8, 7]
    marked = []

    def mark(i):
        assert (staging[i] == i).all(), f"value {i} marked before its copy landed"
        marked.append(i)

    stage_values(live, staging, order=order, mark=mark)
    assert marked == order


def test_checkpoint_and_manager_with_device_values(fake_device, tmp_path):
    w = tensor((128, 16), seed=3, key="w")
    ck = pyckpt.Checkpoint(w=w)
    m = pyckpt.CheckpointManager(ck, tmp_path, max_to_keep=2)
    first = w.numpy()
    p1 = m.save(blocking=False)
    w.add_(5.0)
    p2 = m.save()
    m.wait_until_finished()
    np.testing.assert_array_equal(pyckpt.load_variable(p1, "w/.ATTRIBUTES/VARIABLE_VALUE"), first)
    np.testing.assert_array_equal(pyckpt.load_variable(p2, "w/.ATTRIBUTES/VARIABLE_VALUE"), first + 5)
    m.close()


def test_stage_values_waits_for_every_copy_before_raising(fake_device):
    live = [fake_device.array(np.full(100, float(i)), f"x{i}") for i in range(6)]
    staging = [np.zeros(100) for _ in live]
    fake_device.fail_on("x0")
    with pytest.raises(RuntimeError, match="x0"):
        stage_values(live, staging)
    lands = [e for e in fake_device.log if e[0] == "land"]
    assert len(lands) == 6  # nothing still writes into the staging buffers


def test_staging_buffers_get_reuses_and_shrinks(fake_device):
    b = StagingBuffers()
    big = [fake_device.array(np.zeros(1 << 20, np.uint8), "big")]
    small = [fake_device.array(np.zeros(10, np.uint8), "small")]
    first = b.get(["k"], big)[0]
    assert b.get(["k"], big)[0].ctypes.data == first.ctypes.data
    assert fake_device.host_allocs == 1
    b.get(["k"], small)  # within the slack: kept
    assert fake_device.host_allocs == 1
    b.release()
    assert b.pinned_bytes == 0


def test_manager_pins_its_buffers_at_creation_and_frees_them_on_close(fake_device, tmp_path):
    w = tensor((256, 8), seed=4, key="w")
    m = pyckpt.CheckpointManager(pyckpt.Checkpoint(w=w), tmp_path)
    m._keeper.background.ready()
    assert fake_device.host_allocs == 1  # before any save
    assert m._keeper.background.buffers.pinned_bytes >= w._data.nbytes
    m.save(blocking=False)
    m.save(blocking=False)
    m.wait_until_finished()
    assert fake_device.host_allocs == 1  # the warm buffers served both saves
    m.close()
    assert m._keeper.background.buffers.pinned_bytes == 0
