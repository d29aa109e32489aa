"""Issue 38 item 4: bf16 out of the box. ml_dtypes is a dependency of the package; and
where it is missing all the same (an environment installed with --no-deps), a healthy
checkpoint holding bf16 verifies (its bytes are checked, the dtype reported apart),
and loading its values fails naming the key, the dtype and ``pip install ml_dtypes``.

ml_dtypes is hidden from a subprocess by a ``sys.meta_path`` finder."""

import json
import os
import shutil
import subprocess
import sys

import ml_dtypes
import numpy as np
import pytest

import pyckpt

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DCP = os.path.join(ROOT, "tests", "interop_dcp", "fixtures", "ckpt")
BF16 = np.array([1.5, -2.25, 3.0], dtype=ml_dtypes.bfloat16)  # DCP's plain.bf16

# runs each command line (argv lists) and each load with ml_dtypes hidden; prints JSON
WITHOUT_ML_DTYPES = r"""
import contextlib, io, json, sys

class _Hide:
    def find_spec(self, name, path=None, target=None):
        if name == "ml_dtypes" or name.startswith("ml_dtypes."):
            raise ImportError(f"No module named {name!r}")
        return None

sys.meta_path.insert(0, _Hide())
import pyckpt
from pyckpt.cli import main

out = {"ml_dtypes": "ml_dtypes" in sys.modules, "cli": [], "load": []}
for argv in json.loads(sys.argv[1]):
    o, e = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(o), contextlib.redirect_stderr(e):
        rc = main(argv)
    out["cli"].append({"rc": rc, "out": o.getvalue(), "err": e.getvalue()})
for path in json.loads(sys.argv[2]):
    try:
        pyckpt.load(path)
        out["load"].append(None)
    except Exception as exc:
        out["load"].append([type(exc).__name__, str(exc), isinstance(exc, ImportError),
                            isinstance(exc, pyckpt.CheckpointError)])
print(json.dumps(out))
"""


def _without_ml_dtypes(tmp_path, commands, loads=()):
    r = subprocess.run([sys.executable, "-c", WITHOUT_ML_DTYPES, json.dumps(commands),
                        json.dumps(list(loads))], capture_output=True, text=True,
                       cwd=str(tmp_path), timeout=300)
    assert r.returncode == 0, r.stderr
    got = json.loads(r.stdout.strip().splitlines()[-1])
    assert got["ml_dtypes"] is False
    return got


def _flip(path, pos):
    with open(path, "r+b") as f:
        f.seek(pos)
        b = f.read(1)
        f.seek(pos)
        f.write(bytes([b[0] ^ 0x01]))


def test_ml_dtypes_is_a_dependency_of_the_package():
    tomllib = pytest.importorskip("tomllib")  # Python 3.11+
    with open(os.path.join(ROOT, "pyproject.toml"), "rb") as f:
        project = tomllib.load(f)["project"]
    assert any(d.replace(" ", "").startswith("ml_dtypes") for d in project["dependencies"])
    # the old extra still installs (an alias): pip install "pyckpt[bf16]"
    assert any(d.startswith("ml_dtypes") for d in project["optional-dependencies"]["bf16"])


def test_bf16_saves_and_loads_out_of_the_box(tmp_path):
    import torch

    w = torch.randn(4, 3, dtype=torch.bfloat16)
    pyckpt.save({"np": BF16, "w": w}, str(tmp_path / "ck"))
    got = pyckpt.load(str(tmp_path / "ck"))
    assert got["np"].dtype == ml_dtypes.bfloat16 and (got["np"] == BF16).all()
    assert got["w"].dtype == torch.bfloat16 and torch.equal(got["w"], w)


def test_a_healthy_bf16_checkpoint_verifies_without_ml_dtypes(tmp_path):
    ours = str(tmp_path / "ours")
    pyckpt.save({"w": BF16, "x": np.arange(3)}, ours)
    bad_ours = str(tmp_path / "bad_ours")
    shutil.copytree(ours, bad_ours)
    data = [f for f in os.listdir(bad_ours) if f != "pyckpt.index"][0]
    at = open(os.path.join(bad_ours, data), "rb").read().find(BF16.tobytes())
    _flip(os.path.join(bad_ours, data), at + 1)
    bad_dcp = str(tmp_path / "bad_dcp")
    shutil.copytree(DCP, bad_dcp)
    at = open(os.path.join(bad_dcp, "__1_0.distcp"), "rb").read().find(BF16.tobytes())
    assert at > 0
    _flip(os.path.join(bad_dcp, "__1_0.distcp"), at + 1)

    got = _without_ml_dtypes(tmp_path, [
        ["verify", DCP], ["verify", ours], ["verify", "--json", ours],
        ["verify", bad_dcp], ["verify", bad_ours], ["inspect", DCP], ["ls", ours],
    ], [DCP, ours])
    dcp, mine, mine_json, broken_dcp, broken_ours, inspect, ls = got["cli"]
    for r in (dcp, mine):
        assert r["rc"] == 0, r["err"]
        assert r["out"].startswith("OK: ") and "every checksum matches" in r["out"]
        assert "bfloat16" in r["out"] and "pip install ml_dtypes" in r["out"]
    assert "2 tensor(s)" in dcp["out"]  # model.cols and plain.bf16
    assert json.loads(mine_json["out"])["undecodable"] == {"w": "bfloat16"}
    # the bytes are still checked: a flipped bit in a bf16 value fails
    for r in (broken_dcp, broken_ours):
        assert r["rc"] == 1 and "FAILED" in r["err"], r
    assert inspect["rc"] == 0 and "plain.bf16" in inspect["out"]
    assert "bfloat16" in inspect["out"]
    assert ls["rc"] == 0 and "committed" in ls["out"], ls
    # the values cannot be loaded: a clear error naming the key, the dtype and the fix
    for (name, message, is_import, is_ours), key in zip(got["load"], ("model.cols", "w")):
        assert name == "DtypeUnavailableError" and is_import and is_ours
        assert repr(key) in message and "bfloat16" in message
        assert "pip install ml_dtypes" in message
