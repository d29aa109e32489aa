"""A fake device for the device paths: ``FakeTensor`` values live in "device
memory" served by a LateCopyEngine (copies land late and out of order)."""

import numpy as np
import pytest

import pyckpt
from pyckpt.registry import _ADAPTERS, register_adapter
from pyckpt.testing.late_copies import LateCopyEngine


class FakeTensor:
    """A framework tensor whose memory the host cannot read directly."""

    def __init__(self, data, key=""):
        self._data = np.ascontiguousarray(data)
        self.key = key

    # what the "framework" lets the user do, on the device
    def add_(self, x):
        self._data += x
        return self

    def numpy(self):
        return self._data.copy()


@pytest.fixture
def fake_device():
    engine = LateCopyEngine(delay=0.01, seed=7)
    before = list(_ADAPTERS)

    def leaf(obj):
        return engine.array(obj._data, obj.key) if isinstance(obj, FakeTensor) else None

    def empty(device, shape, dtype):
        return FakeTensor(np.empty(shape, dtype)) if str(device) == "fake:0" else None

    register_adapter("fake-device", leaf=leaf, target=leaf, empty=empty)
    try:
        yield engine
    finally:
        engine.synchronize()
        _ADAPTERS[:] = before
        pyckpt.device.release_staging_memory()


def tensor(shape, dtype=np.float32, seed=0, key=""):
    rng = np.random.default_rng(seed)
    return FakeTensor(rng.standard_normal(shape).astype(dtype), key)


def layer_state(n, seed=0, rows=64, cols=33):
    """n FakeTensors "layer{i}/w" of (rows, cols + i) values, keyed as a flat state."""
    return {f"layer{i}/w": tensor((rows, cols + i), seed=seed + i, key=f"layer{i}/w")
            for i in range(n)}


def values_of(state):
    """The values of a state of FakeTensors, as numpy arrays (copies)."""
    return {k: v.numpy() for k, v in state.items()}
