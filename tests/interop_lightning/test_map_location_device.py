"""``CheckpointIO.load_checkpoint(map_location=...)`` (issue 39 item 2): on the CPU
(``None``, ``"cpu"``) every value comes back as before; on a CUDA device the torch
tensors are read through ``CheckpointSource.fill``'s pinned bounce buffers straight
into new device tensors (as ``pyckpt.load(device=)`` reads), never loaded to the host
and moved one by one, while numpy arrays and Python values stay on the host as they
are. Without a GPU, the torch hooks the load uses are made to hand out DeviceArrays
of a LateCopyEngine (tests/dcp/test_device_paths.py does the same for pyckpt.dcp)."""

from __future__ import annotations

import collections

import numpy as np
import pytest

from .conftest import assert_identical, torch

import pyckpt  # noqa: E402
import pyckpt.flat as flat  # noqa: E402
from pyckpt.adapters.torch_support import to_numpy  # noqa: E402
from pyckpt.lightning import CheckpointIO  # noqa: E402


def checkpoint():
    """A Lightning-shaped checkpoint dict with every kind of leaf ``map_location`` must
    tell apart."""
    g = torch.Generator().manual_seed(7)
    sd = collections.OrderedDict(w=torch.randn(6, 5, generator=g),
                                 bf=torch.randn(4, 3, generator=g).bfloat16(),
                                 ids=torch.arange(-5, 20, dtype=torch.int64))
    sd._metadata = collections.OrderedDict({"": {"version": 1}})
    return {
        "epoch": 2, "global_step": 17, "pytorch-lightning_version": "2.6.6",
        "state_dict": sd,
        "optimizer_states": [{"state": {0: {"step": torch.tensor(17.0),
                                            "exp_avg": torch.randn(6, 5, generator=g)}},
                              "param_groups": [{"lr": 0.01, "betas": (0.9, 0.999),
                                                "params": [0]}]}],
        "leaves": {"zero_d": torch.tensor(3.5), "empty": torch.zeros(0, 4),
                   "strided": torch.randn(5, 8, generator=g)[:, 1::3],
                   "param": torch.nn.Parameter(torch.ones(3)),
                   "numpy": np.arange(6, dtype=np.uint16).reshape(2, 3),
                   "np_scalar": np.float32(1.25), "i": 7, "f": 0.5, "b": False,
                   "s": "text", "n": None, "raw": b"\x00\xff"},
    }


def expected(ck):
    """What load_checkpoint returned before issue 39 (and must still return, on the
    CPU): contiguous tensors of the same dtype and values, numpy leaves as numpy, the
    rest as saved."""
    def host(v):
        if isinstance(v, torch.nn.Parameter):
            return torch.nn.Parameter(v.detach().clone(), requires_grad=v.requires_grad)
        if isinstance(v, torch.Tensor):
            return v.contiguous().clone()
        if isinstance(v, collections.OrderedDict):
            return collections.OrderedDict((k, host(x)) for k, x in v.items())
        if isinstance(v, dict):
            return {k: host(x) for k, x in v.items()}
        if isinstance(v, (list, tuple)):
            return type(v)(host(x) for x in v)
        return v
    return host(ck)


def torch_leaves(tree, path=()):
    if isinstance(tree, torch.Tensor):
        yield path, tree
    elif isinstance(tree, dict):
        for k, v in tree.items():
            yield from torch_leaves(v, path + (k,))
    elif isinstance(tree, (list, tuple)):
        for i, v in enumerate(tree):
            yield from torch_leaves(v, path + (i,))


@pytest.mark.parametrize("where", [None, "cpu", torch.device("cpu")])
def test_cpu_loads_return_what_they_returned(tmp_path, where):
    ck = checkpoint()
    CheckpointIO().save_checkpoint(ck, tmp_path / "c.ckpt")
    got = CheckpointIO().load_checkpoint(tmp_path / "c.ckpt", map_location=where)
    assert_identical(got, expected(ck), "checkpoint")
    assert got["state_dict"]._metadata == ck["state_dict"]._metadata
    leaves = got["leaves"]
    assert type(leaves["numpy"]) is np.ndarray and type(leaves["np_scalar"]) is np.float32
    assert type(leaves["param"]) is torch.nn.Parameter and leaves["param"].requires_grad
    assert leaves["strided"].is_contiguous()


