"""The command line, run as a real subprocess (API.md section 8)."""

import os
import shutil
import subprocess
import sys
import tempfile

import numpy as np

import pyckpt


def _cli(*args, **kw):
    exe = shutil.which("pyckpt")
    cmd = [exe, *args] if exe else [sys.executable, "-m", "pyckpt", *args]
    kw.setdefault("cwd", tempfile.gettempdir())  # `python -m` must not see a source checkout
    return subprocess.run(cmd, capture_output=True, text=True, timeout=120, **kw)


def test_demo_runs_and_reports_each_step(tmp_path):
    r = _cli("demo", "--dir", str(tmp_path))
    assert r.returncode == 0, r.stderr
    for word in ("saved", "inspect", "verify", "load", "latest"):
        assert word in r.stdout
    assert "NO" not in r.stdout
    assert pyckpt.latest_checkpoint(tmp_path) is not None


def test_verify_exit_status(ckpt_dir, flip, shard_files):
    pyckpt.save({"x": np.arange(1000.0)}, ckpt_dir)
    ok = _cli("verify", ckpt_dir)
    assert ok.returncode == 0 and "OK" in ok.stdout
    flip(shard_files(ckpt_dir)[0], 100)
    bad = _cli("verify", ckpt_dir)
    assert bad.returncode == 1 and "checksum mismatch" in bad.stderr
    missing = _cli("verify", os.path.join(ckpt_dir, "nope"))
    assert missing.returncode == 1
