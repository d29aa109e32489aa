"""Walks of torch objects do each piece of work once per object: a restore (and a
restore_plan) lists a module's children once per visit, not once per child (a
Sequential of n layers was n^2 work), and the torch hooks see tensors with and
without autograd history, bfloat16 included."""

import numpy as np

from pyckpt.testing.requirements import require

torch = require("torch")

import pyckpt  # noqa: E402
from pyckpt.adapters import torch_support  # noqa: E402
from pyckpt.graph.object_graph import MISSING, child_lookup, get_child  # noqa: E402
from pyckpt.testing.spies import count_calls  # noqa: E402


def _net(n: int) -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(*[torch.nn.Linear(3, 3) for _ in range(n)])


def test_restore_lists_each_modules_children_once(monkeypatch, tmp_path):
    src = pyckpt.Checkpoint(model=_net(40))
    path = src.write(tmp_path / "c")
    dst_net = _net(40)
    with torch.no_grad():
        for p in dst_net.parameters():
            p.zero_()
    dst = pyckpt.Checkpoint(model=dst_net)
    listed = count_calls(monkeypatch, torch_support.ModuleNode, "_pyckpt_children")
    status = dst.restore(path)
    assert len(listed) == 41  # the Sequential and each of its 40 layers, once each
    status.assert_consumed()
    for a, b in zip(src.model.parameters(), dst_net.parameters()):
        assert torch.equal(a, b)
    del listed[:]
    plan = dst.restore_plan(path)
    assert len(listed) == 82  # its matching walk and its walk of the live objects
    assert not plan.conflicts


def test_a_module_child_shared_under_two_names_is_found_under_the_first():
    """As ``named_children`` lists it: a second name of one submodule is no edge, so a
    restore cannot fill one object from two stored nodes."""
    m = torch.nn.Module()
    lin = torch.nn.Linear(2, 2)
    m.a = lin
    m.b = lin
    node = torch_support.ModuleNode(m)
    assert node._pyckpt_get_child("a") is lin
    assert node._pyckpt_get_child("b") is MISSING
    assert node._pyckpt_get_child("nope") is MISSING
    assert get_child(m, "a") is lin and get_child(m, "b") is MISSING


def test_child_lookup_matches_get_child_for_containers():
    d = {1: np.zeros(1), "1": np.ones(1), 2: np.full(1, 2.0), "x": [np.zeros(2)]}
    look = child_lookup(d)
    for name in ("1", "2", "x", "3"):
        a, b = look(name), get_child(d, name)
        assert a is b or (a is not MISSING and b is not MISSING and a.value == b.value)
    assert look("1") is d["1"]  # the key spelled as the name wins over str(1)
    assert look("2") is d[2]
    seq = [np.zeros(1), np.ones(1)]
    assert child_lookup(seq)("1") is seq[1] and child_lookup(seq)("2") is MISSING


def test_hooks_on_tensors_with_and_without_autograd_history():
    p = torch.nn.Parameter(torch.arange(3.0))
    plain = torch.arange(3.0)
    for t in (p, plain):
        arr = torch_support.to_numpy(t)
        np.testing.assert_array_equal(arr, [0, 1, 2])
        view, finish = torch_support.writable(t)
        view[...] = 7  # fills the tensor in place
        assert finish is None and torch.equal(t.detach(), torch.full((3,), 7.0))
    b = torch.arange(4, dtype=torch.bfloat16)
    assert torch_support.to_numpy(b).dtype.name == "bfloat16"
    back = torch_support.to_torch({"b": torch_support.to_numpy(b), "f": np.arange(2.0)})
    assert back["b"].dtype == torch.bfloat16 and torch.equal(back["b"], b)
    assert back["f"].dtype == torch.float64


def test_a_name_held_twice_in_a_module_is_found_first_where_torch_lists_it_first():
    lin = torch.nn.Linear(2, 2)
    lin._buffers["weight"] = torch.zeros(2, 2)  # edited by hand: the parameter comes first
    assert torch_support.ModuleNode(lin)._pyckpt_get_child("weight") is lin.weight
