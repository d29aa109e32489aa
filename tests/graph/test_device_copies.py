"""In-memory copies stay on the device (issue 12, item 6): copy_state, snapshot() and
restore(snapshot) copy device values device to device; snapshot buffers live on the
source's device, or in pinned host memory with ``host=True``; torch modules and
optimizers are accepted wherever a Trackable is.

Without a GPU, a small fake tensor type plays the device values: its registry hooks
return DeviceArrays of a ``LateCopyEngine`` (copies between host and "device" land
late and out of order; every copy is logged).
"""

import gc

import numpy as np
import pytest

import pyckpt
from pyckpt import registry
from pyckpt.device.array import DeviceArray
from pyckpt.device.engine import HostCopyEngine
from pyckpt.graph.snapshot import take_snapshot
from pyckpt.testing.late_copies import LateCopyEngine

V = "/.ATTRIBUTES/VARIABLE_VALUE"


class FakeTensor:
    """A tensor in the memory of a fake device (``data``, moved by ``engine``)."""

    def __init__(self, data, engine, name):
        self.data = np.array(data, order="C")
        self.engine = engine
        self.name = name

    def numpy(self):
        return self.data


def _as_device(obj):
    if not isinstance(obj, FakeTensor):
        return None
    if isinstance(obj.engine, LateCopyEngine):
        return obj.engine.array(obj.data, obj.name)
    return DeviceArray(obj.data, obj.data.shape, obj.data.dtype, "fake:0", obj.engine)


@pytest.fixture
def fakedev():
    saved = list(registry._ADAPTERS)
    registry.register_adapter("fakedev", leaf=_as_device, target=_as_device)
    yield
    registry._ADAPTERS[:] = saved


@pytest.fixture
def eng():
    return LateCopyEngine(delay=0.01)


def _dirs(engine, *what):
    return [e for e in engine.log if e[1] in what]


class Net(pyckpt.Module):
    def __init__(self, engine, seed, shape=(16, 8)):
        rng = np.random.default_rng(seed)
        self.w = FakeTensor(rng.standard_normal(shape).astype(np.float32), engine, f"w{seed}")
        self.b = FakeTensor(rng.standard_normal(shape[1]).astype(np.float32), engine, f"b{seed}")
        self.step = pyckpt.Variable(np.int64(seed))  # a host value next to the device ones


# -- copy_state --------------------------------------------------------------------------

def test_copy_state_device_to_device_in_one_batch(fakedev, eng):
    a, b = Net(eng, 1), Net(eng, 2)
    w_buf, b_buf = b.w.data, b.b.data
    assert pyckpt.copy_state(a, b) is b
    np.testing.assert_array_equal(b.w.data, a.w.data)
    np.testing.assert_array_equal(b.b.data, a.b.data)
    assert int(b.step) == 1
    assert b.w.data is w_buf and b.b.data is b_buf  # filled in place, never replaced
    assert not _dirs(eng, "d2h", "h2d")  # nothing crossed to the host
    assert sorted(k for _, d, k in eng.log if d == "d2d") == ["b2", "w2"]


@pytest.mark.parametrize("engine", [HostCopyEngine(), LateCopyEngine(delay=0.0)],
                         ids=["host-engine", "late-engine"])
def test_copy_state_between_trees_of_device_values(fakedev, engine):
    src = {"w": FakeTensor(np.arange(6.0).reshape(2, 3), engine, "sw"),
           "n": [FakeTensor(np.ones(4, np.int32), engine, "sn")]}
    dst = {"w": FakeTensor(np.zeros((2, 3)), engine, "dw"),
           "n": [FakeTensor(np.zeros(4, np.int32), engine, "dn")]}
    keep = dst["w"].data
    pyckpt.copy_state(src, dst)
    assert dst["w"].data is keep
    np.testing.assert_array_equal(dst["w"].data, src["w"].data)
    np.testing.assert_array_equal(dst["n"][0].data, 1)


