"""Kept walks of device values (issue 40 item 4): the engine check of a batch is done
once per kept walk, not per call. ``snapshot()`` / ``snapshot(into=)`` of a kept walk
whose values are DeviceArrays of one engine hand the batch to the engine without
``copy_values``' check (``Walk.engine``, found once), as ``engine.batch`` lists made
once (the walk's values while it holds, the snapshot's buffers, shared by snapshots
taken ``into=`` one another) and copied by ``engine.copy_batches``;
``restore(snapshot)`` of buffers into the same kept walk skips its shape, dtype and
engine checks after the first call (``Walk.fit``), and checks again for any other
buffers. The match a restore through a kept walk records is made when asked for."""

from __future__ import annotations

import numpy as np
import pytest

import pyckpt
from pyckpt import registry
from pyckpt.device.array import DeviceArray
from pyckpt.device.engine import HostCopyEngine
from pyckpt.graph import restore as restore_mod
from pyckpt.graph import snapshot as snapshot_mod
from pyckpt.graph import walk_cache
from pyckpt.testing.spies import count_calls


class _Engine(HostCopyEngine):
    def __init__(self):
        super().__init__()
        self.copies = 0

    def copy(self, srcs, dsts):
        self.copies += 1
        super().copy(srcs, dsts)


class Box:
    """A device value: its DeviceArray is its target."""

    def __init__(self, eng, arr):
        self.d = DeviceArray(arr, arr.shape, arr.dtype, "host", eng)


def _target(o):
    return o.d if isinstance(o, Box) else None


@pytest.fixture
def eng(monkeypatch):
    monkeypatch.setattr(registry, "_ADAPTERS", list(registry._ADAPTERS))
    registry.register_adapter("test.devbox", leaf=_target, target=_target,
                              stamp=lambda objs: [id(o.d) for o in objs]
                              if all(isinstance(o, Box) for o in objs) else None)
    yield _Engine()
    walk_cache.forget_all()


def _state(eng, seed, n=5):
    rng = np.random.default_rng(seed)
    return {f"b{i}": Box(eng, rng.standard_normal((i + 1, 2)).astype(np.float32))
            for i in range(n)}


def test_snapshots_of_a_kept_walk_check_the_engine_once(eng, monkeypatch):
    ckpt = pyckpt.Checkpoint(state=_state(eng, 0))
    checks = count_calls(monkeypatch, walk_cache, "one_engine")
    routed = count_calls(monkeypatch, snapshot_mod, "copy_values")
    ckpt.snapshot()
    snap = ckpt.snapshot()
    snap2 = ckpt.snapshot(into=snap)
    snap3 = ckpt.snapshot()
    assert len(checks) == 1 and routed == [] and eng.copies == 4
    for s in (snap2, snap3):
        for i in range(5):
            np.testing.assert_array_equal(s[f"state/b{i}/.ATTRIBUTES/VARIABLE_VALUE"],
                                          ckpt.state[f"b{i}"].d.obj)


def test_restore_of_the_same_snapshot_checks_its_pairs_once(eng, monkeypatch):
    src = pyckpt.Checkpoint(state=_state(eng, 0))
    dst = pyckpt.Checkpoint(state=_state(eng, 1))
    snap = src.snapshot()
    checks = count_calls(monkeypatch, restore_mod, "one_engine")
    dst.restore(snap)  # walks dst, keeps the walk, checks the pairs
    dst.restore(snap)
    for b in dst.state.values():
        b.d.obj[...] = 7
    dst.restore(snap).assert_consumed()
    assert len(checks) == 1  # the first restore of snap
    for i in range(5):
        np.testing.assert_array_equal(dst.state[f"b{i}"].d.obj, src.state[f"b{i}"].d.obj)
    other = src.snapshot()
    dst.restore(other)
    assert len(checks) == 2  # another snapshot: checked
    dst.state["b2"] = Box(eng, np.zeros((9, 9), np.float32))  # a new value: a new walk
    with pytest.raises(ValueError, match="b2"):
        dst.restore(snap)


class _BatchingEngine(_Engine):
    """Counts the batches it prepares and the batched copies it runs."""

    def __init__(self):
        super().__init__()
        self.made = []
        self.batched = 0

    def batch(self, arrays):
        b = super().batch(arrays)
        self.made.append(b)
        return b

    def copy_batches(self, srcs, dsts):
        self.batched += 1
        assert all(map(lambda a, b: a.shape == b.shape, srcs.arrays, dsts.arrays))
        super().copy_batches(srcs, dsts)


@pytest.fixture
def beng(eng):
    return _BatchingEngine()


def test_each_batch_is_prepared_once_while_unchanged(beng):
    src = pyckpt.Checkpoint(state=_state(beng, 0))
    dst = pyckpt.Checkpoint(state=_state(beng, 1))
    snap = src.snapshot()  # the walk's values and the new buffers: two batches
    assert len(beng.made) == 2
    for step in range(3):
        for b in src.state.values():
            b.d.obj[...] = step
        snap = src.snapshot(into=snap)  # the same buffers: their batch again
        dst.restore(snap)  # the first time: dst's walk and the pairs checked
        for i in range(5):
            np.testing.assert_array_equal(dst.state[f"b{i}"].d.obj, step)
    # dst's walk: one batch, made at the first restore (its pairs checked once: the
    # snapshots taken into= one another share their buffers' batch)
    assert len(beng.made) == 3 and beng.batched == 1 + 3 + 3 and beng.copies == 7


