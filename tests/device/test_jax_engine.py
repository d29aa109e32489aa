"""The JAX copy engine (accelerator arrays staged with copy_to_host_async), run on
CPU arrays wrapped as DeviceArrays."""

import numpy as np
import pytest

jnp = pytest.importorskip("jax.numpy")

import pyckpt  # noqa: E402
from pyckpt import saving  # noqa: E402
from pyckpt.adapters.jax_device import device_array  # noqa: E402
from pyckpt.device.staging import stage_values  # noqa: E402


def test_stage_values_copies_every_array():
    arrays = [jnp.arange(10, dtype=jnp.float32) * i for i in range(5)]
    live = [device_array(a) for a in arrays]
    staging = [np.zeros(10, np.float32) for _ in live]
    marked = []
    stage_values(live, staging, mark=marked.append)
    assert sorted(marked) == list(range(5))
    for a, s in zip(arrays, staging):
        np.testing.assert_array_equal(s, np.asarray(a))


def test_save_through_the_engine(tmp_path):
    a, b = jnp.ones((4, 3), jnp.bfloat16), jnp.arange(6, dtype=jnp.int32)
    items = [saving.Item("a", device_array(a)), saving.Item("b", device_array(b))]
    saving.write(saving.SavePlan.build(items, tmp_path / "c"))
    got = pyckpt.load(tmp_path / "c")
    np.testing.assert_array_equal(got["a"], np.asarray(a))
    np.testing.assert_array_equal(got["b"], np.asarray(b))


def test_jax_arrays_cannot_be_filled_in_place():
    d = device_array(jnp.zeros(3))
    with pytest.raises(TypeError, match="immutable"):
        d.engine.to_device([np.zeros(3)], [d])
