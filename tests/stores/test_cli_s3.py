"""The command line against the loopback S3 server (issue 7)."""

import json
import shutil
import subprocess
import sys
import tempfile

import numpy as np

import pyckpt


def _cli(*args):
    exe = shutil.which("pyckpt")
    cmd = [exe, *args] if exe else [sys.executable, "-m", "pyckpt", *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=120, cwd=tempfile.gettempdir())


def _opts(so):
    return [f"--storage-option={k}={v}" for k, v in so.items() if k != "config_kwargs"]


def test_cli_on_a_bucket(tmp_path, seaweed_options):
    local = tmp_path / "ckpt-7"
    pyckpt.save({"w": np.arange(1000.0), "s": 5}, local)
    url = "s3://pyckpt/cli/ckpt-7"
    r = _cli("cp", str(local), url, *_opts(seaweed_options))
    assert r.returncode == 0, r.stderr
    rows = json.loads(_cli("ls", "s3://pyckpt/cli", "--json", *_opts(seaweed_options)).stdout)
    assert [(x["name"], x["step"], x["status"]) for x in rows] == [("ckpt-7", 7, "committed")]
    assert _cli("verify", url, *_opts(seaweed_options)).returncode == 0
    info = json.loads(_cli("inspect", url, "w", "--json", *_opts(seaweed_options)).stdout)
    assert info["max"] == 999.0
    back = _cli("cp", url, str(tmp_path / "back"), *_opts(seaweed_options))
    assert back.returncode == 0, back.stderr
    assert _cli("diff", str(local), str(tmp_path / "back")).returncode == 0
