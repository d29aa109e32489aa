"""Checkpoint.snapshot / restore(snapshot) and pyckpt.copy_state (API.md sections 2 and 5)."""

import numpy as np
import pytest

import pyckpt


class Net(pyckpt.Module):
    def __init__(self, seed):
        rng = np.random.default_rng(seed)
        self.w = pyckpt.Variable(rng.standard_normal((64, 32)).astype(np.float32))
        self.b = pyckpt.Variable(rng.standard_normal(32).astype(np.float32))
        self.layers = [pyckpt.Variable(rng.standard_normal((8, 8))) for _ in range(3)]
        self.step = np.zeros((), dtype=np.int64)
        self.t = rng.standard_normal((40, 30)).T  # a strided ndarray leaf


def test_snapshot_is_a_copy_and_restores(tmp_path):
    net = Net(0)
    ckpt = pyckpt.Checkpoint(net=net)
    snap = ckpt.snapshot()
    before = net.w.numpy()
    net.w.assign_add(np.ones_like(before))
    net.t[0, 0] = 123.0
    assert np.array_equal(snap["net/w/.ATTRIBUTES/VARIABLE_VALUE"], before)  # unaffected
    ckpt.restore(snap).assert_consumed()
    np.testing.assert_array_equal(net.w.numpy(), before)
    assert net.t[0, 0] != 123.0
    assert snap.nbytes > 0 and len(snap) == len(snap.keys())


def test_snapshot_arrays_are_read_only_and_reusable():
    net = Net(1)
    ckpt = pyckpt.Checkpoint(net=net)
    first = ckpt.snapshot()
    with pytest.raises(ValueError):
        first["net/b/.ATTRIBUTES/VARIABLE_VALUE"][0] = 1
    buf = first["net/w/.ATTRIBUTES/VARIABLE_VALUE"]
    net.w.assign(np.zeros((64, 32), np.float32))
    second = ckpt.snapshot(into=first)
    assert second["net/w/.ATTRIBUTES/VARIABLE_VALUE"] is buf and not buf.any()


def test_snapshot_restores_into_another_instance_with_deferred_values():
    src = pyckpt.Checkpoint(net=Net(2))
    snap = src.snapshot()
    lazy = pyckpt.Checkpoint(net=pyckpt.Module())
    status = lazy.restore(snap)
    lazy.net.w = pyckpt.Variable(np.zeros((64, 32), np.float32))
    np.testing.assert_array_equal(lazy.net.w.numpy(), src.net.w.numpy())
    with pytest.raises(AssertionError):
        status.assert_consumed()


def test_copy_state_keeps_a_past_copy_of_a_network():
    """The seeds' 'network_B keeps a copy of network_A from some steps ago' case."""
    a, b = Net(3), Net(4)
    pyckpt.copy_state(a, b)
    for va, vb in zip(a.variables, b.variables):
        assert va is not vb
        np.testing.assert_array_equal(va.numpy(), vb.numpy())
    np.testing.assert_array_equal(a.t, b.t)
    a.w.assign_add(np.ones((64, 32), np.float32))
    assert not np.array_equal(a.w.numpy(), b.w.numpy())


def test_copy_state_strict_lists_every_mismatch():
    a, b = Net(5), Net(6)
    b.extra = pyckpt.Variable(1.0)
    b.w = pyckpt.Variable(np.zeros((64, 31), np.float32))
    b_w = b.w.numpy()
    with pytest.raises(ValueError) as ei:
        pyckpt.copy_state(a, b)
    msg = str(ei.value)
    assert "extra" in msg and "w/.ATTRIBUTES" in msg and "(64, 31)" in msg
    np.testing.assert_array_equal(b.w.numpy(), b_w)  # nothing copied
    pyckpt.copy_state(a, b, strict=False)  # skips the mismatches, copies the rest
    np.testing.assert_array_equal(a.b.numpy(), b.b.numpy())


