"""JAX restores and loads (issue 40, item 5: the first restore as fast as the later
ones): nothing is compiled or traced on the way from a checkpoint to new jax.Arrays
(an eager ``jnp`` call compiles one program per new shape and dtype), host leaves are
placed by one ``device_put``, and leaves on an accelerator land through the reused
bounce buffers of ``device/loading.py`` without sharing their memory."""

import numpy as np
import pytest

from pyckpt.testing.requirements import require

jax = require("jax")

import pyckpt  # noqa: E402
from pyckpt.adapters import jax_device, jax_support  # noqa: E402
from pyckpt.device import loading  # noqa: E402


@pytest.fixture(autouse=True)
def _no_kept_buffers():
    yield
    pyckpt.device.release_staging_memory()


@pytest.fixture
def compiles():
    """The compile and trace events JAX records while the test runs."""
    seen: list[str] = []

    def listener(event, duration, **kwargs):
        if event.startswith("/jax/core/compile"):
            seen.append(event)

    jax.monitoring.register_event_duration_secs_listener(listener)
    yield seen
    jax.monitoring.unregister_event_duration_listener(listener)


def _tree(seed: int) -> dict:
    """Leaves of shapes and dtypes no other test uses (a compile per shape would show),
    made without compiling anything (``device_put`` of host arrays)."""
    rng = np.random.default_rng(seed)
    host = {"a": rng.integers(-999, 999, (3, 5, 7)).astype(np.int16),
            "b": {"c": rng.standard_normal((13, 3)).astype(jax.numpy.bfloat16),
                  "d": rng.standard_normal((2, 9, 1)).astype(np.float32)},
            "e": [np.array(rng.standard_normal(), np.float32),
                  rng.integers(0, 255, (17,)).astype(np.uint8)]}
    return jax.tree_util.tree_map(jax.device_put, host)


def _same(got, want) -> None:
    g, w = jax.tree_util.tree_leaves(got), jax.tree_util.tree_leaves(want)
    assert len(g) == len(w)
    for a, b in zip(g, w):
        assert isinstance(a, jax.Array) and a.dtype == b.dtype and a.shape == b.shape
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_restore_and_loads_compile_nothing(tmp_path, compiles):
    """``jax_support.restore``, ``pyckpt.load`` and ``Checkpoint.restore`` of JAX leaves of
    new shapes: no compile and no trace (``load`` used ``jnp.array``, one compiled
    program per shape and dtype: the first load of a state paid for all of them)."""
    tree, target = _tree(0), _tree(1)
    jax_support.save(tree, tmp_path / "t")
    flat = dict(enumerate(jax.tree_util.tree_leaves(tree)))
    pyckpt.Checkpoint(state=flat).write(tmp_path / "g")
    ckpt = pyckpt.Checkpoint(state=dict(enumerate(jax.tree_util.tree_leaves(target))))
    compiles.clear()
    _same(jax_support.restore(tmp_path / "t", target), tree)
    _same(pyckpt.load(tmp_path / "t"), tree)
    ckpt.restore(tmp_path / "g")
    _same(dict(ckpt.state), flat)
    assert compiles == []


def test_restored_leaves_keep_the_targets_placement(tmp_path):
    tree = _tree(2)
    jax_support.save(tree, tmp_path / "t")
    out = jax_support.restore(tmp_path / "t", _tree(3))
    _same(out, tree)
    for a, b in zip(jax.tree_util.tree_leaves(out), jax.tree_util.tree_leaves(tree)):
        assert a.sharding == b.sharding


def test_host_leaves_are_placed_by_one_device_put(tmp_path, monkeypatch):
    tree = _tree(4)
    jax_support.save(tree, tmp_path / "t")
    target = _tree(5)
    calls = []
    real = jax.device_put
    monkeypatch.setattr(jax, "device_put", lambda *a, **k: calls.append(a) or real(*a, **k))
    out = jax_support.restore(tmp_path / "t", target)
    _same(out, tree)
    assert len(calls) == 1 and len(calls[0][0]) == len(jax.tree_util.tree_leaves(tree))


def test_accelerator_leaves_land_through_the_bounce_buffers(tmp_path, monkeypatch):
    """Leaves taken as if on an accelerator: every new array is made by the JAX
    engine's ``to_device`` from a bounce buffer, placed like its target, and keeps its
    values when the next restore reuses the buffers (a CPU device must copy)."""
    monkeypatch.setattr(jax_support, "through_bounce_buffers", lambda leaf: True)
    made = []
    real = jax_device.JaxEngine.to_device

    def to_device(self, srcs, dsts):
        tickets = real(self, srcs, dsts)
        made.extend(d.obj.array for d in dsts)
        return tickets

    monkeypatch.setattr(jax_device.JaxEngine, "to_device", to_device)
    first, second = _tree(6), _tree(7)
    jax_support.save(first, tmp_path / "1")
    jax_support.save(second, tmp_path / "2")
    out1 = jax_support.restore(tmp_path / "1", _tree(8))
    assert loading.bounce_bytes() > 0  # kept for the next restore
    out2 = jax_support.restore(tmp_path / "2", _tree(9))
    _same(out1, first)
    _same(out2, second)
    leaves = jax.tree_util.tree_leaves(out1) + jax.tree_util.tree_leaves(out2)
    assert {id(a) for a in leaves} == {id(a) for a in made}
    for a, b in zip(jax.tree_util.tree_leaves(out1), jax.tree_util.tree_leaves(first)):
        assert a.sharding == b.sharding
