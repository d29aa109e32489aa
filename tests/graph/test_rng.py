"""Issue 14: random generators are checkpointed and restored exactly, and
pyckpt.GlobalRNG() captures the process's global random state (docs/API.md
section 11)."""

import random

import numpy as np
import pytest

import pyckpt


def same_state(a, b):
    """Equal states (nested dicts of ints, strings and arrays), types included."""
    if isinstance(a, dict):
        return type(b) is dict and list(a) == list(b) and all(same_state(a[k], b[k]) for k in a)
    if isinstance(a, np.ndarray):
        return isinstance(b, np.ndarray) and a.dtype == b.dtype and np.array_equal(a, b)
    return type(a) is type(b) and a == b


def round_trip(tmp_path, obj, fresh):
    """Saves ``obj`` and restores it into ``fresh``, asserting everything matched."""
    path = pyckpt.Checkpoint(g=obj).write(tmp_path / "c")
    pyckpt.Checkpoint(g=fresh).read(path).assert_consumed()
    return path


@pytest.mark.parametrize("bit_generator", ["PCG64", "PCG64DXSM", "MT19937", "Philox", "SFC64"])
def test_numpy_generators(tmp_path, bit_generator):
    make = getattr(np.random, bit_generator)
    g = np.random.Generator(make(11))
    g.random(5)
    g.integers(0, 10, 3, dtype=np.uint32)  # leaves a buffered half word (has_uint32)
    fresh = np.random.Generator(make(0))
    round_trip(tmp_path, g, fresh)
    assert same_state(fresh.bit_generator.state, g.bit_generator.state)
    assert np.array_equal(fresh.random(20), g.random(20))
    assert np.array_equal(fresh.integers(0, 2 ** 62, 7), g.integers(0, 2 ** 62, 7))


def test_numpy_bit_generator_alone(tmp_path):
    bg = np.random.PCG64(3)
    bg.random_raw(5)
    fresh = np.random.PCG64(4)
    round_trip(tmp_path, bg, fresh)
    assert np.array_equal(fresh.random_raw(5), bg.random_raw(5))


def test_numpy_generator_of_another_kind_is_refused(tmp_path):
    path = pyckpt.Checkpoint(g=np.random.Generator(np.random.PCG64(1))).write(tmp_path / "c")
    with pytest.raises(ValueError):
        pyckpt.Checkpoint(g=np.random.Generator(np.random.Philox(1))).read(path)


def test_legacy_random_state(tmp_path):
    rs = np.random.RandomState(5)
    rs.standard_normal()  # leaves a cached Gaussian
    fresh = np.random.RandomState(6)
    round_trip(tmp_path, rs, fresh)
    assert fresh.standard_normal() == rs.standard_normal()
    assert np.array_equal(fresh.rand(10), rs.rand(10))


def test_python_random(tmp_path):
    r = random.Random(5)
    r.gauss(0, 1)  # leaves gauss_next set
    fresh = random.Random(6)
    round_trip(tmp_path, r, fresh)
    assert fresh.getstate() == r.getstate()
    assert [fresh.gauss(0, 1) for _ in range(3)] == [r.gauss(0, 1) for _ in range(3)]


def test_system_random_has_no_state():
    with pytest.raises(TypeError, match="Checkpoint attribute 'g'"):
        pyckpt.Checkpoint(g=random.SystemRandom())


def test_generators_in_containers_and_modules(tmp_path):
    m = pyckpt.Module()
    m.rng = np.random.default_rng(1)
    m.gens = [random.Random(2), {"np": np.random.default_rng(3)}]
    path = pyckpt.Checkpoint(m=m).write(tmp_path / "c")
    expected = (m.rng.random(), m.gens[0].random(), m.gens[1]["np"].random())
    m2 = pyckpt.Module()
    m2.rng = np.random.default_rng(0)
    m2.gens = [random.Random(0), {"np": np.random.default_rng(0)}]
    pyckpt.Checkpoint(m=m2).read(path).assert_consumed()
    assert (m2.rng.random(), m2.gens[0].random(), m2.gens[1]["np"].random()) == expected


