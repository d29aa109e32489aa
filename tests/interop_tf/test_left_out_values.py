"""Issue 22, attack 2: conversions to formats that hold tensors only (TensorFlow's,
safetensors) name every value they leave out, in a warning from Python and on the
command line's stderr; before, `run` and `tags` vanished without a word."""

import subprocess
import sys

import numpy as np
import pytest

import pyckpt
from pyckpt.interop import safetensors as st
from pyckpt.interop import tensorflow as tfio


def _object_ckpt(path):
    ck = pyckpt.Checkpoint(cfg={"lr": 0.1, "run": "run-7", "tags": ["warmup", "bf16"]},
                           w=np.arange(3.0))
    ck.write(path)
    restored = pyckpt.Checkpoint(cfg={"lr": 0.0, "run": "", "tags": ["", ""]}, w=np.zeros(3))
    restored.read(path).assert_consumed()  # pyckpt's own format keeps all three
    assert restored.cfg["run"] == "run-7" and list(restored.cfg["tags"]) == ["warmup", "bf16"]
    return path


def test_tensorflow_export_names_what_it_leaves_out(tmp_path):
    src = _object_ckpt(str(tmp_path / "c"))
    with pytest.warns(UserWarning, match=r"3 value\(s\) left out of the TensorFlow checkpoint"
                                         r".*cfg/run \(str\), cfg/tags/0 \(str\), cfg/tags/1"):
        tfio.save(src, str(tmp_path / "tf" / "ckpt-1"))
    keys = [k for k, _ in pyckpt.list_variables(str(tmp_path / "tf" / "ckpt-1"))]
    assert any(k.startswith("cfg/lr") for k in keys)  # the number is written
    with pytest.warns(UserWarning, match=r"left out.*name \(str\), none \(NoneType\)"):
        tfio.save({"a": np.ones(2), "name": "x", "none": None}, str(tmp_path / "tf" / "ckpt-2"))


def test_safetensors_export_names_what_it_leaves_out(tmp_path):
    pyckpt.save({"a": np.ones(2), "name": "run-7", "raw": b"\x01"}, tmp_path / "f")
    with pytest.warns(UserWarning, match=r"2 value\(s\) left out of the safetensors file: .*"
                                         r"name \(str\), raw \(bytes\)"):
        st.from_checkpoint(tmp_path / "f", tmp_path / "f.safetensors")
    assert [k for k, _ in pyckpt.list_variables(tmp_path / "f.safetensors")] == ["a"]


def test_nothing_left_out_means_no_warning(tmp_path, recwarn):
    pyckpt.save({"a": np.ones(2), "n": 3}, tmp_path / "f")
    st.from_checkpoint(tmp_path / "f", tmp_path / "f.safetensors")
    tfio.save(str(tmp_path / "f"), str(tmp_path / "tf" / "ckpt-1"))
    assert not [w for w in recwarn if "left out" in str(w.message)]


@pytest.mark.parametrize("fmt", ["tf", "safetensors"])
def test_cli_prints_the_warning_on_stderr(tmp_path, fmt):
    src = _object_ckpt(str(tmp_path / "c"))
    dst = str(tmp_path / ("out/ckpt-1" if fmt == "tf" else "out.safetensors"))
    r = subprocess.run([sys.executable, "-m", "pyckpt", "cp", src, dst, "--format", fmt],
                       capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    warn = [ln for ln in r.stderr.splitlines() if ln.startswith("pyckpt: warning: ")]
    assert len(warn) == 1, r.stderr
    for name in ("cfg/run", "cfg/tags/0", "cfg/tags/1"):
        assert name in warn[0]
