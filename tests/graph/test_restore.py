"""Object-based restore: matching by edges, deferred and partial restore, LoadStatus."""

import gc
import weakref

import numpy as np
import pytest

import pyckpt
from pyckpt.graph import deferred


class Dense(pyckpt.Module):
    def __init__(self, units):
        self.units = units
        self.kernel = None
        self.bias = None

    def build(self, d, seed=0):
        rng = np.random.default_rng(seed)
        self.kernel = pyckpt.Variable(rng.standard_normal((d, self.units)))
        self.bias = pyckpt.Variable(rng.standard_normal(self.units))


class Net(pyckpt.Module):
    def __init__(self):
        self.l1 = Dense(3)
        self.l2 = Dense(2)


def saved_net(tmp_path, seed=0):
    net = Net()
    net.l1.build(4, seed)
    net.l2.build(3, seed + 1)
    path = pyckpt.Checkpoint(net=net).save(tmp_path / f"ckpt{seed}")
    return net, path


def test_full_restore_into_a_fresh_model(tmp_path):
    net, path = saved_net(tmp_path)
    fresh = Net()
    fresh.l1.build(4, 99)
    fresh.l2.build(3, 98)
    ckpt = pyckpt.Checkpoint(net=fresh)
    status = ckpt.restore(path)
    assert status.assert_consumed() is status
    status.assert_existing_objects_matched().assert_nontrivial_match()
    np.testing.assert_array_equal(fresh.l2.kernel.numpy(), net.l2.kernel.numpy())
    assert int(ckpt.save_counter) == 1


def test_partial_restore_through_stand_in_checkpoints_and_deferred_kernel(tmp_path):
    net, path = saved_net(tmp_path)
    bias = pyckpt.Variable(np.zeros(3))
    stand_in = pyckpt.Checkpoint(net=pyckpt.Checkpoint(l1=pyckpt.Checkpoint(bias=bias)))
    status = stand_in.restore(path)
    np.testing.assert_array_equal(bias.numpy(), net.l1.bias.numpy())
    status.assert_existing_objects_matched()
    with pytest.raises(AssertionError, match="net/l1/kernel"):
        status.assert_consumed()
    assert "net/l1/kernel/.ATTRIBUTES/VARIABLE_VALUE" in status.unmatched_checkpoint_keys()
    # restore-on-create: the kernel gets its value the moment it is assigned
    stand_in.net.l1.kernel = pyckpt.Variable(np.zeros((4, 3)))
    np.testing.assert_array_equal(stand_in.net.l1.kernel.numpy(), net.l1.kernel.numpy())
    assert "net/l1/kernel/.ATTRIBUTES/VARIABLE_VALUE" not in status.unmatched_checkpoint_keys()


def test_lazily_built_layers_restore_when_built(tmp_path):
    net, path = saved_net(tmp_path)
    lazy = Net()  # no variables yet
    status = pyckpt.Checkpoint(net=lazy).restore(path)
    status.assert_existing_objects_matched()  # nothing exists yet, so nothing unmatched
    with pytest.raises(AssertionError):
        status.assert_consumed()
    lazy.l1.build(4, 123)
    lazy.l2.build(3, 456)
    status.assert_consumed()
    np.testing.assert_array_equal(lazy.l1.kernel.numpy(), net.l1.kernel.numpy())
    assert deferred.pending(lazy.l1) == {}  # freed once consumed


def test_name_based_vs_object_based(tmp_path):
    """Variable names play no part: a second instance with other names restores."""
    net, path = saved_net(tmp_path)
    other = Net()
    ck = pyckpt.Checkpoint(net=other)
    ck.restore(path)
    other.l1.kernel = pyckpt.Variable(np.zeros((4, 3)), name="totally_different")
    other.l1.bias = pyckpt.Variable(np.zeros(3), name="also_different")
    np.testing.assert_array_equal(other.l1.kernel.numpy(), net.l1.kernel.numpy())
    assert other.l1.kernel.name == "totally_different"


