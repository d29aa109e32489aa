"""torch adapters (issue 7): tensors, state_dicts, nn.Module and optimizers."""

import numpy as np
import pytest

from pyckpt.testing.requirements import require

torch = require("torch")

import pyckpt  # noqa: E402
from pyckpt.adapters.torch_support import to_torch  # noqa: E402


def mlp(seed):
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))


def test_state_dict_round_trip_in_place(tmp_path):
    a, b = mlp(0), mlp(1)
    pyckpt.save(a.state_dict(), tmp_path / "sd")
    keys = [k for k, _ in pyckpt.list_variables(tmp_path / "sd")]
    assert keys == ["0.bias", "0.weight", "2.bias", "2.weight"]
    target = b.state_dict()
    assert pyckpt.load(tmp_path / "sd", into=target) is target
    for (k, va), vb in zip(a.state_dict().items(), b.state_dict().values()):
        assert torch.equal(va, vb), k
    plain = pyckpt.load(tmp_path / "sd")  # tensors saved from torch come back as tensors
    assert isinstance(plain["0.weight"], torch.Tensor)
    assert torch.equal(plain["0.weight"], a.state_dict()["0.weight"])
    as_np = pyckpt.load(tmp_path / "sd", as_numpy=True)
    assert isinstance(as_np["0.weight"], np.ndarray)
    assert torch.equal(to_torch(as_np)["0.weight"], a.state_dict()["0.weight"])


def test_bfloat16_and_strided_tensors(tmp_path):
    pytest.importorskip("ml_dtypes")
    x = torch.randn(6, 5).to(torch.bfloat16)
    t = torch.randn(5, 7).t()  # non-contiguous
    pyckpt.save({"x": x, "t": t, "step": torch.tensor(3)}, tmp_path / "c")
    assert pyckpt.load_checkpoint(tmp_path / "c").get_variable_to_dtype_map()["x"].name == "bfloat16"
    into = {"x": torch.zeros(6, 5, dtype=torch.bfloat16), "t": torch.zeros(7, 5),
            "step": torch.tensor(0)}
    pyckpt.load(tmp_path / "c", into=into)
    assert torch.equal(into["x"], x) and torch.equal(into["t"], t) and int(into["step"]) == 3
    assert torch.equal(to_torch(pyckpt.load(tmp_path / "c"))["x"], x)


@pytest.mark.parametrize("name", ["float8_e4m3fn", "float8_e5m2", "float8_e4m3fnuz",
                                  "float8_e5m2fnuz", "float8_e8m0fnu"])
def test_every_float8_dtype_round_trips_bit_exact(tmp_path, name):
    """Every float8 dtype torch and ml_dtypes share is saved from CPU tensors, comes back
    as that dtype, and fills a target in place (the fnuz dtypes were refused)."""
    ml_dtypes = pytest.importorskip("ml_dtypes")
    if not (hasattr(torch, name) and hasattr(ml_dtypes, name)):
        pytest.skip(f"this torch or ml_dtypes has no {name}")
    dtype = getattr(torch, name)
    bits = torch.arange(256, dtype=torch.uint8).reshape(16, 16)
    x = bits.view(dtype)  # every bit pattern, NaNs included: compared as bits
    pyckpt.save({"x": x}, tmp_path / "c")
    assert pyckpt.load_checkpoint(tmp_path / "c").get_variable_to_dtype_map()["x"].name == name
    out = pyckpt.load(tmp_path / "c")["x"]
    assert out.dtype == dtype and torch.equal(out.view(torch.uint8), bits)
    into = {"x": torch.zeros(16, 16, dtype=dtype)}
    pyckpt.load(tmp_path / "c", into=into)
    assert torch.equal(into["x"].view(torch.uint8), bits)
    as_np = pyckpt.load(tmp_path / "c", as_numpy=True)["x"]
    assert as_np.dtype == np.dtype(getattr(ml_dtypes, name))
    assert torch.equal(to_torch({"x": as_np})["x"].view(torch.uint8), bits)


def _train(model, opt, steps, seed):
    g = torch.Generator().manual_seed(seed)
    for _ in range(steps):
        x = torch.randn(16, 4, generator=g)
        y = torch.randn(16, 2, generator=g)
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        opt.step()