def test_copy_state_between_trees_and_from_snapshot():
    src = {"w": np.arange(6.0).reshape(2, 3), "n": 4, "sub": [np.ones(2)]}
    dst = {"w": np.zeros((2, 3)), "n": 0, "sub": [np.zeros(2)]}
    assert pyckpt.copy_state(src, dst) is dst
    np.testing.assert_array_equal(dst["w"], src["w"])
    assert dst["n"] == 4
    net = Net(7)
    snap = pyckpt.Checkpoint(net=net).snapshot()
    other = pyckpt.Checkpoint(net=Net(8))
    pyckpt.copy_state(snap, other)
    np.testing.assert_array_equal(other.net.w.numpy(), net.w.numpy())


def test_copy_state_treats_the_save_counter_as_restore_does(tmp_path):
    """A snapshot taken before any save has no counter; restore creates one, and a
    later strict copy_state from that snapshot left alone the counter it lacks
    (it raised). A source's counter is copied, created when the destination has none."""
    ck = pyckpt.Checkpoint(w=pyckpt.Variable(np.zeros(3)))
    snap = ck.snapshot()
    ck.restore(snap).assert_consumed()
    ck.save_counter.assign(4)
    ck.w.assign(np.ones(3))
    pyckpt.copy_state(snap, ck)
    np.testing.assert_array_equal(ck.w.numpy(), np.zeros(3))
    assert int(ck.save_counter.numpy()) == 4  # the snapshot has none: left alone

    saved = pyckpt.Checkpoint(w=pyckpt.Variable(np.full(3, 5.0)))
    saved.save(tmp_path / "c")
    saved.save(tmp_path / "c")
    fresh = pyckpt.Checkpoint(w=pyckpt.Variable(np.zeros(3)))
    pyckpt.copy_state(saved, fresh)
    assert int(fresh.save_counter.numpy()) == 2
    np.testing.assert_array_equal(fresh.w.numpy(), np.full(3, 5.0))
    pyckpt.copy_state(saved.snapshot(), pyckpt.Checkpoint(w=pyckpt.Variable(np.zeros(3))))
    with pytest.raises(ValueError, match="extra"):  # other keys are still checked
        fresh.extra = pyckpt.Variable(1.0)
        pyckpt.copy_state(snap, fresh)


def test_copy_state_of_numpy_trees_is_one_batch(monkeypatch):
    """Trees of one structure whose leaves are all numpy arrays (a strided destination
    included) skip the per-value path; a read-only destination, a byte-order or
    object-dtype pair does not, and is reported or handled there as before."""
    from pyckpt.graph import snapshot as snapshot_mod
    from pyckpt.testing.spies import count_calls

    per_value = count_calls(monkeypatch, snapshot_mod, "_sources")
    rng = np.random.default_rng(0)
    src = {"a": [rng.standard_normal((3, 4)) for _ in range(3)], "t": rng.standard_normal((5, 2))}
    dst = {"a": [np.zeros((3, 4)) for _ in range(3)], "t": np.zeros((2, 5)).T}
    pyckpt.copy_state(src, dst)
    assert len(per_value) == 0
    for x, y in zip(src["a"] + [src["t"]], dst["a"] + [dst["t"]]):
        np.testing.assert_array_equal(x, y)
    frozen = np.zeros(2)
    frozen.flags.writeable = False
    with pytest.raises(ValueError, match="read-only"):
        pyckpt.copy_state({"r": np.ones(2)}, {"r": frozen})
    swapped = np.zeros(3, dtype=">f8")
    pyckpt.copy_state({"s": np.arange(3.0)}, {"s": swapped})  # byte order: the per-value way
    np.testing.assert_array_equal(swapped, np.arange(3.0))
    with pytest.raises(TypeError, match="'o': .*Python objects"):  # never copied as bytes
        pyckpt.copy_state({"o": np.array([object()])}, {"o": np.array([None], dtype=object)})
    assert len(per_value) == 3
