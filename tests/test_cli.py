"""The command line, run as a real subprocess (API.md section 8)."""

import os
import shutil
import subprocess
import sys
import tempfile

import numpy as np

import pyckpt
from pyckpt.testing.terminal import run_on_terminal


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
    assert "every checksum matches" in ok.stdout


def test_verify_of_a_safetensors_file_does_not_claim_checksums(tmp_path):
    """It printed "every checksum matches" for a format that stores none (a changed
    byte passed)."""
    pyckpt.save({"x": np.arange(10.0)}, tmp_path / "c")
    assert _cli("cp", str(tmp_path / "c"), str(tmp_path / "x.safetensors")).returncode == 0
    r = _cli("verify", str(tmp_path / "x.safetensors"))
    assert r.returncode == 0 and "checksum matches" not in r.stdout
    assert "safetensors stores no checksums" in r.stdout
    assert '"checksums": false' in _cli("verify", str(tmp_path / "x.safetensors"), "--json").stdout


def _state(rng_seed=0):
    rng = np.random.default_rng(rng_seed)
    return {"w": rng.standard_normal((50, 20)).astype(np.float32), "b": np.zeros(20),
            "step": 3, "big": np.arange(3_000_000, dtype=np.float64)}


def test_ls_inspect_and_json(tmp_path):
    import json

    pyckpt.save(_state(), tmp_path / "ckpt-1", metadata={"run": "a"})
    pyckpt.save(_state(1), tmp_path / "ckpt-2")
    (tmp_path / "ckpt-3").mkdir()
    (tmp_path / "ckpt-3" / "data-000000000000-00000-0000.bin").write_bytes(b"x")  # interrupted
    r = _cli("ls", str(tmp_path))
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert "ckpt-1" in lines[1] and "committed" in lines[1] and "ckpt-3" in lines[3]
    assert "uncommitted" in lines[3]
    rows = json.loads(_cli("ls", str(tmp_path), "--json").stdout)
    assert [(x["name"], x["step"], x["status"]) for x in rows] == [
        ("ckpt-1", 1, "committed"), ("ckpt-2", 2, "committed"), ("ckpt-3", 3, "uncommitted")]
    r = _cli("inspect", str(tmp_path / "ckpt-1"))
    assert "w" in r.stdout and "float32" in r.stdout and "(50, 20)" in r.stdout and "'run': 'a'" in r.stdout
    info = json.loads(_cli("inspect", str(tmp_path / "ckpt-1"), "--json").stdout)
    assert {t["key"] for t in info["tensors"]} == {"w", "b", "step", "big"}
    stats = json.loads(_cli("inspect", str(tmp_path / "ckpt-1"), "big", "--json").stdout)
    assert stats["min"] == 0 and stats["max"] == 2_999_999 and stats["shape"] == [3_000_000]
    missing = _cli("inspect", str(tmp_path / "ckpt-1"), "nope")
    assert missing.returncode == 1 and "nope" in missing.stderr


def test_diff_reports_changes_and_exit_status(tmp_path):
    a, b = _state(), _state()
    b["w"][3, 4] += 0.5
    b["new"] = np.ones(2)
    del b["b"]
    pyckpt.save(a, tmp_path / "a")
    pyckpt.save(b, tmp_path / "b")
    same = _cli("diff", str(tmp_path / "a"), str(tmp_path / "a"))
    assert same.returncode == 0 and "0 changed" in same.stdout
    r = _cli("diff", str(tmp_path / "a"), str(tmp_path / "b"))
    assert r.returncode == 1
    assert "+ new" in r.stdout and "- b" in r.stdout and "~ w: max |a-b| = 0.5 in 1 element(s)" in r.stdout


def test_diff_compares_text_values_and_counts_exactly(tmp_path):
    """str, bytes and None values were not compared ("identical", exit 0); NaN against
    NaN was counted as a difference, int64 differences were rounded through float64."""
    pyckpt.save({"w": np.ones(3), "note": "warm-up", "tag": b"abc", "opt": None,
                 "nan": np.array([np.nan, 1.0]), "i": np.array([2 ** 62])}, tmp_path / "a")
    pyckpt.save({"w": np.ones(3), "note": "DIFFERENT", "tag": b"abc", "opt": "set",
                 "nan": np.array([np.nan, 2.0]), "i": np.array([2 ** 62 + 1]), "more": None},
                tmp_path / "b")
    r = _cli("diff", str(tmp_path / "a"), str(tmp_path / "b"))
    assert r.returncode == 1, r.stdout
    assert "~ note: 'warm-up' -> 'DIFFERENT'" in r.stdout and "~ opt: None -> 'set'" in r.stdout
    assert "+ more" in r.stdout and "~ tag" not in r.stdout
    assert "~ nan: max |a-b| = 1 in 1 element(s)" in r.stdout
    assert "~ i: max |a-b| = 1 in 1 element(s)" in r.stdout
    assert "2 equal, 4 changed, 1 added, 0 removed" in r.stdout
    assert pyckpt.load_checkpoint(tmp_path / "a").text_values() == {
        "note": "warm-up", "tag": b"abc", "opt": None}


def test_cp_verifies_and_converts(tmp_path, flip, shard_files):
    src = tmp_path / "src"
    pyckpt.save(_state(), src)
    assert _cli("cp", str(src), str(tmp_path / "copy")).returncode == 0
    pyckpt.load_checkpoint(tmp_path / "copy").verify()
    assert _cli("cp", str(src), str(tmp_path / "m.safetensors")).returncode == 0
    assert _cli("cp", str(tmp_path / "m.safetensors"), str(tmp_path / "back")).returncode == 0
    np.testing.assert_array_equal(pyckpt.load(tmp_path / "back")["w"], _state()["w"])
    flip(shard_files(str(src))[0], 1000)
    bad = _cli("cp", str(src), str(tmp_path / "copy2"))
    assert bad.returncode == 1 and "checksum mismatch" in bad.stderr
    assert not (tmp_path / "copy2" / "pyckpt.index").exists()  # nothing committed


def test_progress_bar_only_on_a_terminal(tmp_path):
    pyckpt.save({"x": np.ones(20_000_000)}, tmp_path / "c")
    quiet = _cli("verify", str(tmp_path / "c"))
    assert quiet.returncode == 0 and quiet.stderr == ""
    exe = shutil.which("pyckpt")
    cmd = [exe] if exe else [sys.executable, "-m", "pyckpt"]
    code, seen = run_on_terminal(cmd + ["verify", str(tmp_path / "c")], timeout=30)
    assert code == 0
    assert b"verify" in seen and b"%" in seen  # the bar was drawn on the terminal