def test_a_replaced_array_gets_a_new_batch_and_the_copy(beng):
    src = pyckpt.Checkpoint(state=_state(beng, 0))
    dst = pyckpt.Checkpoint(state=_state(beng, 1))
    snap = src.snapshot()
    dst.restore(snap)
    dst.restore(snap)
    old = dst.state["b3"].d
    new = np.zeros_like(old.obj)
    dst.state["b3"].d = DeviceArray(new, new.shape, new.dtype, "host", beng)  # new stamp
    made = len(beng.made)
    dst.restore(snap).assert_consumed()
    np.testing.assert_array_equal(new, src.state["b3"].d.obj)  # the new array written
    assert len(beng.made) > made  # the new walk's batch


def test_a_kept_restore_reports_its_match_when_asked(beng):
    src = pyckpt.Checkpoint(state=_state(beng, 0))
    dst = pyckpt.Checkpoint(state=_state(beng, 1))
    snap = src.snapshot()
    dst.restore(snap)
    status = dst.restore(snap)  # through the kept walk: the match made when asked
    status.assert_consumed().assert_existing_objects_matched()
    with pytest.raises(AssertionError):
        pyckpt.Checkpoint(state=_state(beng, 1), extra=_state(beng, 2)).restore(
            snap).assert_existing_objects_matched()
    session = restore_mod.RestoreSession.__new__(restore_mod.RestoreSession)
    assert not hasattr(session, "matched") and not hasattr(session, "anything")


class _Sched:
    """An object saved through its state dict: a device value and a host number."""

    def __init__(self, eng):
        self.lr = 0.1
        self.t = Box(eng, np.arange(3.0))

    def state_dict(self):
        return {"lr": self.lr, "t": self.t}

    def load_state_dict(self, state):
        self.lr = state["lr"]


def test_device_values_and_host_numbers_are_copied_each_in_one_batch(beng, monkeypatch):
    """A kept walk of a graph with a state node (device values, a host number): its
    Split copies the device values by the engine's batch and the host numbers in
    one host copy, never value by value; ``into=`` refills the same buffers."""
    src = pyckpt.Checkpoint(state=_state(beng, 0), sched=_Sched(beng))
    routed = count_calls(monkeypatch, snapshot_mod, "copy_values")
    src.snapshot()  # walks, keeps: through the walk's Split already
    snap = src.snapshot()  # new buffers
    src.sched.lr = 0.2
    for b in src.state.values():
        b.d.obj[...] = 3.0
    snap2 = src.snapshot(into=snap)
    assert routed == []  # never value by value
    assert [id(a) for a in snap2.arrays.values()] == [id(a) for a in snap.arrays.values()]
    assert float(snap2["sched/lr/.ATTRIBUTES/VARIABLE_VALUE"]) == 0.2
    np.testing.assert_array_equal(snap2["sched/t/.ATTRIBUTES/VARIABLE_VALUE"], np.arange(3.0))
    for i in range(5):
        np.testing.assert_array_equal(snap2[f"state/b{i}/.ATTRIBUTES/VARIABLE_VALUE"], 3.0)
    assert not snap2.arrays["sched/lr/.ATTRIBUTES/VARIABLE_VALUE"].flags.writeable


class _Held:
    """An object saved through its state dict, holding one device value."""

    def __init__(self, eng, v):
        self.t = Box(eng, np.full(3, v))
        self.loaded = None

    def state_dict(self):
        return {"t": self.t}

    def load_state_dict(self, state):
        self.loaded = state


def test_a_state_dict_restored_from_a_snapshot_gets_new_arrays_on_the_device(eng, monkeypatch,
                                                                            tmp_path):
    """restore(snapshot) of a state node: its framework arrays held in device memory
    come back as new arrays on the device (``engine.clones``), never through host
    memory and never the snapshot's own buffers; from a file, through the adapter's
    ``from_host``."""
    registry._ADAPTERS.insert(0, registry.Adapter("devbox", leaf=_target, target=_target,
                                                  from_host=lambda a: ("host", a)))
    registry.touch()
    snap = pyckpt.Checkpoint(s=_Held(eng, 1.0)).snapshot()
    buf = snap.arrays["s/t/.ATTRIBUTES/VARIABLE_VALUE"]
    to_host = count_calls(monkeypatch, eng, "to_host")
    dst = _Held(eng, 0.0)
    pyckpt.Checkpoint(s=dst).restore(snap).assert_consumed()
    got = dst.loaded["t"]
    assert isinstance(got, np.ndarray) and not np.shares_memory(got, buf.obj)
    np.testing.assert_array_equal(got, 1.0)
    assert to_host == []
    path = str(tmp_path / "c")
    pyckpt.Checkpoint(s=_Held(eng, 2.0)).write(path)
    pyckpt.Checkpoint(s=dst).restore(path)
    kind, arr = dst.loaded["t"]
    assert kind == "host"
    np.testing.assert_array_equal(arr, 2.0)
