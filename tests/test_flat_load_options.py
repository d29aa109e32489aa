"""Loads that do what they were asked (issue 13): select keeps lists as lists,
mmap cannot combine with into, strict= as torch's load_state_dict."""

import numpy as np
import pytest

import pyckpt


@pytest.fixture
def saved(tmp_path):
    tree = {"params": [[np.full(2, 10.0 * i + j) for j in range(2)] for i in range(3)],
            "opt": ({"m": np.zeros(2)}, 5), "name": "run"}
    pyckpt.save(tree, tmp_path / "c")
    return tmp_path / "c", tree


def test_select_keeps_list_containers(saved):
    path, tree = saved
    got = pyckpt.load(path, select=["params/*/0"])
    assert isinstance(got["params"], list) and len(got["params"]) == 3
    for i in range(3):
        assert isinstance(got["params"][i], list)
        np.testing.assert_array_equal(got["params"][i][0], tree["params"][i][0])
        assert got["params"][i][1] is None  # not selected: a placeholder keeps positions
    assert set(got) == {"params"}


def test_select_keeps_tuples_and_scalar_kinds(saved):
    path, _ = saved
    got = pyckpt.load(path, select="opt")
    assert isinstance(got["opt"], tuple)
    assert got["opt"][1] == 5 and isinstance(got["opt"][1], int)


def test_whole_subtree_select_is_the_saved_subtree(saved):
    path, tree = saved
    got = pyckpt.load(path, select="params/1")
    assert got["params"][0] is None and got["params"][2] is None
    np.testing.assert_array_equal(got["params"][1][1], tree["params"][1][1])


def test_mmap_with_into_raises(saved):
    path, _ = saved
    with pytest.raises(ValueError, match="mmap=True cannot be combined with into="):
        pyckpt.load(path, into={"opt": [{"m": np.zeros(2)}, 0]}, mmap=True)


def test_strict_names_the_unused_keys(saved):
    path, _ = saved
    into = {"opt": [{"m": np.ones(2)}, 0]}
    with pytest.raises(pyckpt.CheckpointKeyError, match="params/0/0"):
        pyckpt.load(path, into=into, strict=True)
    np.testing.assert_array_equal(into["opt"][0]["m"], np.ones(2))  # nothing was filled
    pyckpt.load(path, into=into, strict=True, select="opt")
    assert into["opt"][1] == 5
    np.testing.assert_array_equal(into["opt"][0]["m"], np.zeros(2))


@pytest.fixture
def with_statics(tmp_path):
    tree = {"cfg": {"name": "resnet", "w": np.ones(2), "none": None, "b": b"xy", "n": 3,
                    "empty": {}, "t": (), "l": []},
            "l": [np.ones(1), "s"], "top": "x"}
    pyckpt.save(tree, tmp_path / "c")
    return tmp_path / "c", tree


def test_select_keeps_the_values_the_tree_holds_itself(with_statics):
    """str, bytes and None leaves and empty containers of a selected subtree were
    dropped without a word; they come back as a full load gives them."""
    path, tree = with_statics
    full = pyckpt.load(path)
    got = pyckpt.load(path, select="cfg")
    assert set(got) == {"cfg"} and set(got["cfg"]) == set(tree["cfg"])
    for k in ("name", "none", "b", "n", "empty", "t", "l"):
        assert got["cfg"][k] == full["cfg"][k] and type(got["cfg"][k]) is type(tree["cfg"][k]), k
    assert pyckpt.load(path, select="l/*")["l"][1] == "s"
    assert pyckpt.load(path, select="cfg/name") == {"cfg": {"name": "resnet"}}  # only a str
    assert pyckpt.load(path, select=["top", "cfg/w"])["top"] == "x"
    with pytest.raises(pyckpt.CheckpointKeyError, match="nothing"):
        pyckpt.load(path, select="nothing")


def test_key_map_keeps_the_values_the_tree_holds_itself(with_statics):
    path, _ = with_statics
    got = pyckpt.load(path, key_map=lambda k: "run/" + k)["run"]
    assert got["cfg"]["name"] == "resnet" and got["cfg"]["none"] is None
    assert got["cfg"]["b"] == b"xy" and got["cfg"]["empty"] == {} and got["cfg"]["t"] == ()
    assert got["l"]["1"] == "s" and got["top"] == "x"  # nested dicts of the mapped keys
    assert "top" not in pyckpt.load(path, key_map={"top": None})
    with pytest.raises(ValueError, match="'cfg/w' and 'top'"):
        pyckpt.load(path, key_map={"cfg/w": "top"})