def test_module_and_adam_resume_equals_uninterrupted(tmp_path):
    model = mlp(0)
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    ck = pyckpt.Checkpoint(model=model, optimizer=opt)
    manager = pyckpt.CheckpointManager(ck, tmp_path, max_to_keep=2)
    _train(model, opt, 5, seed=1)
    manager.save()
    keys = [k for k, _ in pyckpt.list_variables(manager.latest_checkpoint)]
    assert "model/0/weight/.ATTRIBUTES/VARIABLE_VALUE" in keys
    assert "optimizer/state/0/exp_avg/.ATTRIBUTES/VARIABLE_VALUE" in keys
    assert "optimizer/param_groups/0/lr/.ATTRIBUTES/VARIABLE_VALUE" in keys
    manager.close()

    # a new program: fresh model, fresh optimizer without state
    model2 = mlp(7)
    opt2 = torch.optim.Adam(model2.parameters(), lr=0.5)
    ck2 = pyckpt.Checkpoint(model=model2, optimizer=opt2)
    manager2 = pyckpt.CheckpointManager(ck2, tmp_path, max_to_keep=2)
    assert manager2.restore_or_initialize() is not None
    assert opt2.param_groups[0]["lr"] == 1e-2
    _train(model2, opt2, 5, seed=2)

    straight = mlp(0)
    opt3 = torch.optim.Adam(straight.parameters(), lr=1e-2)
    _train(straight, opt3, 5, seed=1)
    _train(straight, opt3, 5, seed=2)
    for p2, p3 in zip(model2.parameters(), straight.parameters()):
        assert torch.equal(p2, p3)
    s2, s3 = opt2.state_dict()["state"], opt3.state_dict()["state"]
    for i in s3:
        for k in s3[i]:
            assert torch.equal(s2[i][k], s3[i][k]), (i, k)


def test_restore_status_of_a_module_checkpoint(tmp_path):
    model = mlp(0)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    _train(model, opt, 2, seed=3)
    path = pyckpt.Checkpoint(model=model, optimizer=opt).save(tmp_path / "c")
    model2 = mlp(5)
    opt2 = torch.optim.SGD(model2.parameters(), lr=0.3, momentum=0.9)
    status = pyckpt.Checkpoint(model=model2, optimizer=opt2).restore(path)
    status.assert_consumed()
    assert torch.equal(model2[0].weight, model[0].weight)
    assert opt2.param_groups[0]["lr"] == 0.1


def test_unusual_tensors_are_stored_or_refused_naming_the_key(tmp_path):
    """A negative view is stored as its values and conjugate or negative views are
    filled through a host copy (torch's own errors, without the key, before); sparse
    tensors are refused with the key; an expanded target (elements sharing memory) is
    refused before anything is filled."""
    c = torch.tensor([1 + 2j, 3 - 1j])
    neg = c.conj().imag  # a view with the negative bit set
    assert neg.is_neg()
    pyckpt.save({"model": {"w": neg}}, tmp_path / "n")
    assert torch.equal(pyckpt.load(tmp_path / "n")["model"]["w"], torch.tensor([-2.0, 1.0]))
    with pytest.raises(TypeError, match="'model/w': a sparse_coo tensor"):
        pyckpt.save({"model": {"w": torch.eye(2).to_sparse()}}, tmp_path / "s")
    pyckpt.save({"c": c, "x": torch.arange(12.0).reshape(3, 4), "y": torch.ones(2)},
                tmp_path / "c")
    base = torch.zeros(2, dtype=torch.complex64)
    pyckpt.load(tmp_path / "c", into={"c": base.conj()})  # filled through the view
    assert torch.equal(base.conj(), c)
    net = pyckpt.Module()  # such views as graph values: saved and restored as values
    net.t, net.n = c.conj(), c.conj().imag
    pyckpt.Checkpoint(net=net).write(tmp_path / "g")
    into_c, into_n = torch.zeros(2, dtype=torch.complex64), torch.zeros(2, dtype=torch.complex64)
    other = pyckpt.Module()
    other.t, other.n = into_c.conj(), into_n.conj().imag
    pyckpt.Checkpoint(net=other).restore(tmp_path / "g").assert_consumed()
    assert torch.equal(other.t, c.conj()) and torch.equal(other.n, c.conj().imag)
    strided = torch.zeros(4).as_strided((3, 2), (1, 1))  # rows overlap: not the fast path
    with pytest.raises(ValueError, match="'x': destination array is possibly overlapping"):
        pyckpt.copy_state({"x": torch.ones(3, 2)}, {"x": strided})
    every_other = torch.zeros(3, 8)[:, ::2]  # strided, not overlapping: filled
    pyckpt.copy_state({"x": torch.ones(3, 4)}, {"x": every_other})
    assert torch.equal(every_other, torch.ones(3, 4))
    into = {"x": torch.zeros(4).expand(3, 4), "y": torch.zeros(2)}
    with pytest.raises(ValueError, match="'x': target array is overlapping"):
        pyckpt.load(tmp_path / "c", into=into)
    assert torch.equal(into["y"], torch.zeros(2))
    dst = {"x": torch.zeros(4).expand(3, 4), "y": torch.zeros(2)}
    with pytest.raises(ValueError, match="'x': destination array is overlapping"):
        pyckpt.copy_state({"x": torch.ones(3, 4), "y": torch.ones(2)}, dst)
    assert torch.equal(dst["y"], torch.zeros(2))


