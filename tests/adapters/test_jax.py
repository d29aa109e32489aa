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