def test_shared_variable_in_list_and_dict_restores_through_dict_path(tmp_path):
    v = pyckpt.Variable(np.arange(3.0))
    root = pyckpt.Checkpoint()
    root.d = {"shared": v}
    root.items = [v]
    root.write(tmp_path / "c")
    keys = [k for k, _ in pyckpt.list_variables(tmp_path / "c")]
    assert keys == ["d/shared/.ATTRIBUTES/VARIABLE_VALUE"]
    target = pyckpt.Variable(np.zeros(3))
    other = pyckpt.Checkpoint()
    other.d = {"shared": target}
    other.items = [target]
    other.read(tmp_path / "c").assert_consumed()
    np.testing.assert_array_equal(target.numpy(), np.arange(3.0))


def test_list_assigned_empty_and_appended_later(tmp_path):
    root = pyckpt.Checkpoint()
    root.layers = [pyckpt.Variable(1.0), pyckpt.Variable(2.0)]
    root.table = {"x": pyckpt.Variable(5.0)}
    root.write(tmp_path / "c")
    other = pyckpt.Checkpoint()
    other.layers = []
    other.table = {}
    status = other.read(tmp_path / "c")
    other.layers.append(pyckpt.Variable(0.0))
    other.layers.append(pyckpt.Variable(0.0))
    other.table["x"] = pyckpt.Variable(0.0)
    assert [float(v) for v in other.layers] == [1.0, 2.0] and float(other.table["x"]) == 5.0
    status.assert_consumed()


def test_deferred_restore_into_ndarray_attribute(tmp_path):
    root = pyckpt.Checkpoint()
    root.state = np.arange(5)
    root.write(tmp_path / "c")
    other = pyckpt.Checkpoint()
    other.read(tmp_path / "c")
    arr = np.zeros(5, dtype=np.int64)
    other.state = arr
    np.testing.assert_array_equal(arr, np.arange(5))


def test_ensembles_do_not_overwrite_each_other(tmp_path):
    nets, paths = [], []
    for seed in range(3):
        n, p = saved_net(tmp_path, seed=10 * seed)
        nets.append(n)
        paths.append(p)
    members = [Net() for _ in range(3)]
    for m, p in zip(members, paths):
        pyckpt.Checkpoint(net=m).restore(p)
    for m in members:
        m.l1.build(4, 7)
        m.l2.build(3, 7)
    for m, n in zip(members, nets):
        np.testing.assert_array_equal(m.l1.kernel.numpy(), n.l1.kernel.numpy())
        np.testing.assert_array_equal(m.l2.bias.numpy(), n.l2.bias.numpy())
    assert not np.array_equal(members[0].l1.kernel.numpy(), members[1].l1.kernel.numpy())


def test_restore_flat_checkpoint_uses_split_keys_as_graph(tmp_path):
    pyckpt.save({"net": {"l1": {"kernel": np.ones((4, 3)), "bias": np.full(3, 2.0)}}}, tmp_path / "flat")
    net = Net()
    status = pyckpt.Checkpoint(net=net).read(tmp_path / "flat")
    net.l1.build(4)
    np.testing.assert_array_equal(net.l1.kernel.numpy(), np.ones((4, 3)))
    np.testing.assert_array_equal(net.l1.bias.numpy(), np.full(3, 2.0))
    with pytest.raises(AssertionError, match="net.l2"):  # l2 has no values in the checkpoint
        net.l2.build(3)
        status.assert_existing_objects_matched()


def test_shape_and_dtype_mismatch_name_the_key(tmp_path):
    net, path = saved_net(tmp_path)
    wrong = Net()
    wrong.l1.kernel = pyckpt.Variable(np.zeros((5, 3)))
    with pytest.raises(ValueError, match=r"net/l1/kernel.*\(4, 3\).*\(5, 3\)"):
        pyckpt.Checkpoint(net=wrong).restore(path)
    lazy = Net()
    pyckpt.Checkpoint(net=lazy).restore(path)
    with pytest.raises(ValueError, match=r"net/l1/bias.*float64.*float32"):
        lazy.l1.bias = pyckpt.Variable(np.zeros(3, np.float32))