def test_global_rng_python_and_numpy(tmp_path):
    random.seed(1)
    np.random.seed(2)
    random.random()
    np.random.rand(3)
    path = pyckpt.Checkpoint(rng=pyckpt.GlobalRNG()).write(tmp_path / "c")
    expected = (random.random(), np.random.rand(4).tolist(), np.random.standard_normal())
    random.seed(99)
    np.random.seed(99)
    pyckpt.Checkpoint(rng=pyckpt.GlobalRNG()).read(path).assert_consumed()
    assert (random.random(), np.random.rand(4).tolist(), np.random.standard_normal()) == expected


def test_global_rng_restores_when_created_later(tmp_path):
    np.random.seed(2)
    path = pyckpt.Checkpoint(rng=pyckpt.GlobalRNG()).write(tmp_path / "c")
    expected = np.random.rand(3)
    np.random.seed(5)
    ckpt = pyckpt.Checkpoint()
    status = ckpt.read(path)
    ckpt.rng = pyckpt.GlobalRNG()  # restore-on-create
    status.assert_consumed()
    assert np.array_equal(np.random.rand(3), expected)


def test_global_rng_parts(tmp_path):
    only = pyckpt.GlobalRNG(parts=("numpy",))
    assert list(only.state_dict()) == ["numpy"]
    with pytest.raises(ValueError, match="unknown part"):
        pyckpt.GlobalRNG(parts=("nope",))
    with pytest.raises(ValueError, match="cannot restore"):
        pyckpt.GlobalRNG().load_state_dict({"nope": {}})


def test_torch_global_and_generators(tmp_path):
    torch = pytest.importorskip("torch")
    torch.manual_seed(3)
    torch.rand(2)
    g = torch.Generator().manual_seed(4)
    ckpt = pyckpt.Checkpoint(rng=pyckpt.GlobalRNG(), g=g, default=torch.default_generator)
    assert "torch" in ckpt.rng.state_dict()
    path = ckpt.write(tmp_path / "c")
    expected = (torch.rand(5), torch.rand(5, generator=g),
                torch.nn.functional.dropout(torch.ones(8), 0.5))
    torch.manual_seed(100)
    g2 = torch.Generator().manual_seed(100)
    pyckpt.Checkpoint(rng=pyckpt.GlobalRNG(), g=g2, default=torch.default_generator) \
        .read(path).assert_consumed()
    got = (torch.rand(5), torch.rand(5, generator=g2),
           torch.nn.functional.dropout(torch.ones(8), 0.5))
    for a, b in zip(got, expected):
        assert torch.equal(a, b)


def test_torch_cuda_generators(tmp_path):
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    torch.cuda.manual_seed_all(3)
    torch.rand(2, device="cuda")
    g = torch.Generator(device="cuda").manual_seed(4)
    path = pyckpt.Checkpoint(rng=pyckpt.GlobalRNG(), g=g).write(tmp_path / "c")
    state = pyckpt.GlobalRNG().state_dict()["torch"]
    assert len(state["cuda"]) == torch.cuda.device_count()
    expected = (torch.rand(5, device="cuda"), torch.rand(5, device="cuda", generator=g))
    torch.cuda.manual_seed_all(100)
    g2 = torch.Generator(device="cuda").manual_seed(100)
    pyckpt.Checkpoint(rng=pyckpt.GlobalRNG(), g=g2).read(path).assert_consumed()
    got = (torch.rand(5, device="cuda"), torch.rand(5, device="cuda", generator=g2))
    for a, b in zip(got, expected):
        assert torch.equal(a, b)


def test_jax_keys(tmp_path):
    jax = pytest.importorskip("jax")
    key = jax.random.PRNGKey(7)
    _, sub = jax.random.split(key)
    path = pyckpt.Checkpoint(state={"key": sub}).write(tmp_path / "c")
    ckpt = pyckpt.Checkpoint(state={"key": jax.random.PRNGKey(0)})
    ckpt.read(path).assert_consumed()
    assert isinstance(ckpt.state["key"], jax.Array)
    assert np.array_equal(np.asarray(ckpt.state["key"]), np.asarray(sub))
    assert np.array_equal(np.asarray(jax.random.uniform(ckpt.state["key"], (3,))),
                          np.asarray(jax.random.uniform(sub, (3,))))
    # flat saves keep them too
    pyckpt.save({"key": sub}, tmp_path / "flat")
    assert np.array_equal(pyckpt.load(tmp_path / "flat")["key"], np.asarray(sub))
