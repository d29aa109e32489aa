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