def test_restore_none_gives_failing_assertions():
    status = pyckpt.Checkpoint(v=pyckpt.Variable(1.0)).restore(None)
    for check in (status.assert_consumed, status.assert_existing_objects_matched,
                  status.assert_nontrivial_match):
        with pytest.raises(AssertionError):
            check()
    assert status.expect_partial() is status


def test_read_neither_creates_nor_restores_save_counter(tmp_path):
    src = pyckpt.Checkpoint(v=pyckpt.Variable(3.0))
    path = src.save(tmp_path / "c")
    dst = pyckpt.Checkpoint(v=pyckpt.Variable(0.0))
    dst.read(path).assert_consumed()  # save_counter key does not count
    assert "_save_counter" not in dst.__dict__
    dst.save_counter.assign(7)
    dst.read(path).assert_consumed()
    assert int(dst.save_counter) == 7
    dst.restore(path).assert_consumed()
    assert int(dst.save_counter) == 1


def test_nontrivial_match_fails_when_only_the_counter_matches(tmp_path):
    path = pyckpt.Checkpoint(a=pyckpt.Variable(1.0)).save(tmp_path / "c")
    status = pyckpt.Checkpoint(b=pyckpt.Variable(1.0)).restore(path)
    with pytest.raises(AssertionError, match="nothing besides the save counter"):
        status.assert_nontrivial_match()
    assert status.unmatched_objects() == ["b"]
    assert status.unmatched_checkpoint_keys() == ["a/.ATTRIBUTES/VARIABLE_VALUE"]


def test_pending_restores_hold_no_tensor_data_and_die_with_their_object(tmp_path):
    root = pyckpt.Checkpoint()
    root.big = np.ones(2_000_000)
    root.write(tmp_path / "c")
    holder = pyckpt.Checkpoint()
    status = holder.read(tmp_path / "c")
    session = status._session
    assert not any(isinstance(v, np.ndarray) and v.nbytes > 1_000_000
                   for v in vars(session).values())
    assert "big" in deferred.pending(holder)
    ref = weakref.ref(holder)
    del holder, status, session
    gc.collect()
    assert ref() is None


def test_newest_restore_wins_for_pending_values(tmp_path):
    a = pyckpt.Checkpoint(v=pyckpt.Variable(1.0))
    pa = a.save(tmp_path / "a")
    a.v.assign(2.0)
    pb = a.save(tmp_path / "b")
    lazy = pyckpt.Checkpoint()
    lazy.restore(pa)
    lazy.restore(pb)
    lazy.v = pyckpt.Variable(0.0)
    assert float(lazy.v) == 2.0


def test_restore_directory_resolves_latest(tmp_path):
    ck = pyckpt.Checkpoint(v=pyckpt.Variable(1.0))
    ck.save(tmp_path / "ckpt")
    ck.v.assign(5.0)
    ck.save(tmp_path / "ckpt")
    other = pyckpt.Checkpoint(v=pyckpt.Variable(0.0))
    other.restore(tmp_path).assert_consumed()
    assert float(other.v) == 5.0 and int(other.save_counter) == 2


def test_every_way_of_growing_a_tracked_container_restores_what_is_pending(tmp_path):
    """A growing slice assignment and ``dict |=`` went around restore-on-create."""
    V = pyckpt.Variable
    path = pyckpt.Checkpoint(l=[V(1.0), V(2.0), V(3.0)], d={"a": V(5.0)}).write(tmp_path / "c")
    ck = pyckpt.Checkpoint(l=[], d={})
    status = ck.restore(path)
    ck.l[0:0] = [V(0.0), V(0.0)]
    ck.d |= {"a": V(0.0)}
    assert [float(v) for v in ck.l] == [1.0, 2.0] and float(ck.d["a"]) == 5.0
    ck.l[2:] = [V(0.0)]  # an element lands on index 2: it takes what index 2 held
    assert [float(v) for v in ck.l] == [1.0, 2.0, 3.0]
    status.assert_consumed()