def test_copy_state_host_to_device_and_back(fakedev, eng):
    big_endian = np.arange(5, dtype=">f8")
    src = {"w": np.arange(12, dtype=np.float32).reshape(3, 4),
           "t": np.arange(12.0).reshape(4, 3).T,            # strided source
           "be": big_endian}                                 # other byte order
    dst = {k: FakeTensor(np.zeros(v.shape, v.dtype.newbyteorder("=")), eng, k)
           for k, v in src.items()}
    pyckpt.copy_state(src, dst)
    for k in src:
        np.testing.assert_array_equal(dst[k].data, src[k])
    assert sorted(k for _, d, k in _dirs(eng, "h2d") if _ == "land") == ["be", "t", "w"]
    assert not _dirs(eng, "d2h", "d2d")

    # device to host: a contiguous target directly, a strided and a big-endian one
    # through a host bounce, and an immutable scalar leaf replaced in its list
    eng.log.clear()
    dev = {"w": FakeTensor(np.full((3, 4), 7, np.float32), eng, "w"),
           "t": FakeTensor(np.full((3, 4), 2.0), eng, "t"),
           "be": FakeTensor(np.full(5, 3.0), eng, "be"),
           "s": [FakeTensor(np.array(9, np.int64), eng, "s")]}
    host = {"w": np.zeros((3, 4), np.float32), "t": np.zeros((4, 3)).T,
            "be": np.zeros(5, ">f8"), "s": [0]}
    pyckpt.copy_state(dev, host)
    np.testing.assert_array_equal(host["w"], 7)
    np.testing.assert_array_equal(host["t"], 2.0)
    np.testing.assert_array_equal(host["be"], 3.0)
    assert host["be"].dtype == np.dtype(">f8")
    assert host["s"] == [9] and type(host["s"][0]) is int
    assert not _dirs(eng, "h2d", "d2d")


def test_copy_state_across_engines_goes_through_the_host(fakedev):
    e1, e2 = LateCopyEngine(delay=0.0, seed=1), LateCopyEngine(delay=0.0, seed=2)
    src = {"x": FakeTensor(np.arange(4.0), e1, "x")}
    dst = {"x": FakeTensor(np.zeros(4), e2, "y")}
    pyckpt.copy_state(src, dst)
    np.testing.assert_array_equal(dst["x"].data, np.arange(4.0))
    assert [d for _, d, _ in e1.log] == ["d2h", "d2h"] and [d for _, d, _ in e2.log] == ["h2d"] * 2


def test_copy_state_strict_lists_device_mismatches_before_copying(fakedev, eng):
    a, b = Net(eng, 3), Net(eng, 4, shape=(16, 9))
    b.extra = FakeTensor(np.zeros(2), eng, "extra")
    before = b.w.data.copy()
    with pytest.raises(ValueError) as ei:
        pyckpt.copy_state(a, b)
    msg = str(ei.value)
    assert "extra" + V in msg and "(16, 9)" in msg and "b" + V in msg, msg
    np.testing.assert_array_equal(b.w.data, before)
    assert eng.log == []  # nothing was copied
    pyckpt.copy_state(a, b, strict=False)  # the mismatches skipped, the rest copied
    np.testing.assert_array_equal(b.step.numpy(), a.step.numpy())
    assert [k for _, _, k in eng.log] == []  # w and b mismatch in shape: skipped


def test_copy_state_copy_failure_is_raised_after_every_copy_landed(fakedev, eng):
    src = {"a": np.ones(3), "b": np.ones(3)}
    dst = {"a": FakeTensor(np.zeros(3), eng, "a"), "b": FakeTensor(np.zeros(3), eng, "b")}
    eng.fail_on("a")
    with pytest.raises(RuntimeError, match="injected"):
        pyckpt.copy_state(src, dst)
    assert sum(1 for w, _, _ in eng.log if w == "land") == 2


def test_copy_state_runs_the_finish_of_host_copy_targets():
    """A target hook that fills a host copy and copies it back in ``finish`` (how
    tensors of devices without a copy engine are loaded): copy_state must run the
    finish, never leave the values in the temporary."""

    class Remote:
        def __init__(self, v):
            self.v = np.array(v, dtype=np.float64)

    def target(o):
        if not isinstance(o, Remote):
            return None
        tmp = o.v.copy()

        def finish():
            o.v[...] = tmp

        return tmp, finish

    saved = list(registry._ADAPTERS)
    registry.register_adapter("remote", leaf=lambda o: o.v.copy() if isinstance(o, Remote)
                              else None, target=target)
    try:
        class M(pyckpt.Module):
            pass

        a, b = M(), M()
        a.x, b.x = Remote([1.0, 2.0]), Remote([0.0, 0.0])
        pyckpt.copy_state(a, b)
        np.testing.assert_array_equal(b.x.v, [1.0, 2.0])
        dst = {"x": Remote([0.0, 0.0])}
        pyckpt.copy_state({"x": np.array([3.0, 4.0])}, dst)
        np.testing.assert_array_equal(dst["x"].v, [3.0, 4.0])
    finally:
        registry._ADAPTERS[:] = saved


# -- snapshots -----------------------------------------------------------------------------

