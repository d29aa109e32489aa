"""JAX adapters (issue 7): jax.Array leaves and whole pytrees."""

import numpy as np

from pyckpt.testing.requirements import require

jax = require("jax")
jnp = require("jax.numpy")

import pyckpt  # noqa: E402
from pyckpt.adapters import jax_support  # noqa: E402


def test_jax_arrays_as_leaves(tmp_path):
    tree = {"w": jnp.arange(12.0).reshape(3, 4), "b": jnp.ones(4, dtype=jnp.bfloat16), "n": 3}
    pyckpt.save(tree, tmp_path / "c")
    out = pyckpt.load(tmp_path / "c")
    np.testing.assert_array_equal(out["w"], np.asarray(tree["w"]))
    assert out["b"].dtype.name == "bfloat16" and out["n"] == 3


def test_pytree_with_custom_nodes_round_trip(tmp_path):
    from typing import NamedTuple

    class Params(NamedTuple):
        kernel: jax.Array
        bias: jax.Array

    tree = {"dense": Params(jnp.arange(6.0).reshape(2, 3), jnp.zeros(3)),
            "layers": [jnp.ones((2, 2), jnp.bfloat16), jnp.full((1,), 7, jnp.int32)],
            "step": jnp.array(10)}
    jax_support.save(tree, tmp_path / "p")
    keys = [k for k, _ in pyckpt.list_variables(tmp_path / "p")]
    assert keys == ["dense/bias", "dense/kernel", "layers/0", "layers/1", "step"]
    target = jax.tree_util.tree_map(jnp.zeros_like, tree)
    restored = jax_support.restore(tmp_path / "p", target)
    assert isinstance(restored["dense"], Params)
    for a, b in zip(jax.tree_util.tree_leaves(restored), jax.tree_util.tree_leaves(tree)):
        assert isinstance(a, jax.Array) and a.dtype == b.dtype
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_python_scalars_come_back_as_python_scalars(tmp_path):
    """Issue 13: an int saved as a Python int was restored as array(7)."""
    tree = {"step": 7, "lr": 0.5, "flag": True, "z": 1 + 2j, "w": jnp.arange(3.0),
            "count": jnp.array(10)}
    jax_support.save(tree, tmp_path / "s")
    target = {"step": 0, "lr": 0.0, "flag": False, "z": 0j, "w": jnp.zeros(3), "count": 0}
    out = jax_support.restore(tmp_path / "s", target)
    assert out["step"] == 7 and type(out["step"]) is int
    assert out["lr"] == 0.5 and type(out["lr"]) is float
    assert out["flag"] is True
    assert out["z"] == 1 + 2j and type(out["z"]) is complex
    assert isinstance(out["w"], jax.Array)
    np.testing.assert_array_equal(np.asarray(out["w"]), np.arange(3.0))
    # stored as an array (a 0-d jax.Array): the Python scalar target keeps its own kind
    assert out["count"] == 10 and type(out["count"]) is int
    # the kind recorded at save time wins over the target's (a float placeholder for an int)
    again = jax_support.restore(tmp_path / "s", {**target, "step": 0.0, "flag": 0})
    assert type(again["step"]) is int and again["step"] == 7 and again["flag"] is True
    # through select/key_map too, and for trees saved by pyckpt.save
    renamed = jax_support.restore(tmp_path / "s", {"n": 0.0}, select="step", key_map={"step": "n"})
    assert renamed == {"n": 7} and type(renamed["n"]) is int
    pyckpt.save({"epoch": 3, "x": np.ones(2, np.float32)}, tmp_path / "flat")
    out = jax_support.restore(tmp_path / "flat", {"epoch": 0, "x": jnp.zeros(2)})
    assert out["epoch"] == 3 and type(out["epoch"]) is int


def test_saving_a_single_jax_array_names_what_was_given(tmp_path):
    import pytest

    with pytest.raises(TypeError, match=r"needs a tree .*got a jax\.Array of shape \(3,\).*"
                                         r"give it a name, e.g. \{'x': array\}"):
        jax_support.save(jnp.ones(3), tmp_path / "one")
    assert not (tmp_path / "one").exists()
