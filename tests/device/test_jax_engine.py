"""The JAX copy engine (accelerator arrays staged with copy_to_host_async; restores
make new arrays from bounce buffers), run on CPU arrays wrapped as DeviceArrays."""

from types import SimpleNamespace

import numpy as np
import pytest

jnp = pytest.importorskip("jax.numpy")

import jax  # noqa: E402

import pyckpt  # noqa: E402
from pyckpt import saving  # noqa: E402
from pyckpt.adapters import jax_device  # noqa: E402
from pyckpt.adapters.jax_device import JaxEngine, device_array, in_host_memory, landing  # noqa: E402
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


def test_to_device_makes_new_arrays_placed_like_their_targets():
    like = [jax.device_put(np.zeros((4, 3), np.float32)), jax.device_put(np.zeros(5, np.int32))]
    dsts = [landing(a) for a in like]
    host = [np.arange(12, dtype=np.float32).reshape(4, 3), np.arange(5, dtype=np.int32)]
    tickets = dsts[0].engine.to_device(host, dsts)
    for t in tickets:
        t.wait()
        assert t.done()
    for d, h, a in zip(dsts, host, like):
        assert d.obj.array.sharding == a.sharding and d.obj.array.dtype == a.dtype
        np.testing.assert_array_equal(np.asarray(d.obj.array), h)
    # the new arrays do not share the source's memory (a bounce buffer, refilled next)
    host[0][...] = -1
    np.testing.assert_array_equal(np.asarray(dsts[0].obj.array),
                                  np.arange(12, dtype=np.float32).reshape(4, 3))


def test_in_host_memory():
    cpu = jax.device_put(np.zeros(2), jax.devices("cpu")[0]).sharding
    gpu = SimpleNamespace(platform="gpu")
    assert in_host_memory(cpu)
    assert not in_host_memory(SimpleNamespace(memory_kind="device", device_set=[gpu]))
    assert not in_host_memory(SimpleNamespace(memory_kind=None, device_set=[gpu]))
    assert in_host_memory(SimpleNamespace(memory_kind="pinned_host", device_set=[gpu]))


class _Client:
    """Stands for an accelerator's JAX client: records its DMA mappings."""

    def __init__(self, fail: bool = False) -> None:
        self.mapped: list = []
        self.unmapped: list = []
        self.fail = fail

    def dma_map(self, address, size):
        if self.fail:
            raise RuntimeError("DmaMap not supported on platform")
        self.mapped.append((address, size))

    def dma_unmap(self, address):
        self.unmapped.append(address)


def test_bounce_buffers_are_mapped_on_an_accelerator(monkeypatch):
    eng = JaxEngine()
    monkeypatch.setattr(jax_device, "_accelerator_client", lambda: None)  # the CPU
    buf = eng.alloc_host(10_000)  # plain memory
    assert buf.nbytes == 10_000 and not jax_device._MAPPED
    eng.free_host(buf)
    client = _Client()
    monkeypatch.setattr(jax_device, "_accelerator_client", lambda: client)
    buf = eng.alloc_host(8192)
    assert client.mapped == [(buf.ctypes.data, 8192)]
    eng.free_host(buf)
    assert client.unmapped == [buf.ctypes.data] and not jax_device._MAPPED
    refusing = _Client(fail=True)  # a client without DMA mapping: plain memory
    monkeypatch.setattr(jax_device, "_accelerator_client", lambda: refusing)
    buf = eng.alloc_host(100)
    eng.free_host(buf)
    assert refusing.unmapped == [] and not jax_device._MAPPED
