"""Issue 10 D: targets with non-native (big-endian) byte order.

Checkpoints store little-endian bytes. A target array or Variable whose dtype
is the same type in the other byte order is accepted everywhere a target is
filled, and holds the right values afterwards (byteswapped on the way), its
dtype unchanged. When the types really differ, the message says the byte order.
"""

from __future__ import annotations

import numpy as np
import pytest

import pyckpt

BE = ">f8"


def _be(values, dtype=BE):
    return np.asarray(values).astype(dtype)


def test_restore_into_big_endian_variable(tmp_path):
    v = pyckpt.Variable(np.arange(3, dtype=">f8"))
    ckpt = pyckpt.Checkpoint(v=v)
    path = ckpt.save(tmp_path / "c")
    v.assign(np.array([7.0, 8.0, 9.0]))
    ckpt.restore(path).assert_consumed()
    assert v.dtype == np.dtype(">f8")
    np.testing.assert_array_equal(v.numpy(), [0.0, 1.0, 2.0])


def test_restore_little_endian_checkpoint_into_big_endian_objects(tmp_path):
    path = pyckpt.Checkpoint(v=pyckpt.Variable(np.arange(4, dtype="<i4")),
                             a=np.linspace(0, 1, 5)).save(tmp_path / "c")
    v = pyckpt.Variable(np.zeros(4, ">i4"))
    a = np.zeros(5, ">f8")
    pyckpt.Checkpoint(v=v, a=a).restore(path).assert_consumed()
    assert v.dtype == np.dtype(">i4") and a.dtype == np.dtype(">f8")
    np.testing.assert_array_equal(v.numpy(), np.arange(4))
    np.testing.assert_array_equal(a, np.linspace(0, 1, 5))


def test_deferred_restore_into_big_endian_variable(tmp_path):
    class Net(pyckpt.Module):
        pass

    src = Net()
    src.w = pyckpt.Variable(np.arange(6.0).reshape(2, 3))
    path = pyckpt.Checkpoint(net=src).save(tmp_path / "c")
    dst = Net()
    status = pyckpt.Checkpoint(net=dst).restore(path)
    dst.w = pyckpt.Variable(np.zeros((2, 3), ">f8"))  # restored the moment it is assigned
    status.assert_consumed()
    np.testing.assert_array_equal(dst.w.numpy(), np.arange(6.0).reshape(2, 3))
    assert dst.w.dtype == np.dtype(">f8")


def test_load_into_big_endian_targets(tmp_path):
    path = tmp_path / "c"
    x = np.arange(12, dtype=np.float32).reshape(3, 4)
    pyckpt.save({"x": x, "y": np.arange(5, dtype=np.int64), "s": np.array(["ab", "cde"]),
                 "z": np.arange(3, dtype=np.complex128) * 1j}, path)
    into = {"x": np.zeros((3, 4), ">f4"), "y": np.zeros(5, ">i8"), "s": np.zeros(2, ">U3"),
            "z": np.zeros(3, ">c16")}
    out = pyckpt.load(path, into=into)
    assert out is into
    np.testing.assert_array_equal(into["x"], x)
    np.testing.assert_array_equal(into["y"], np.arange(5))
    assert into["s"].tolist() == ["ab", "cde"]
    np.testing.assert_array_equal(into["z"], np.arange(3) * 1j)
    assert [a.dtype.byteorder for a in into.values()] == [">"] * 4


def test_load_into_non_contiguous_big_endian_target(tmp_path):
    path = tmp_path / "c"
    pyckpt.save({"x": np.arange(4.0)}, path)
    base = np.zeros((4, 2), ">f8")
    pyckpt.load(path, into={"x": base[:, 1]})
    np.testing.assert_array_equal(base[:, 1], np.arange(4.0))
    np.testing.assert_array_equal(base[:, 0], 0)


def test_load_into_big_endian_from_sharded_checkpoint(tmp_path):
    path = tmp_path / "c"
    full = np.arange(24.0).reshape(4, 6)
    pyckpt.save({"w": pyckpt.ShardedArray(full, (4, 6), (0, 0))}, path)
    whole = np.zeros((4, 6), ">f8")
    block = pyckpt.ShardedArray(np.zeros((2, 3), ">f8"), (4, 6), (2, 3))
    pyckpt.load(path, into={"w": whole})
    pyckpt.load(path, into={"w": block})
    np.testing.assert_array_equal(whole, full)
    np.testing.assert_array_equal(block.local, full[2:, 3:])


