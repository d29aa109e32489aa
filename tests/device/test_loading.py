"""Loads into values in device memory: verified reads into bounce buffers, then
host-to-device copies that land late and out of order."""

import numpy as np
import pytest

import pyckpt
from pyckpt.device import loading

from .conftest import FakeTensor, tensor


def _saved(tmp_path, n=8):
    state = {f"p{i}": np.random.default_rng(i).standard_normal((50, 7 + i)).astype(np.float32)
             for i in range(n)}
    state["step"] = 7
    pyckpt.save(state, tmp_path / "c")
    return state


def test_load_into_device_values_in_place(fake_device, tmp_path):
    state = _saved(tmp_path)
    into = {k: FakeTensor(np.zeros_like(v)) for k, v in state.items() if k != "step"}
    buffers = {k: t._data for k, t in into.items()}
    out = pyckpt.load(tmp_path / "c", into=into)
    assert out is into
    for k, t in into.items():
        assert t._data is buffers[k]  # same storage
        np.testing.assert_array_equal(t._data, state[k])
    h2d = [e for e in fake_device.log if e[1] == "h2d" and e[0] == "land"]
    assert len(h2d) == len(into)


def test_batches_overlap_reads_with_copies(fake_device, tmp_path, monkeypatch):
    monkeypatch.setattr(loading, "BATCH_BYTES", 4096)  # many small batches
    state = _saved(tmp_path, n=20)
    into = {k: FakeTensor(np.zeros_like(v)) for k, v in state.items() if k != "step"}
    pyckpt.load(tmp_path / "c", into=into)
    for k, t in into.items():
        np.testing.assert_array_equal(t._data, state[k])
    events = [e[0] for e in fake_device.log if e[1] == "h2d"]
    first_land = events.index("land")
    assert events[first_land:].count("issue") > 0  # later batches issued while earlier fly


def test_device_load_without_target(fake_device, tmp_path):
    state = _saved(tmp_path)
    got = pyckpt.load(tmp_path / "c", device="fake:0")
    assert got["step"] == 7 and isinstance(got["step"], int)
    for k, v in state.items():
        if k != "step":
            assert isinstance(got[k], FakeTensor)
            np.testing.assert_array_equal(got[k]._data, v)


def test_device_argument_errors(fake_device, tmp_path):
    _saved(tmp_path)
    with pytest.raises(ValueError, match="device='nowhere:3'"):
        pyckpt.load(tmp_path / "c", device="nowhere:3")
    with pytest.raises(ValueError, match="into="):
        pyckpt.load(tmp_path / "c", into={}, device="fake:0")
    with pytest.raises(ValueError, match="mmap"):
        pyckpt.load(tmp_path / "c", into={"p0": np.zeros((50, 7), np.float32)}, mmap=True)


def test_failed_upload_raises(fake_device, tmp_path):
    state = _saved(tmp_path)
    into = {k: FakeTensor(np.zeros_like(v), key=k) for k, v in state.items() if k != "step"}
    fake_device.fail_on("p2")
    with pytest.raises(RuntimeError, match="p2"):
        pyckpt.load(tmp_path / "c", into=into)


def test_corrupt_data_is_caught_before_reaching_the_device(fake_device, tmp_path):
    state = _saved(tmp_path, n=2)
    import glob
    import os
    data = [f for f in glob.glob(str(tmp_path / "c" / "*")) if not f.endswith(".json")]
    big = max(data, key=os.path.getsize)
    with open(big, "r+b") as f:
        f.seek(8)
        b = f.read(1)
        f.seek(8)
        f.write(bytes([b[0] ^ 0xFF]))
    into = {k: FakeTensor(np.zeros_like(v)) for k, v in state.items() if k != "step"}
    with pytest.raises(pyckpt.CorruptCheckpointError):
        pyckpt.load(tmp_path / "c", into=into)


def test_restore_graph_into_device_values(fake_device, tmp_path):
    w = tensor((30, 4), seed=1, key="w")
    pyckpt.Checkpoint(w=w).write(tmp_path / "g")
    fresh = FakeTensor(np.zeros((30, 4), np.float32))
    status = pyckpt.Checkpoint(w=fresh).restore(tmp_path / "g")
    status.assert_consumed()
    np.testing.assert_array_equal(fresh._data, w._data)
    with pytest.raises(ValueError, match="shape"):
        pyckpt.Checkpoint(w=FakeTensor(np.zeros((3, 4), np.float32))).restore(tmp_path / "g")


def test_strict_load_into(tmp_path):
    state = _saved(tmp_path, n=3)
    part = {"p0": np.zeros_like(state["p0"])}
    pyckpt.load(tmp_path / "c", into=part)  # default: the layout of into decides
    with pytest.raises(pyckpt.CheckpointKeyError, match="'p1'"):
        pyckpt.load(tmp_path / "c", into={"p0": np.zeros_like(state["p0"])}, strict=True)
    full = {k: (np.zeros_like(v) if k != "step" else 0) for k, v in state.items()}
    pyckpt.load(tmp_path / "c", into=full, strict=True)
    assert full["step"] == 7