class _Scaled(torch.nn.Module):
    """A module with extra state (torch's get_extra_state / set_extra_state)."""

    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(2, 2)
        self.scale, self.table = 1.0, torch.zeros(2)

    def get_extra_state(self):
        return {"scale": self.scale, "table": self.table, "name": "scaled"}

    def set_extra_state(self, state):
        self.scale, self.table = state["scale"], state["table"]


class _Counted(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.inner, self.calls = _Scaled(), 0

    def get_extra_state(self):
        return self.calls  # not a dict

    def set_extra_state(self, state):
        self.calls = state


def test_module_extra_state_is_saved_and_restored(tmp_path):
    """get_extra_state() was never called: the extra state was dropped without a word
    while assert_consumed passed."""
    m = _Counted()
    m.calls, m.inner.scale, m.inner.table = 7, 3.5, torch.ones(2)
    path = pyckpt.Checkpoint(model=m).write(tmp_path / "c")
    keys = {k for k, _ in pyckpt.list_variables(path)}
    assert "model/_extra_state/value/.ATTRIBUTES/VARIABLE_VALUE" in keys
    assert "model/inner/_extra_state/value/table/.ATTRIBUTES/VARIABLE_VALUE" in keys
    fresh = _Counted()
    pyckpt.Checkpoint(model=fresh).restore(path).assert_consumed().assert_existing_objects_matched()
    assert (fresh.calls, fresh.inner.scale) == (7, 3.5) and type(fresh.calls) is int
    assert torch.equal(fresh.inner.table, torch.ones(2))
    other = _Counted()
    pyckpt.copy_state(m, other)
    assert (other.calls, other.inner.scale) == (7, 3.5)
    ck = pyckpt.Checkpoint(model=m)
    snap = ck.snapshot()
    m.calls, m.inner.scale = 0, 0.0
    ck.restore(snap)
    assert (m.calls, m.inner.scale) == (7, 3.5)
    plain = torch.nn.Linear(2, 2)  # no extra state: no such edge
    assert not any("_extra_state" in k for k, _ in pyckpt.list_variables(
        pyckpt.Checkpoint(model=plain).write(tmp_path / "p")))


def test_a_restore_that_does_not_fit_leaves_the_optimizer_untouched(tmp_path):
    """The optimizer's load_state_dict ran before the module's values were checked:
    the restore raised with the optimizer already holding the checkpoint's lr and
    momentum buffers of the wrong shape (its next step failed)."""
    m = torch.nn.Linear(3, 2)
    opt = torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9)
    m(torch.ones(1, 3)).sum().backward()
    opt.step()
    path = pyckpt.Checkpoint(model=m, opt=opt).write(tmp_path / "c")
    m2 = torch.nn.Linear(4, 2)
    opt2 = torch.optim.SGD(m2.parameters(), lr=0.5, momentum=0.9)
    ck = pyckpt.Checkpoint(model=m2, opt=opt2)
    with pytest.raises(ValueError, match=r"model/weight.*shape \(2, 3\).*shape \(2, 4\)"):
        ck.restore(path)
    assert opt2.param_groups[0]["lr"] == 0.5 and not opt2.state
    m2(torch.ones(1, 4)).sum().backward()
    opt2.step()  # still usable
    m3 = torch.nn.Linear(3, 2)
    opt3 = torch.optim.SGD(m3.parameters(), lr=0.5, momentum=0.9)
    pyckpt.Checkpoint(model=m3, opt=opt3).restore(path).assert_consumed()
    assert opt3.param_groups[0]["lr"] == 0.1 and torch.equal(m3.weight, m.weight)
    assert torch.equal(opt3.state[m3.weight]["momentum_buffer"],
                       opt.state[m.weight]["momentum_buffer"])


def test_loaded_arrays_become_tensors_without_a_copy(tmp_path):
    """A load's fresh arrays carry dtypes with an explicit little-endian byte order
    (``_dtypes.dtype_from_name``): torch takes their memory as it is (every tensor of
    a load was copied a second time)."""
    import numpy as np
    import torch

    import pyckpt
    from pyckpt._dtypes import dtype_from_name
    from pyckpt.adapters.torch_support import from_host

    arr = np.arange(8, dtype=dtype_from_name("float32"))
    assert arr.dtype.byteorder == "<"  # what made it copy
    t = from_host(arr)
    assert t.data_ptr() == arr.ctypes.data
    big = np.arange(4, dtype=np.dtype(">f4"))   # foreign byte order: copied, values kept
    assert torch.equal(from_host(big), torch.arange(4, dtype=torch.float32))
    pyckpt.save({"w": torch.ones(3, 4)}, tmp_path / "c")
    got = pyckpt.load(tmp_path / "c")["w"]
    assert isinstance(got, torch.Tensor) and torch.equal(got, torch.ones(3, 4))
