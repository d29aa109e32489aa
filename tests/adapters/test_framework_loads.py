"""Issue 22, item 1 and 2: what you save is what you get back. ``pyckpt.load``
returns torch tensors for tensors saved from torch, JAX arrays for JAX arrays,
numpy for numpy; ``as_numpy=True`` asks for numpy always."""

import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from pyckpt.testing.requirements import require

torch = require("torch")

import pyckpt  # noqa: E402


def _model(seed):
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.BatchNorm1d(3))


def _trained(seed):
    m = _model(seed)
    opt = torch.optim.Adam(m.parameters(), lr=0.01)
    for _ in range(2):
        opt.zero_grad()
        m(torch.randn(5, 4)).sum().backward()
        opt.step()
    return m, opt


def test_load_state_dict_habit(tmp_path):
    """model.load_state_dict(pyckpt.load(p)["model"]) and the optimizer's."""
    m, opt = _trained(0)
    p = tmp_path / "ckpt-1"
    pyckpt.save({"model": m.state_dict(), "opt": opt.state_dict(), "step": 7,
                 "mask": np.arange(3)}, p)
    loaded = pyckpt.load(p)
    assert isinstance(loaded["model"]["0.weight"], torch.Tensor)
    assert isinstance(loaded["mask"], np.ndarray) and type(loaded["step"]) is int
    m2, opt2 = _trained(1)
    m2.load_state_dict(loaded["model"])
    opt2.load_state_dict(loaded["opt"])
    for k, v in m.state_dict().items():
        assert torch.equal(m2.state_dict()[k], v), k
    a, b = opt.state_dict(), opt2.state_dict()
    assert a["param_groups"] == b["param_groups"]
    for i, slots in a["state"].items():
        for name, v in slots.items():
            assert torch.equal(b["state"][i][name], v), (i, name)
    # both go on training identically
    x = torch.randn(5, 4)
    for model, o in ((m, opt), (m2, opt2)):
        o.zero_grad()
        model(x).sum().backward()
        o.step()
    assert torch.equal(m[0].weight, m2[0].weight)


def test_dtypes_and_the_loaded_tensor_owns_fresh_memory(tmp_path):
    require("ml_dtypes")
    sd = {"bf16": torch.randn(4, 3).to(torch.bfloat16), "i64": torch.arange(5),
          "zero_d": torch.tensor(2.5), "t": torch.randn(3, 5).t(), "empty": torch.zeros(0, 2)}
    pyckpt.save(sd, tmp_path / "c")
    out = pyckpt.load(tmp_path / "c")
    for k, v in sd.items():
        assert isinstance(out[k], torch.Tensor) and out[k].dtype == v.dtype, k
        assert torch.equal(out[k], v), k
    out["i64"] += 1  # writable, and not shared with anything else
    assert torch.equal(pyckpt.load(tmp_path / "c")["i64"], sd["i64"])


def test_as_numpy_mmap_device_and_key_map(tmp_path):
    m = _model(0)
    pyckpt.save({"model": m.state_dict()}, tmp_path / "c")
    w = m.state_dict()["0.weight"]
    as_np = pyckpt.load(tmp_path / "c", as_numpy=True)["model"]["0.weight"]
    assert type(as_np) is np.ndarray and np.array_equal(as_np, w.numpy())
    view = pyckpt.load(tmp_path / "c", mmap=True)["model"]["0.weight"]
    assert isinstance(view, np.ndarray) and not view.flags.writeable  # file-backed: numpy
    on_cpu = pyckpt.load(tmp_path / "c", device="cpu")["model"]["0.weight"]
    assert isinstance(on_cpu, torch.Tensor) and torch.equal(on_cpu, w)
    mapped = pyckpt.load(tmp_path / "c", key_map=lambda k: "m1/" + k)
    assert isinstance(mapped["m1"]["model"]["0.weight"], torch.Tensor)
    picked = pyckpt.load(tmp_path / "c", select=["model/0.*"])
    assert isinstance(picked["model"]["0.weight"], torch.Tensor)