def test_sharded_array_target_big_endian(tmp_path):
    path = tmp_path / "c"
    pyckpt.save({"w": np.arange(12, dtype=np.int32).reshape(3, 4)}, path)
    block = pyckpt.ShardedArray(np.zeros((2, 2), ">i4"), (3, 4), (1, 2))
    pyckpt.load(path, into={"w": block})
    np.testing.assert_array_equal(block.local, np.arange(12).reshape(3, 4)[1:, 2:])
    assert block.local.dtype == np.dtype(">i4")


def test_save_big_endian_then_load_into_big_endian(tmp_path):
    path = tmp_path / "c"
    pyckpt.save({"x": _be([1.5, -2.0, 3.25])}, path)
    got = pyckpt.load(path)["x"]
    np.testing.assert_array_equal(got, [1.5, -2.0, 3.25])
    into = {"x": np.zeros(3, BE)}
    pyckpt.load(path, into=into)
    np.testing.assert_array_equal(into["x"], [1.5, -2.0, 3.25])


def test_snapshot_round_trip_with_big_endian_variables():
    v = pyckpt.Variable(_be([1.0, 2.0]))
    ckpt = pyckpt.Checkpoint(v=v)
    snap = ckpt.snapshot()
    v.assign([5.0, 6.0])
    ckpt.restore(snap).assert_consumed()
    np.testing.assert_array_equal(v.numpy(), [1.0, 2.0])

    # a snapshot of big-endian values restored into little-endian objects, and back
    w = pyckpt.Variable(np.zeros(2))
    pyckpt.Checkpoint(v=w).restore(snap).assert_consumed()
    np.testing.assert_array_equal(w.numpy(), [1.0, 2.0])
    back = pyckpt.Variable(np.zeros(2, BE))
    pyckpt.Checkpoint(v=back).restore(pyckpt.Checkpoint(v=w).snapshot()).assert_consumed()
    np.testing.assert_array_equal(back.numpy(), [1.0, 2.0])
    assert back.dtype == np.dtype(BE)


@pytest.mark.parametrize("src_order,dst_order", [("<", ">"), (">", "<")])
def test_copy_state_across_byte_orders(src_order, dst_order):
    src = {"a": np.arange(5).astype(src_order + "i8"), "b": [np.linspace(0, 1, 3).astype(src_order + "f4")]}
    dst = {"a": np.zeros(5, dst_order + "i8"), "b": [np.zeros(3, dst_order + "f4")]}
    pyckpt.copy_state(src, dst)
    np.testing.assert_array_equal(dst["a"], np.arange(5))
    np.testing.assert_array_equal(dst["b"][0], np.linspace(0, 1, 3).astype(np.float32))
    assert dst["a"].dtype.byteorder == (dst_order if dst_order == ">" else "=")

    class M(pyckpt.Module):
        pass

    m1, m2 = M(), M()
    m1.v = pyckpt.Variable(np.arange(3).astype(src_order + "f8"))
    m2.v = pyckpt.Variable(np.zeros(3, dst_order + "f8"))
    pyckpt.copy_state(m1, m2)
    np.testing.assert_array_equal(m2.v.numpy(), np.arange(3.0))


def test_mismatch_message_names_byte_order(tmp_path):
    path = tmp_path / "c"
    pyckpt.save({"x": np.arange(3.0), "y": np.arange(2.0)}, path)
    y = _be([9.0, 9.0])  # fine on its own, but nothing is filled when any key fails
    with pytest.raises(ValueError) as info:
        pyckpt.load(path, into={"x": np.zeros(3, ">f4"), "y": y})
    msg = str(info.value)
    assert "float64" in msg and "float32" in msg and "big-endian" in msg, msg
    assert "'y'" not in msg, msg
    np.testing.assert_array_equal(y, 9.0)

    v = pyckpt.Variable(np.zeros(3, ">i8"))
    with pytest.raises(ValueError) as info:
        pyckpt.Checkpoint(x=v).restore(pyckpt.Checkpoint(x=pyckpt.Variable(np.arange(3.0))).save(
            tmp_path / "d"))
    msg = str(info.value)
    assert "float64" in msg and "int64" in msg and "big-endian" in msg, msg
    np.testing.assert_array_equal(v.numpy(), 0)
