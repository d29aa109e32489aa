"""``pyckpt.load(path, into=tree)`` with JAX arrays among the targets: a JAX array is
immutable, so load replaces it in its container (dict, list) by a new array placed
like it (same sharding); a shape or dtype mismatch is reported before anything is
read, and a JAX array inside a tuple is refused with what to do instead. (Before:
every JAX leaf was taken for a scalar, "checkpoint holds shape (3,), target is a
scalar".)"""

import numpy as np
import pytest

import pyckpt

jax = pytest.importorskip("jax")
jnp = jax.numpy


@pytest.fixture
def saved(tmp_path):
    path = str(tmp_path / "ck")
    pyckpt.save({"w": np.arange(6, dtype=np.float32).reshape(2, 3),
                 "opt": {"step": np.int32(7), "m": [np.full(4, 2.5, np.float32)]},
                 "host": np.ones(3)}, path)
    return path


def test_jax_leaves_are_replaced_in_their_containers(saved):
    host = np.zeros(3)
    into = {"w": jnp.zeros((2, 3), jnp.float32),
            "opt": {"step": jnp.int32(0), "m": [jnp.zeros(4, jnp.float32)]}, "host": host}
    old = into["w"]
    out = pyckpt.load(saved, into=into)
    assert out is into
    assert isinstance(into["w"], jax.Array) and into["w"] is not old
    np.testing.assert_array_equal(np.asarray(into["w"]), np.arange(6).reshape(2, 3))
    assert into["w"].sharding == old.sharding
    assert isinstance(into["opt"]["m"][0], jax.Array)
    np.testing.assert_array_equal(np.asarray(into["opt"]["m"][0]), np.full(4, 2.5))
    assert int(into["opt"]["step"]) == 7 and into["opt"]["step"].dtype == jnp.int32
    assert into["host"] is host and host.tolist() == [1.0, 1.0, 1.0]  # filled in place
    np.testing.assert_array_equal(np.asarray(old), 0)  # the old array is unchanged


def test_a_mismatch_is_reported_before_anything_is_filled(saved):
    host = np.zeros(3)
    into = {"w": jnp.zeros((3, 2), jnp.float32), "host": host}
    with pytest.raises(ValueError, match=r"'w': checkpoint has shape \(2, 3\).*target has "
                                         r"shape \(3, 2\)"):
        pyckpt.load(saved, into=into, strict=False)
    assert host.tolist() == [0.0, 0.0, 0.0]
    with pytest.raises(ValueError, match="'w'.*dtype"):
        pyckpt.load(saved, into={"w": jnp.zeros((2, 3), jnp.int32)}, strict=False)


def test_a_jax_array_inside_a_tuple_is_refused_with_the_way_out(saved):
    with pytest.raises(TypeError, match=r"'opt/m/0'.*immutable.*jax_support.restore"):
        pyckpt.load(saved, into={"opt": {"m": (jnp.zeros(4, jnp.float32),)}}, strict=False)