def test_snapshot_keeps_device_values_on_their_device(fakedev, eng):
    net = Net(eng, 5)
    ckpt = pyckpt.Checkpoint(net=net)
    snap = ckpt.snapshot()
    key = "net/w" + V
    buf = snap.arrays[key]
    assert isinstance(buf, DeviceArray) and buf.engine is eng and buf.device == "late:0"
    assert snap[key] is buf.obj  # the framework object (here the fake device's array)
    assert isinstance(snap.arrays["net/step" + V], np.ndarray)
    assert snap.device_nbytes == net.w.data.nbytes + net.b.data.nbytes
    assert not _dirs(eng, "d2h", "h2d")

    before = net.w.data.copy()
    w_buf = net.w.data
    net.w.data[...] = -1
    net.step.assign(99)
    np.testing.assert_array_equal(snap[key], before)  # a copy, unaffected
    eng.log.clear()
    ckpt.restore(snap).assert_consumed()
    assert net.w.data is w_buf
    np.testing.assert_array_equal(net.w.data, before)
    assert int(net.step) == 5
    assert not _dirs(eng, "d2h", "h2d") and len(_dirs(eng, "d2d")) == 2


def test_snapshot_reuses_device_buffers_with_into(fakedev, eng):
    net = Net(eng, 6)
    ckpt = pyckpt.Checkpoint(net=net)
    first = ckpt.snapshot()
    bufs = {k: v for k, v in first.arrays.items()}
    net.w.data[...] = 0
    second = ckpt.snapshot(into=first)
    for k, v in second.arrays.items():
        assert v is bufs[k]
    assert not second["net/w" + V].any()
    # a changed shape gets a new buffer, the others stay
    net.b = FakeTensor(np.ones(3, np.float32), eng, "b-new")
    third = ckpt.snapshot(into=second)
    assert third.arrays["net/w" + V] is bufs["net/w" + V]
    assert third.arrays["net/b" + V] is not bufs["net/b" + V]
    assert third["net/b" + V].shape == (3,)


def test_snapshot_in_pinned_host_memory(fakedev, eng):
    net = Net(eng, 7)
    ckpt = pyckpt.Checkpoint(net=net)
    snap = ckpt.snapshot(host=True)
    key = "net/w" + V
    arr = snap.arrays[key]
    assert isinstance(arr, np.ndarray) and snap[key] is arr and not arr.flags.writeable
    assert snap.device_nbytes == 0
    assert eng.host_allocs == 1  # one page-locked buffer for the engine's values
    assert len(_dirs(eng, "d2h")) == 4 and not _dirs(eng, "d2d")  # 2 issued, 2 landed
    before = net.w.data.copy()
    net.w.data[...] = 5  # after snapshot() returned: the copy already landed
    np.testing.assert_array_equal(snap[key], before)

    eng.log.clear()
    ckpt.restore(snap).assert_consumed()
    np.testing.assert_array_equal(net.w.data, before)
    assert not _dirs(eng, "d2d", "d2h") and len(_dirs(eng, "h2d")) == 4

    net.w.data[...] = 3
    again = ckpt.snapshot(into=snap, host=True)
    assert eng.host_allocs == 1  # the pinned buffer was reused
    assert np.shares_memory(again[key], arr)
    np.testing.assert_array_equal(again[key], 3)
    assert snap._pinned == {} and list(again._pinned.values())[0].nbytes >= net.w.data.nbytes


def test_pinned_snapshot_buffers_are_given_back(fakedev):
    freed = []

    class Counting(LateCopyEngine):
        def free_host(self, buf):
            freed.append(buf.nbytes)

    eng = Counting(delay=0.0)
    ckpt = pyckpt.Checkpoint(net=Net(eng, 8))
    snap = ckpt.snapshot(host=True)
    again = ckpt.snapshot(into=snap, host=True)  # takes the buffer over
    del snap
    assert freed == []
    del again
    gc.collect()
    assert len(freed) == 1


def test_snapshot_restores_device_values_into_host_objects_and_back(fakedev, eng):
    dev = pyckpt.Checkpoint(net=Net(eng, 9))
    snap = dev.snapshot()
    host_net = pyckpt.Module()
    host_net.w = np.zeros((16, 8), np.float32)
    host_net.b = pyckpt.Variable(np.zeros(8, np.float32))
    host_net.step = pyckpt.Variable(np.int64(0))
    pyckpt.Checkpoint(net=host_net).restore(snap).assert_consumed()
    np.testing.assert_array_equal(host_net.w, dev.net.w.data)
    np.testing.assert_array_equal(host_net.b.numpy(), dev.net.b.data)
    host_net.w += 1
    eng.log.clear()
    dev.restore(pyckpt.Checkpoint(net=host_net).snapshot()).assert_consumed()
    np.testing.assert_array_equal(dev.net.w.data, host_net.w)
    assert not _dirs(eng, "d2d", "d2h")
    # copy_state from a device snapshot stays on the device too
    other = pyckpt.Checkpoint(net=Net(eng, 10))
    eng.log.clear()
    pyckpt.copy_state(snap, other)
    np.testing.assert_array_equal(other.net.w.data, snap["net/w" + V])
    assert not _dirs(eng, "d2h", "h2d")


