"""JAX restores on a GPU (issue 40, item 5: the first restore within 1.2x of later
ones). Arrays on the GPU land through the loads' bounce buffers, which are
registered with JAX's client where it maps host memory, kept for the next restore,
and nothing is compiled on the way. Skipped without a JAX GPU device (jax with its
CUDA plugin); torch's CUDA tests share the GPU, so JAX does not preallocate here."""

from __future__ import annotations

import os

os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")

import numpy as np  # noqa: E402
import pytest  # noqa: E402

jax = pytest.importorskip("jax")

import pyckpt  # noqa: E402
from pyckpt.adapters import jax_device, jax_support  # noqa: E402
from pyckpt.device import loading  # noqa: E402


def _gpu():
    try:
        return next((d for d in jax.devices() if d.platform == "gpu"), None)
    except RuntimeError:
        return None


GPU = _gpu()
pytestmark = pytest.mark.skipif(GPU is None, reason="no JAX GPU device")


@pytest.fixture(autouse=True)
def _no_kept_buffers():
    pyckpt.device.release_staging_memory()
    yield
    pyckpt.device.release_staging_memory()


def _tree(seed: int) -> dict:
    rng = np.random.default_rng(seed)
    host = {"w": rng.standard_normal((1000, 300)).astype(np.float32),
            "b": rng.standard_normal((77,)).astype(jax.numpy.bfloat16),
            "n": [rng.integers(0, 9, (5, 5)).astype(np.int32), np.array(3.5, np.float32)]}
    return jax.tree_util.tree_map(lambda a: jax.device_put(a, GPU), host)


def _maps_host_memory() -> bool:
    buf = np.zeros(1 << 16, np.uint8)
    try:
        GPU.client.dma_map(buf.ctypes.data, buf.nbytes)
    except Exception:  # noqa: BLE001 - a client without DMA mapping
        return False
    GPU.client.dma_unmap(buf.ctypes.data)
    return True


def test_restore_lands_on_the_gpu_compiling_nothing(tmp_path):
    tree = _tree(0)
    jax_support.save(tree, tmp_path / "t")
    target = _tree(1)
    seen: list[str] = []

    def listener(event, duration, **kwargs):
        if event.startswith("/jax/core/compile"):
            seen.append(event)

    jax.monitoring.register_event_duration_secs_listener(listener)
    try:
        out = jax_support.restore(tmp_path / "t", target)
        loaded = pyckpt.load(tmp_path / "t")
    finally:
        jax.monitoring.unregister_event_duration_listener(listener)
    assert seen == []
    for got, want, like in zip(jax.tree_util.tree_leaves(out), jax.tree_util.tree_leaves(tree),
                               jax.tree_util.tree_leaves(target)):
        assert got.sharding == like.sharding and got.dtype == want.dtype
        np.testing.assert_array_equal(np.asarray(got), np.asarray(want))
    for got, want in zip(jax.tree_util.tree_leaves(loaded), jax.tree_util.tree_leaves(tree)):
        assert GPU in got.devices()
        np.testing.assert_array_equal(np.asarray(got), np.asarray(want))


def test_bounce_buffers_are_mapped_kept_and_reused(tmp_path, monkeypatch):
    tree = _tree(2)
    jax_support.save(tree, tmp_path / "t")
    jax_support.restore(tmp_path / "t", _tree(3))
    assert loading.bounce_bytes() > 0
    if _maps_host_memory():
        assert jax_device._MAPPED  # XLA copies from them without staging
    allocated = []
    real = jax_device.JaxEngine.alloc_host
    monkeypatch.setattr(jax_device.JaxEngine, "alloc_host",
                        lambda self, n: allocated.append(n) or real(self, n))
    out = jax_support.restore(tmp_path / "t", _tree(4))
    assert allocated == []  # the second restore reuses the first one's buffers
    for got, want in zip(jax.tree_util.tree_leaves(out), jax.tree_util.tree_leaves(tree)):
        np.testing.assert_array_equal(np.asarray(got), np.asarray(want))
    pyckpt.device.release_staging_memory()
    assert not jax_device._MAPPED and loading.bounce_bytes() == 0
