"""``pyckpt.lightning.CheckpointIO().load_checkpoint(path, map_location="cuda")`` (issue 39
item 2): the torch tensors land on the GPU through pinned bounce buffers (as
``pyckpt.load(device=)``), with exact values; numpy arrays and Python values stay on
the host as they are; pyckpt calls no ``Tensor.to`` / ``Tensor.cuda`` per tensor."""

from __future__ import annotations

import collections
import os
import sys

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("lightning")

import pyckpt  # noqa: E402
from pyckpt.lightning import CheckpointIO  # noqa: E402

PYCKPT_DIR = os.path.dirname(pyckpt.__file__)


def checkpoint():
    """A checkpoint dict as Lightning makes one (a model's state dict, Adam's state)."""
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(32, 16), torch.nn.BatchNorm1d(16),
                              torch.nn.Linear(16, 3))
    opt = torch.optim.Adam(net.parameters(), lr=0.01)
    net(torch.randn(8, 32)).sum().backward()
    opt.step()
    g = torch.Generator().manual_seed(1)
    return {"epoch": 1, "global_step": 9, "state_dict": net.state_dict(),
            "optimizer_states": [opt.state_dict()],
            "tensors": {"bf16": torch.randn(7, 5, generator=g).bfloat16(),
                        "ids": torch.arange(1000, dtype=torch.int64),
                        "zero_d": torch.tensor(2.5), "empty": torch.zeros(0, 3),
                        "strided": torch.randn(6, 9, generator=g)[:, ::2],
                        "param": torch.nn.Parameter(torch.ones(4))},
            "numpy": np.arange(12, dtype=np.float64).reshape(3, 4),
            "np_scalar": np.int32(5), "s": "x", "n": None, "f": 0.25}


def tensors(tree, path=()):
    if isinstance(tree, torch.Tensor):
        yield path, tree
    elif isinstance(tree, dict):
        for k, v in tree.items():
            yield from tensors(v, path + (k,))
    elif isinstance(tree, (list, tuple)):
        for i, v in enumerate(tree):
            yield from tensors(v, path + (i,))


def test_map_location_cuda_lands_through_bounce_buffers(tmp_path, monkeypatch):
    ck = checkpoint()
    want = dict(tensors(ck))
    CheckpointIO().save_checkpoint(ck, tmp_path / "c.ckpt")
    moves = []

    def spy(name, real):
        def call(self, *a, **kw):
            caller = sys._getframe(1).f_code.co_filename
            if caller.startswith(PYCKPT_DIR):
                moves.append((name, caller))
            return real(self, *a, **kw)
        return call

    monkeypatch.setattr(torch.Tensor, "to", spy("to", torch.Tensor.to))
    monkeypatch.setattr(torch.Tensor, "cuda", spy("cuda", torch.Tensor.cuda))
    got = CheckpointIO().load_checkpoint(tmp_path / "c.ckpt", map_location="cuda")
    monkeypatch.undo()
    assert moves == []
    have = dict(tensors(got))
    assert list(have) == list(want)
    for path, w in want.items():
        t = have[path]
        assert t.device.type == "cuda" and type(t) is type(w), path
        assert t.dtype == w.dtype and t.shape == w.shape, path
        assert torch.equal(t.cpu(), w.detach().contiguous()), path
    assert got["tensors"]["param"].requires_grad
    assert type(got["numpy"]) is np.ndarray and np.array_equal(got["numpy"], ck["numpy"])
    assert type(got["np_scalar"]) is np.int32 and got["np_scalar"] == 5
    assert (got["s"], got["n"], got["f"], got["epoch"]) == ("x", None, 0.25, 1)
    assert type(got["state_dict"]) is collections.OrderedDict