def test_an_object_reached_under_two_stored_values_keeps_the_first_and_warns(tmp_path):
    """Two stored values restored into one shared object were both read into it (in
    parallel: either could win) without a word; TensorFlow warns of this too."""
    V = pyckpt.Variable
    a, b = pyckpt.Module(), pyckpt.Module()
    a.v, b.v = V(1.0), V(2.0)
    path = pyckpt.Checkpoint(a=a, b=b).write(tmp_path / "c")
    shared = V(0.0)
    a2, b2 = pyckpt.Module(), pyckpt.Module()
    a2.v = b2.v = shared
    with pytest.warns(RuntimeWarning, match="'a/v/.* and 'b/v/.*it keeps the first"):
        status = pyckpt.Checkpoint(a=a2, b=b2).restore(path)
    assert float(shared) == 1.0
    with pytest.raises(AssertionError, match="b/v/.ATTRIBUTES/VARIABLE_VALUE"):
        status.assert_consumed()
    plan = pyckpt.Checkpoint(a=a2, b=b2).restore_plan(path)  # the plan says the same
    assert not plan.ok and plan.unmatched_checkpoint_keys == ["b/v/.ATTRIBUTES/VARIABLE_VALUE"]
    assert [k for k, _ in plan.restore] == ["a/v/.ATTRIBUTES/VARIABLE_VALUE"]
    # an element restored once, put again where a value is pending, is such an object
    path = pyckpt.Checkpoint(l=[V(1.0), V(2.0)]).write(tmp_path / "l")
    ck = pyckpt.Checkpoint(l=[])
    ck.restore(path)
    ck.l.append(V(0.0))
    with pytest.warns(RuntimeWarning, match="'l/0/.* and 'l/1/"):
        ck.l.append(ck.l[0])
    assert float(ck.l[1]) == 1.0


def test_moving_restored_elements_leaves_pending_values_pending(tmp_path):
    """Elements that an insert moved onto an index whose value was pending took that
    value (or, once restored, consumed it with a warning): only new elements take one."""
    V = pyckpt.Variable
    path = pyckpt.Checkpoint(l=[V(1.0), V(2.0), V(3.0)]).write(tmp_path / "c")
    ck = pyckpt.Checkpoint(l=[])
    status = ck.restore(path)
    ck.l.append(V(0.0))
    ck.l.insert(0, V(0.0))  # the restored element moves to index 1, still pending
    ck.l.sort(key=float)
    assert sorted(float(v) for v in ck.l) == [0.0, 1.0]
    ck.l[1:] = [V(0.0), V(0.0)]  # new elements at indices 1 and 2 take their values
    assert [float(v) for v in ck.l[1:]] == [2.0, 3.0]
    assert status.unmatched_checkpoint_keys() == []  # every stored value restored once


def test_a_deferred_restore_that_does_not_fit_stays_pending(tmp_path):
    """A failed restore-on-create (wrong shape) dropped the pending value: a fitting
    value assigned afterwards kept its own values without a word."""
    path = pyckpt.Checkpoint(x=pyckpt.Variable(np.full(3, 4.0))).write(tmp_path / "c")
    ck = pyckpt.Checkpoint()
    status = ck.restore(path)
    with pytest.raises(ValueError, match=r"shape \(3,\).*shape \(2,\)"):
        ck.x = pyckpt.Variable(np.zeros(2))
    ck.x = pyckpt.Variable(np.zeros(3))
    np.testing.assert_array_equal(ck.x.numpy(), np.full(3, 4.0))
    status.assert_consumed()
    path = pyckpt.Checkpoint(sub={"w": pyckpt.Variable(np.full(3, 4.0))}).write(tmp_path / "d")
    ck = pyckpt.Checkpoint()
    status = ck.restore(path)
    with pytest.raises(ValueError, match=r"sub/w"):
        ck.sub = {"w": np.zeros(2)}  # a subtree: its container node was kept as matched
    ck.sub = {"w": np.zeros(3)}
    np.testing.assert_array_equal(ck.sub["w"], np.full(3, 4.0))
    status.assert_consumed()