@pytest.mark.parametrize("first", ["leaf", "subtree"])
def test_key_map_keeps_a_value_whose_key_prefixes_another(tmp_path, first):
    """``a`` and ``a/b`` both stored: a key_map load kept one of them, by key order."""
    items = [("a", np.zeros(3)), ("a/b", np.ones(2))]
    pyckpt.save(dict(items if first == "leaf" else items[::-1]), tmp_path / "c")
    for key_map in (lambda k: k, {"a": "a"}):
        got = pyckpt.load(tmp_path / "c", key_map=key_map)
        assert set(got) == {"a", "a/b"}
        np.testing.assert_array_equal(got["a"], np.zeros(3))
        np.testing.assert_array_equal(got["a/b"], np.ones(2))


def test_python_scalars_in_into_take_the_stored_values_as_saved(tmp_path):
    """The target's type was imposed: 3.7 loaded into an int became 3, True into 0
    became 1, a NaN into an int raised after the arrays were filled."""
    pyckpt.save({"lr": 3.7, "flag": True, "c": 1 + 2j, "f": 1.5, "big": 2 ** 70,
                 "np": np.float32(2.5), "a0": np.array(4, np.int16), "nan": float("nan"),
                 "w": np.ones(3)}, tmp_path / "c")
    into = {"lr": 0, "flag": 0, "c": 0, "f": False, "big": 0, "np": 0, "a0": 0.0, "nan": 0,
            "w": np.zeros(3)}
    pyckpt.load(tmp_path / "c", into=into)
    expect = {"lr": (3.7, float), "flag": (True, bool), "c": (1 + 2j, complex), "f": (1.5, float),
              "big": (2 ** 70, int), "np": (2.5, np.float32), "a0": (4, int)}
    for k, (value, kind) in expect.items():
        assert into[k] == value and type(into[k]) is kind, (k, into[k])
    assert np.isnan(into["nan"]) and isinstance(into["nan"], float)
    np.testing.assert_array_equal(into["w"], np.ones(3))


def test_copy_state_gives_scalars_the_source_values_as_they_are(tmp_path):
    dst = {"lr": 0, "flag": 0, "big": 0, "w": np.zeros(2)}
    pyckpt.copy_state({"lr": 3.7, "flag": True, "big": 2 ** 70, "w": np.ones(2)}, dst)
    assert (dst["lr"], dst["flag"], dst["big"]) == (3.7, True, 2 ** 70)
    assert type(dst["lr"]) is float and type(dst["flag"]) is bool
    src, into = pyckpt.Module(), pyckpt.Module()
    src.cfg, into.cfg = {"lr": 3.7, "big": 2 ** 70}, {"lr": 0, "big": 0}
    pyckpt.copy_state(src, into)
    assert dict(into.cfg) == {"lr": 3.7, "big": 2 ** 70} and type(into.cfg["lr"]) is float
    again = pyckpt.Module()
    again.cfg = {"lr": 0, "big": 0}
    pyckpt.copy_state(pyckpt.Checkpoint(m=src).snapshot(), pyckpt.Checkpoint(m=again))
    assert dict(again.cfg) == {"lr": 3.7, "big": 2 ** 70}
    src.cfg = {"big": 2 ** 70, "f": np.float32(1.5), "i": np.int16(4)}  # kinds of a snapshot
    snap = pyckpt.Checkpoint(m=src).snapshot()
    again.cfg = {"big": 0.0, "f": 0, "i": 0}
    pyckpt.copy_state(snap, pyckpt.Checkpoint(m=again))
    assert again.cfg["big"] == 2 ** 70 and type(again.cfg["big"]) is int
    assert type(again.cfg["f"]) is np.float32 and type(again.cfg["i"]) is np.int16


def test_into_keys_left_out_by_select_are_told_apart_from_absent_ones(saved):
    path, _ = saved
    into = {"opt": [{"m": np.ones(2)}, 0], "nope": np.zeros(1)}
    with pytest.raises(pyckpt.CheckpointKeyError) as e:
        pyckpt.load(path, into=into, select="params")
    msg = str(e.value)
    assert "are not in checkpoint" in msg and "'nope'" in msg
    assert "select= or key_map= left them out: 'opt/0/m', 'opt/1'" in msg
