"""Writing TensorFlow checkpoints, checked by TensorFlow itself.

Each TensorFlow use runs in its own process (tf_side.py), never beside torch or
pyckpt. These tests are skipped, with the reason printed, only when tensorflow
cannot be imported (CI installs tensorflow-cpu: there a missing TensorFlow fails,
PYCKPT_REQUIRE_ALL=1). PYCKPT_TF_PYTHON names another interpreter to run
TensorFlow with (default: this one).
"""

import importlib.util
import json
import os
import subprocess
import sys
import warnings

import numpy as np
import pytest

import pyckpt
from pyckpt.interop import tensorflow as tfio
from pyckpt.testing.requirements import REQUIRE_ALL

HERE = os.path.dirname(os.path.abspath(__file__))
TF_PYTHON = os.environ.get("PYCKPT_TF_PYTHON", sys.executable)


def _tensorflow_importable() -> bool:
    if TF_PYTHON == sys.executable:
        return importlib.util.find_spec("tensorflow") is not None
    return subprocess.run([TF_PYTHON, "-c", "import tensorflow"], capture_output=True).returncode == 0


@pytest.fixture(scope="module", autouse=True)
def tensorflow_available():
    if not _tensorflow_importable():
        msg = f"tensorflow is not importable by {TF_PYTHON} (pip install tensorflow-cpu)"
        if REQUIRE_ALL:
            pytest.fail(f"PYCKPT_REQUIRE_ALL=1 but {msg}")
        pytest.skip(msg)