@pytest.fixture
def engine(late_engine):
    return late_engine


@pytest.fixture
def fake_cuda(engine, monkeypatch):
    """``empty_on`` makes CPU tensors for a CUDA device (recorded), and ``target_view``
    hands them to the reader as DeviceArrays of ``engine`` (its copies write the CPU
    tensor's memory): what the torch hooks give for real CUDA tensors. Every
    ``Tensor.to`` / ``Tensor.cuda`` call is recorded (and changes nothing)."""
    made, devices, moves = [], [], []

    def empty_on(device, shape, dtype):
        devices.append(str(device))
        t = real_empty("cpu", shape, dtype)
        made.append(t)
        return t

    def target_view(obj):
        for n, t in enumerate(made):
            if obj is t and t.numel():
                return engine.array(to_numpy(t), f"#{n}"), None
        return real_target(obj)

    def spy(name):
        def call(self, *a, **kw):
            moves.append((name, tuple(self.shape)))
            return self
        return call

    real_empty, real_target = flat.empty_on, flat.target_view
    monkeypatch.setattr(flat, "empty_on", empty_on)
    monkeypatch.setattr(flat, "target_view", target_view)
    monkeypatch.setattr(torch.Tensor, "to", spy("to"))
    monkeypatch.setattr(torch.Tensor, "cuda", spy("cuda"))
    return made, devices, moves


def test_cuda_map_location_lands_tensors_through_bounce_buffers(tmp_path, engine, fake_cuda):
    made, devices, moves = fake_cuda
    ck = checkpoint()
    CheckpointIO().save_checkpoint(ck, tmp_path / "c.ckpt")
    got = CheckpointIO().load_checkpoint(tmp_path / "c.ckpt", map_location="cuda")
    want = expected(ck)
    assert_identical(got, want, "checkpoint")  # (the fake device's tensors are CPU ones)
    assert moves == []  # no tensor loaded to the host, then moved
    tensors = dict(torch_leaves(got))
    assert len(made) == len(tensors) == len(dict(torch_leaves(want)))
    assert set(devices) == {"cuda"}
    # every torch leaf is a tensor made on the device, filled by the engine's copies
    ptrs = {t.data_ptr() for t in made}
    assert all(t.data_ptr() in ptrs for t in tensors.values() if t.numel())
    landed = [k for what, d, k in engine.log if what == "land" and d == "h2d"]
    assert sorted(landed) == sorted(f"#{n}" for n, t in enumerate(made) if t.numel())
    # numpy arrays and Python values stay on the host, as they are
    leaves = got["leaves"]
    assert type(leaves["numpy"]) is np.ndarray and type(leaves["np_scalar"]) is np.float32
    assert type(leaves["param"]) is torch.nn.Parameter and leaves["param"].requires_grad
    assert got["state_dict"]._metadata == ck["state_dict"]._metadata


def test_public_load_device_still_places_numpy_leaves(tmp_path, engine, fake_cuda):
    """``pyckpt.load(device=)`` is unchanged: numpy leaves come back as device tensors
    (only Lightning's load keeps them numpy)."""
    made, devices, _ = fake_cuda
    pyckpt.save({"a": np.arange(4, dtype=np.int32), "t": torch.ones(2), "i": 3},
                str(tmp_path / "p"))
    got = pyckpt.load(str(tmp_path / "p"), device="cuda")
    assert isinstance(got["a"], torch.Tensor) and isinstance(got["t"], torch.Tensor)
    assert got["i"] == 3 and len(made) == 2 and set(devices) == {"cuda"}