def test_a_module_inside_a_tree_gets_the_state_dict_hint(tmp_path):
    with pytest.raises(TypeError, match=r"at 'model': save its state, e\.g\. "
                                        r"\{'model': obj\.state_dict\(\)\}"):
        pyckpt.save({"model": _model(0)}, tmp_path / "c")
    assert not (tmp_path / "c").exists()


def test_without_torch_installed_loads_give_numpy(tmp_path):
    """A checkpoint of torch tensors loads as numpy where torch cannot be imported."""
    pyckpt.save({"w": torch.arange(6.0).reshape(2, 3), "n": 1}, tmp_path / "c")
    code = textwrap.dedent(f"""
        import sys
        sys.modules["torch"] = None  # import torch raises ImportError
        import numpy as np, pyckpt
        out = pyckpt.load({str(tmp_path / "c")!r})
        assert type(out["w"]) is np.ndarray, type(out["w"])
        assert out["w"].tolist() == [[0.0, 1.0, 2.0], [3.0, 4.0, 5.0]] and out["n"] == 1
        print("ok")
    """)
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                       env=dict(os.environ), cwd=tmp_path)
    assert r.returncode == 0 and r.stdout.strip() == "ok", r.stderr


def test_checkpoints_without_framework_records_load_as_before():
    """The golden checkpoint of format v1 holds no framework record: numpy, as before."""
    golden = os.path.join(os.path.dirname(__file__), "..", "format", "golden", "v1")
    out = pyckpt.load(golden)
    leaves = []
    stack = [out]
    while stack:
        node = stack.pop()
        if isinstance(node, dict):
            stack.extend(node.values())
        elif isinstance(node, (list, tuple)):
            stack.extend(node)
        else:
            leaves.append(node)
    assert any(isinstance(v, np.ndarray) for v in leaves)
    assert not any(isinstance(v, torch.Tensor) for v in leaves)


def test_jax_pytrees_load_nested_and_restore_text_leaves(tmp_path):
    jax = require("jax")
    jnp = require("jax.numpy")
    from typing import NamedTuple

    from pyckpt.adapters import jax_support

    class Dense(NamedTuple):
        w: jax.Array
        b: jax.Array

    tree = {"params": {"dense": Dense(jnp.ones((2, 2)), jnp.zeros(2))},
            "layers": [jnp.arange(3.0), jnp.full((1,), 7)], "run": "run-7", "raw": b"\x00x",
            "step": 3}
    jax_support.save(tree, tmp_path / "j")
    plain = pyckpt.load(tmp_path / "j")
    assert set(plain) == {"params", "layers", "run", "raw", "step"}
    assert isinstance(plain["params"]["dense"]["w"], jax.Array)
    assert isinstance(plain["layers"], list) and len(plain["layers"]) == 2
    assert plain["run"] == "run-7" and plain["raw"] == b"\x00x" and plain["step"] == 3
    assert [k for k, _ in pyckpt.list_variables(tmp_path / "j")] == [
        "layers/0", "layers/1", "params/dense/b", "params/dense/w", "step"]
    target = jax.tree_util.tree_map(lambda x: x, tree)
    back = jax_support.restore(tmp_path / "j", target)
    assert back["run"] == "run-7" and back["raw"] == b"\x00x"
    assert isinstance(back["params"]["dense"], Dense)
    np.testing.assert_array_equal(np.asarray(back["layers"][1]), [7])
    with pytest.raises(pyckpt.CheckpointError, match="'other'"):
        jax_support.restore(tmp_path / "j", {**target, "other": "x"})


def test_device_load_of_a_dtype_torch_lacks_names_the_key(tmp_path):
    pyckpt.save({"vocab": np.array(["ab", "c"]), "w": np.ones(2)}, tmp_path / "c")
    with pytest.raises(TypeError, match="'vocab': cannot be loaded with device='cpu'.*<U2"):
        pyckpt.load(tmp_path / "c", device="cpu")
    got = pyckpt.load(tmp_path / "c", device="cpu", select="w")
    assert isinstance(got["w"], torch.Tensor) and torch.equal(got["w"], torch.ones(2, dtype=torch.float64))
