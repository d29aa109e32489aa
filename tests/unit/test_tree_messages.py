"""Issue 13, item 2: ``pyckpt.save(5, path)`` said "the tree is a single array".
The message now says what was given and how to save it; nothing is written."""

import re

import numpy as np
import pytest

import pyckpt
from pyckpt import registry
from pyckpt.testing.requirements import require

HEAD = r"pyckpt\.save needs a tree \(a dict, list or tuple of arrays\); got "


def refused(value, tmp_path):
    path = tmp_path / "ck"
    with pytest.raises(TypeError) as info:
        pyckpt.save(value, path)
    assert not path.exists()  # refused before anything is written
    return str(info.value)


@pytest.mark.parametrize("value, given, example", [
    (5, "an int", "value"),
    (2.5, "a float", "value"),
    (True, "a bool", "value"),
    ("hello", "a str", "value"),
    (None, "None", "value"),
    (b"raw", "a bytes object", "value"),
    (np.float32(1), "a numpy.float32", "value"),
    (np.zeros((3, 2)), r"a numpy\.ndarray of shape \(3, 2\) and dtype float64", "array"),
    (pyckpt.Variable(np.ones(4)), r"a pyckpt\.Variable of shape \(4,\) and dtype float64", "array"),
])
def test_a_lone_value_is_named(tmp_path, value, given, example):
    msg = refused(value, tmp_path)
    assert re.fullmatch(
        HEAD + given + r": give it a name, e\.g\. \{'x': " + example + r"\}.*", msg), msg
    assert "single array" not in msg


def test_int_message_exactly(tmp_path):
    assert refused(5, tmp_path) == ("pyckpt.save needs a tree (a dict, list or tuple of arrays); "
                                    "got an int: give it a name, e.g. {'x': value}")


def test_str_may_be_swapped_arguments(tmp_path):
    msg = refused("run/ckpt-1", tmp_path)
    assert msg.endswith("(the tree comes first: pyckpt.save(tree, path))")


class FakeTensor:
    """Looks like a torch tensor to pyckpt: a registered leaf type with shape and dtype."""

    __module__ = "torch"
    __qualname__ = "Tensor"

    def __init__(self, data):
        self.data = np.asarray(data)
        self.shape = self.data.shape
        self.dtype = "torch.float32"


def test_tensor_like_leaf(tmp_path, monkeypatch):
    monkeypatch.setattr(registry, "_ADAPTERS", list(registry._ADAPTERS))  # undone after
    registry.register_adapter("fake-tensor", leaf=lambda o: o.data if isinstance(o, FakeTensor) else None)
    msg = refused(FakeTensor(np.zeros((2, 3), np.float32)), tmp_path)
    assert msg == ("pyckpt.save needs a tree (a dict, list or tuple of arrays); got a torch.Tensor "
                   "of shape (2, 3) and dtype torch.float32: give it a name, e.g. {'x': array}")
    pyckpt.save({"t": FakeTensor(np.ones(2, np.float32))}, tmp_path / "named")  # named: saved
    np.testing.assert_array_equal(pyckpt.load(tmp_path / "named")["t"], np.ones(2, np.float32))


def test_torch_tensor_and_module(tmp_path):
    torch = require("torch")
    msg = refused(torch.zeros(2, 3), tmp_path)
    assert msg == ("pyckpt.save needs a tree (a dict, list or tuple of arrays); got a torch.Tensor "
                   "of shape (2, 3) and dtype torch.float32: give it a name, e.g. {'x': array}")
    msg = refused(torch.nn.Linear(2, 2), tmp_path)
    assert msg.endswith("got a torch.nn.modules.linear.Linear: save its state, "
                        "e.g. {'model': obj.state_dict()}")


def test_other_roots(tmp_path):
    assert refused(pyckpt.Checkpoint(), tmp_path).endswith(
        "got a pyckpt.Checkpoint: a Checkpoint saves itself (checkpoint.write(path) or "
        "checkpoint.save(prefix))")
    assert "got an object, which pyckpt cannot save" in refused(object(), tmp_path)


def test_trees_are_unchanged(tmp_path):
    for tree in ({"x": 5}, [np.ones(2), "s", None], ({"a": b"x"},), {}):
        pyckpt.save(tree, tmp_path / "ok")
        assert type(pyckpt.load(tmp_path / "ok")) is type(tree)
    with pytest.raises(TypeError, match=r"cannot save an object at 'k'"):
        pyckpt.save({"k": object()}, tmp_path / "bad")