# -- torch modules and optimizers ------------------------------------------------------------

torch = pytest.importorskip("torch")


def _model(seed):
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(6, 4), torch.nn.BatchNorm1d(4),
                               torch.nn.Linear(4, 2))


def test_copy_state_between_torch_modules_keeps_storage():
    a, b = _model(0), _model(1)
    ptrs = {k: v.data_ptr() for k, v in b.state_dict().items()}
    pyckpt.copy_state(a, b)
    for k, v in b.state_dict().items():
        assert v.data_ptr() == ptrs[k], k
        assert torch.equal(v, a.state_dict()[k]), k
    with torch.no_grad():
        a[0].weight.add_(1)
    assert not torch.equal(a[0].weight, b[0].weight)  # a copy, not shared

    # inside Checkpoints too, and from a snapshot of a bare module
    c, d = _model(2), _model(3)
    pyckpt.copy_state(pyckpt.Checkpoint(m=c), pyckpt.Checkpoint(m=d))
    assert torch.equal(c[2].bias, d[2].bias)
    snap = take_snapshot(c)
    with torch.no_grad():
        c[2].bias.zero_()
    pyckpt.copy_state(snap, c)
    assert torch.equal(c[2].bias, d[2].bias)


def test_copy_state_between_torch_modules_strict():
    a = torch.nn.Linear(3, 2)
    b = torch.nn.Linear(3, 5)
    w = b.weight.detach().clone()
    with pytest.raises(ValueError, match=r"\(5, 3\)"):
        pyckpt.copy_state(a, b)
    assert torch.equal(b.weight, w)


def test_snapshot_and_restore_of_a_torch_module():
    m = _model(4)
    ckpt = pyckpt.Checkpoint(model=m)
    snap = ckpt.snapshot()
    before = {k: v.clone() for k, v in m.state_dict().items()}
    ptr = m[0].weight.data_ptr()
    with torch.no_grad():
        for p in m.parameters():
            p.mul_(0)
    ckpt.restore(snap).assert_consumed()
    assert m[0].weight.data_ptr() == ptr
    for k, v in m.state_dict().items():
        assert torch.equal(v, before[k]), k


def _trained(seed, lr):
    model = _model(seed)
    opt = torch.optim.Adam(model.parameters(), lr=lr)
    for _ in range(2):
        opt.zero_grad()
        model(torch.randn(5, 6)).square().sum().backward()
        opt.step()
    return model, opt


def test_copy_state_between_torch_optimizers():
    ma, oa = _trained(5, lr=0.1)
    mb = _model(6)
    ob = torch.optim.Adam(mb.parameters(), lr=0.01)  # no state yet
    pyckpt.copy_state(oa, ob)
    assert ob.param_groups[0]["lr"] == 0.1
    sa, sb = oa.state_dict()["state"], ob.state_dict()["state"]
    assert sorted(sa) == sorted(sb)
    for i in sa:
        for k in sa[i]:
            assert torch.equal(torch.as_tensor(sa[i][k]), torch.as_tensor(sb[i][k])), (i, k)
    # state is copied, not shared
    with torch.no_grad():
        sa[0]["exp_avg"].add_(1)
    assert not torch.equal(sa[0]["exp_avg"], ob.state_dict()["state"][0]["exp_avg"])

    # a whole training state at once: model and optimizer in a Checkpoint
    mc, oc = _trained(7, lr=0.1)
    md = _model(8)
    od = torch.optim.Adam(md.parameters(), lr=0.1)
    pyckpt.copy_state(pyckpt.Checkpoint(model=mc, opt=oc), pyckpt.Checkpoint(model=md, opt=od))
    assert torch.equal(mc[0].weight, md[0].weight)
    assert torch.equal(oc.state_dict()["state"][2]["exp_avg_sq"],
                       od.state_dict()["state"][2]["exp_avg_sq"])


def test_copy_state_into_optimizer_without_source_values_is_strict():
    _, oa = _trained(9, lr=0.1)
    with pytest.raises(ValueError, match="restored as a whole"):
        pyckpt.copy_state({}, oa)