def tf_side(*args: str) -> dict:
    """Runs tf_side.py in a fresh process and returns its JSON answer."""
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3", CUDA_VISIBLE_DEVICES="")
    proc = subprocess.run([TF_PYTHON, os.path.join(HERE, "tf_side.py"), *args],
                          capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def expected_from(path: str, out: str) -> str:
    """The values of a checkpoint as an npz for tf_side.py (bfloat16 as uint16)."""
    r = pyckpt.load_checkpoint(path)
    values = {}
    for k in r.keys():
        if k == "_CHECKPOINTABLE_OBJECT_GRAPH":
            continue
        try:
            v = r.get_tensor(k)
        except tfio.UnsupportedTensorError:  # a variant: not converted
            continue
        values[k] = v.view(np.uint16) if v.dtype.name == "bfloat16" else v
    np.savez(out, **values)
    return out


def all_dtypes_tree():
    rng = np.random.default_rng(5)
    ml = pytest.importorskip("ml_dtypes")
    tree = {
        "f16": rng.standard_normal((3, 2)).astype(np.float16),
        "f32": rng.standard_normal((17,)).astype(np.float32),
        "f64": np.array([np.pi, -np.inf, np.nan]),
        "bf16": rng.standard_normal((4, 4)).astype(ml.bfloat16),
        "i8": np.array([-128, 127], np.int8), "i16": np.arange(6, dtype=np.int16).reshape(2, 3),
        "i32": np.array([[-(2 ** 31)]], np.int32), "i64": np.array(2 ** 62 + 1, np.int64),
        "u8": np.arange(256, dtype=np.uint8), "u16": np.array([65535], np.uint16),
        "u32": np.array([2 ** 32 - 1], np.uint32), "u64": np.array([2 ** 64 - 1], np.uint64),
        "bool": np.array([True, False, True]), "c64": np.array([1 + 2j], np.complex64),
        "c128": np.array([[3 - 4j, 0j]], np.complex128), "empty": np.zeros((0, 5), np.float32),
        "scalar": np.float32(1.5), "big": rng.standard_normal((700, 1024)).astype(np.float32),
        "strided": np.arange(20, dtype=np.int32).reshape(4, 5)[:, ::2],
        "layers": [{"w": rng.standard_normal((8, 8)).astype(np.float32)} for _ in range(3)],
        "many": {f"t{i:04d}": np.full((2,), i, np.int64) for i in range(600)},  # a multi-block index
    }
    strings = np.empty((2, 2), dtype=object)
    strings[:] = [[b"", b"tensorflow"], ["unicode \u00e9".encode(), bytes(range(256)) * 40]]
    tree["strings"] = strings
    return tree


def test_tree_as_name_based_checkpoint(tmp_path):
    prefix = str(tmp_path / "tf" / "model.ckpt-7")
    assert tfio.save(all_dtypes_tree(), prefix) == prefix
    assert os.path.exists(prefix + ".index")
    got = tf_side("read", prefix, expected_from(prefix, str(tmp_path / "want.npz")))
    assert got["bad"] == [] and got["extra"] == [] and got["checked"] > 600
    assert not got["object_graph"]
    latest = tf_side("latest", str(tmp_path / "tf"))
    assert latest["latest"] == prefix and latest["manager_latest"] == prefix
    # and pyckpt reads back what it wrote
    r = pyckpt.load_checkpoint(prefix)
    assert r.get_tensor("strings").tolist()[1][1] == bytes(range(256)) * 40
    r.verify()


class Model(pyckpt.Module):
    pass


def pyckpt_model():
    rng = np.random.default_rng(9)
    ml = pytest.importorskip("ml_dtypes")
    m = Model()
    m.w = pyckpt.Variable(rng.standard_normal((3, 4)).astype(np.float32))
    m.half = pyckpt.Variable(np.array([1.5, -2], np.float16))
    m.bf = pyckpt.Variable(rng.standard_normal((2, 2)).astype(ml.bfloat16))
    m.steps = pyckpt.Variable(np.int64(123))
    m.flags = pyckpt.Variable(np.array([True, False, True]))
    m.z = pyckpt.Variable(np.array([1j, 2], np.complex128))
    m.layers = [pyckpt.Variable(np.full((2,), i + 0.5, np.float32)) for i in range(3)]
    m.table = {"a.b": pyckpt.Variable(np.int32(7)), "c/d": pyckpt.Variable(np.int32(8)),
               "nested": {"x": pyckpt.Variable(np.array([2.25]))}}
    m.child = Model()
    m.child.v = pyckpt.Variable(np.arange(5, dtype=np.int8))
    m.shared = m.child.v
    return m


def test_object_based_checkpoint_restores_in_tensorflow(tmp_path):
    ckpt = pyckpt.Checkpoint(model=pyckpt_model())
    ckpt.save(str(tmp_path / "py" / "ckpt"))
    path = ckpt.save(str(tmp_path / "py" / "ckpt"))  # ckpt-2: save_counter 2
    prefix = tfio.save(path, str(tmp_path / "tf" / "ckpt-2"))
    got = tf_side("restore-mixed", prefix, expected_from(path, str(tmp_path / "want.npz")))
    assert got["bad"] == [] and got["save_counter"] == 2 and got["checked"] == 13
    got = tf_side("read", prefix, expected_from(path, str(tmp_path / "want.npz")))
    assert got["bad"] == [] and got["extra"] == [] and got["object_graph"]
    # pyckpt restores its own export like the original
    m = pyckpt_model()
    for v in [m.w, m.steps, m.layers[1]]:
        v.assign(np.zeros_like(v.numpy()))
    pyckpt.Checkpoint(model=m).restore(prefix).assert_consumed()
    assert int(m.steps) == 123 and float(m.layers[1].numpy()[0]) == 1.5


def test_tree_with_object_graph(tmp_path):
    rng = np.random.default_rng(1)
    tree = {"encoder": {"w": rng.standard_normal((4, 4)).astype(np.float32),
                        "layers": [np.arange(2.0), np.int64(5)]},
            "step": np.int64(42)}
    prefix = tfio.save(tree, str(tmp_path / "ckpt-1"), object_graph=True)
    want = {"encoder/w": tree["encoder"]["w"], "encoder/layers/0": tree["encoder"]["layers"][0],
            "encoder/layers/1": np.asarray(5, np.int64), "step": np.asarray(42, np.int64)}
    np.savez(tmp_path / "want.npz", **want)
    got = tf_side("restore-tree", prefix, str(tmp_path / "want.npz"))
    assert got["bad"] == [] and got["checked"] == 4


def test_cp_both_ways_through_tensorflow(fixtures, tmp_path):
    """TF (the training guide's ckpt-5) -> pyckpt -> TF, restored by TensorFlow."""
    src = os.path.join(fixtures, "training", "ckpt-5")
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        tfio.to_checkpoint(src, str(tmp_path / "py"))
    assert any("ITERATOR_STATE" in str(x.message) for x in w)  # a variant: left out
    assert pyckpt.load_checkpoint(str(tmp_path / "py")).source.format == "pyckpt"
    tfio.from_checkpoint(str(tmp_path / "py"), str(tmp_path / "back" / "ckpt-5"))
    prefix = str(tmp_path / "back" / "ckpt-5")
    got = tf_side("restore-guide", prefix, expected_from(src, str(tmp_path / "want.npz")))
    assert got["bad"] == [] and got["checked"] == 7


def test_replacing_a_checkpoint_and_state_file(tmp_path):
    d = tmp_path / "run"
    for step in (1, 2, 3):
        tfio.save({"x": np.full((3,), step, np.float32)}, str(d / f"ckpt-{step}"))
    tfio.save({"x": np.full((70000,), 9, np.float32)}, str(d / "ckpt-2"))  # replaced
    latest = tf_side("latest", str(d))
    assert latest["latest"] == str(d / "ckpt-2")
    assert latest["checkpoints"] == [str(d / f"ckpt-{s}") for s in (1, 3, 2)]
    assert pyckpt.latest_checkpoint(str(d)) == str(d / "ckpt-2")
    assert pyckpt.load_variable(str(d / "ckpt-2"), "x").shape == (70000,)
