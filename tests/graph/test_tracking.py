"""What Trackable/Module/Checkpoint track and how keys are named (API.md section 2)."""

import numpy as np
import pytest

import pyckpt
from pyckpt.graph.containers import TrackedDict, TrackedList


class Dense(pyckpt.Module):
    def __init__(self, units, name=None):
        super().__init__(name=name)
        self.units = units
        self.kernel = None
        self.bias = None

    def build(self, d):
        self.kernel = pyckpt.Variable(np.full((d, self.units), 0.5), name="k")
        self.bias = pyckpt.Variable(np.zeros(self.units), name="b")

    def __call__(self, x):
        if self.kernel is None:
            self.build(x.shape[-1])
        return x @ self.kernel.numpy() + self.bias.numpy()


def keys_of(path):
    return [k for k, _ in pyckpt.list_variables(path)]


def test_tf_style_keys_and_save_counter(tmp_path):
    net = Dense(2)
    net(np.ones((1, 3)))
    ckpt = pyckpt.Checkpoint(net=net)
    path = ckpt.save(tmp_path / "ckpt")
    assert path == str(tmp_path / "ckpt-1")
    assert keys_of(path) == ["net/bias/.ATTRIBUTES/VARIABLE_VALUE",
                             "net/kernel/.ATTRIBUTES/VARIABLE_VALUE",
                             "save_counter/.ATTRIBUTES/VARIABLE_VALUE"]
    assert ckpt.save(tmp_path / "ckpt") == str(tmp_path / "ckpt-2")


def test_untracked_attributes_are_not_saved(tmp_path):
    m = pyckpt.Module()
    m.count = 3
    m.label = "text"
    m._private = pyckpt.Variable(1.0)
    m.w = pyckpt.Variable(np.ones(2))
    m.config = {"lr": 0.1}  # a tracked dict: its numbers are saved (issue 14)
    pyckpt.Checkpoint(m=m).write(tmp_path / "c")
    assert keys_of(tmp_path / "c") == ["m/config/lr/.ATTRIBUTES/VARIABLE_VALUE",
                                       "m/w/.ATTRIBUTES/VARIABLE_VALUE"]


def test_save_counter_is_lazy(tmp_path):
    ckpt = pyckpt.Checkpoint(v=pyckpt.Variable(1.0))
    assert "_save_counter" not in ckpt.__dict__  # never created at construction
    ckpt.write(tmp_path / "a")
    assert keys_of(tmp_path / "a") == ["v/.ATTRIBUTES/VARIABLE_VALUE"]
    ckpt.save(tmp_path / "b")
    ckpt.write(tmp_path / "c")
    assert "save_counter/.ATTRIBUTES/VARIABLE_VALUE" in keys_of(tmp_path / "c")
    with pytest.raises(ValueError, match="reserved"):
        pyckpt.Checkpoint(save_counter=pyckpt.Variable(0))


def test_ndarrays_lists_dicts_and_nesting(tmp_path):
    root = pyckpt.Checkpoint()
    root.arr = np.arange(3.0)
    root.layers = [pyckpt.Variable(1.0), {"inner": pyckpt.Variable(2.0)}]
    root.table = {"a": np.zeros(2), "b": [np.ones(1)]}
    assert isinstance(root.layers, TrackedList) and isinstance(root.layers[1], TrackedDict)
    root.layers.append(pyckpt.Variable(3.0))  # mutation after assignment stays tracked
    root.table["c"] = pyckpt.Variable(4.0)
    root.write(tmp_path / "c")
    assert keys_of(tmp_path / "c") == [
        "arr/.ATTRIBUTES/VARIABLE_VALUE",
        "layers/0/.ATTRIBUTES/VARIABLE_VALUE",
        "layers/1/inner/.ATTRIBUTES/VARIABLE_VALUE",
        "layers/2/.ATTRIBUTES/VARIABLE_VALUE",
        "table/a/.ATTRIBUTES/VARIABLE_VALUE",
        "table/b/0/.ATTRIBUTES/VARIABLE_VALUE",
        "table/c/.ATTRIBUTES/VARIABLE_VALUE",
    ]


def test_edge_names_with_slash_and_dot_are_escaped(tmp_path):
    root = pyckpt.Checkpoint()
    root.table = {"a/b": pyckpt.Variable(1.0), "c.d": pyckpt.Variable(2.0), "e..S": pyckpt.Variable(3.0)}
    root.write(tmp_path / "c")
    assert keys_of(tmp_path / "c") == ["table/a.Sb/.ATTRIBUTES/VARIABLE_VALUE",
                                       "table/c..d/.ATTRIBUTES/VARIABLE_VALUE",
                                       "table/e....S/.ATTRIBUTES/VARIABLE_VALUE"]
    other = pyckpt.Checkpoint()
    other.table = {"a/b": pyckpt.Variable(0.0), "c.d": pyckpt.Variable(0.0), "e..S": pyckpt.Variable(0.0)}
    other.read(tmp_path / "c").assert_consumed()
    assert [float(v) for v in other.table.values()] == [1.0, 2.0, 3.0]


def test_shared_object_is_saved_once_under_first_bfs_path(tmp_path):
    shared = pyckpt.Variable(np.arange(4.0))
    root = pyckpt.Checkpoint()
    root.deep = pyckpt.Checkpoint(inner=pyckpt.Checkpoint(v=shared))
    root.direct = shared
    root.write(tmp_path / "c")
    assert keys_of(tmp_path / "c") == ["direct/.ATTRIBUTES/VARIABLE_VALUE"]
    graph = pyckpt.load_checkpoint(tmp_path / "c").object_graph
    assert graph is not None and len(graph["children"]) == len(graph["value"])
    # restores through either path
    other = pyckpt.Checkpoint()
    other.deep = pyckpt.Checkpoint(inner=pyckpt.Checkpoint(v=pyckpt.Variable(np.zeros(4))))
    other.read(tmp_path / "c").assert_existing_objects_matched()
    np.testing.assert_array_equal(other.deep.inner.v.numpy(), np.arange(4.0))


def test_module_collections_are_depth_first_and_deduplicated():
    class Block(pyckpt.Module):
        def __init__(self):
            self.a = Dense(2, name="a")
            self.b = Dense(2, name="b")
            self.scale = pyckpt.Variable(1.0, trainable=False)

    class Model(pyckpt.Module):
        def __init__(self):
            super().__init__(name="model")
            self.blocks = [Block(), Block()]
            self.head = Dense(1)
            self.alias = self.head  # same module twice

    m = Model()
    for blk in m.blocks:
        blk.a.build(2)
        blk.b.build(2)
    m.head.build(2)
    subs = m.submodules
    assert [type(s).__name__ for s in subs] == ["Block", "Dense", "Dense", "Block", "Dense", "Dense", "Dense"]
    assert len(m.variables) == 4 * 2 + 2 + 2
    assert len(m.trainable_variables) == len(m.variables) - 2
    v = m.variables
    assert v[0] is m.blocks[0].a.kernel and v[-1] is m.head.bias
    assert m.name == "model" and m.blocks[0].name == "block"
