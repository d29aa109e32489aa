"""Arrays pyckpt cannot store or fill faithfully are refused, naming the key: targets
whose elements share memory (each would take the last value written), masked arrays
(their mask would be lost)."""

import numpy as np
import pytest

import pyckpt
from pyckpt.device.copies import unwritable


def _overlapping(shape=(3, 4)):
    base = np.zeros(shape[-1])
    return np.lib.stride_tricks.as_strided(base, shape, (0, base.itemsize), writeable=True)


def test_unwritable_tells_overlap_from_strided_views():
    a = np.zeros((4, 8))
    for fine in (a, a.T, a[:, ::2], a[::-1], a[:, None, :], np.zeros((0, 3)), np.zeros(())):
        assert unwritable(fine) is None, fine.strides
    assert unwritable(np.broadcast_to(np.zeros(4), (3, 4))) == "read-only"
    assert "overlapping" in unwritable(_overlapping())
    rows = np.lib.stride_tricks.as_strided(a, (3, 4), (8, 8), writeable=True)  # rows overlap
    assert "possibly overlapping" in unwritable(rows)
    for fine in (np.zeros((2, 3))[:, ::2], np.zeros((8, 10))[:, ::3], a[::2, ::3], a.T[::2],
                 np.lib.stride_tricks.as_strided(np.zeros(16), (2, 2), (16, 24))):
        assert unwritable(fine) is None, fine.strides  # strided views that do not overlap


def test_overlapping_targets_are_refused_before_anything_is_filled(tmp_path):
    pyckpt.save({"a": np.arange(12.0).reshape(3, 4), "b": np.ones(2)}, tmp_path / "c")
    into = {"a": _overlapping(), "b": np.zeros(2)}
    with pytest.raises(ValueError, match="'a': target array is overlapping"):
        pyckpt.load(tmp_path / "c", into=into)
    np.testing.assert_array_equal(into["b"], np.zeros(2))
    dst = {"a": _overlapping(), "b": np.zeros(2)}
    with pytest.raises(ValueError, match="'a': destination array is overlapping"):
        pyckpt.copy_state({"a": np.arange(12.0).reshape(3, 4), "b": np.ones(2)}, dst)
    np.testing.assert_array_equal(dst["b"], np.zeros(2))


def test_an_overlapping_graph_value_is_refused_by_restore(tmp_path):
    net = pyckpt.Module()
    net.w = np.arange(12.0).reshape(3, 4)
    pyckpt.Checkpoint(net=net).write(tmp_path / "c")
    other = pyckpt.Module()
    other.w = _overlapping()
    with pytest.raises(ValueError, match="net/w.*overlapping"):
        pyckpt.Checkpoint(net=other).restore(tmp_path / "c")


def test_masked_arrays_are_refused_naming_the_key(tmp_path):
    masked = np.ma.array([1.0, 2.0, 3.0], mask=[0, 1, 0])
    with pytest.raises(TypeError, match="'m/x': a numpy masked array"):
        pyckpt.save({"m": {"x": masked}}, tmp_path / "c")
    assert not (tmp_path / "c").exists()
    net = pyckpt.Module()
    net.sd = {"x": masked}
    with pytest.raises(TypeError, match="'net.sd.x': a numpy masked array"):
        pyckpt.Checkpoint(net=net).write(tmp_path / "g")
    pyckpt.save({"x": np.ones(3)}, tmp_path / "c")
    with pytest.raises(TypeError, match="'x': a numpy masked array"):
        pyckpt.load(tmp_path / "c", into={"x": masked})
    plain = np.ones(3).view(np.matrix)  # other ndarray subclasses are stored as their values
    pyckpt.save({"x": plain}, tmp_path / "d")
    np.testing.assert_array_equal(pyckpt.load(tmp_path / "d")["x"], np.ones((1, 3)))
