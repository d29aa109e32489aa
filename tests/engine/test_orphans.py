"""Issue 10, weaker spot: data files of racing or killed saves are removed by the
next save to the path (and by ``pyckpt verify --fix``), never those of a live
save and never the winner's."""

import json
import os
import socket
import subprocess
import sys
import time

import numpy as np
import pytest

import pyckpt
from pyckpt.format import INDEX_NAME, decode_index

RACER = r"""
import sys, numpy as np, pyckpt
path, seed, rounds = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
for i in range(rounds):
    pyckpt.save({"w": np.full((512, 1024), seed * 1000 + i, np.float32)}, path)
"""


def referenced(path):
    with open(os.path.join(path, INDEX_NAME), "rb") as f:
        return {e.name for e in decode_index(f.read(), path).files}


def leftover(path):
    """Every file in the checkpoint besides its index and the files it references."""
    return set(os.listdir(path)) - referenced(path) - {INDEX_NAME}


def fake_attempt(path, attempt, marker=None):
    """Data files of a save attempt that no index references (a killed or losing writer)."""
    for i in range(2):
        with open(os.path.join(path, f"data-{attempt}-00000-{i:04d}.bin"), "wb") as f:
            f.write(b"\0" * 4096)
    if marker is not None:
        with open(os.path.join(path, f"pyckpt-attempt-{attempt}.json"), "w") as f:
            json.dump(marker, f)


def test_racing_writers_leave_nothing_after_the_next_save(tmp_path):
    path = str(tmp_path / "ck")
    procs = [subprocess.Popen([sys.executable, "-c", RACER, path, str(s), "20"], cwd=tmp_path)
             for s in (1, 2)]
    for p in procs:
        assert p.wait(timeout=300) == 0
    pyckpt.save({"w": np.full((512, 1024), 7, np.float32)}, path)
    assert leftover(path) == set()
    assert (pyckpt.load(path)["w"] == 7).all()


def test_files_of_a_killed_save_are_removed_by_the_next_save(tmp_path):
    path = str(tmp_path / "ck")
    pyckpt.save({"w": np.arange(10.0)}, path)
    fake_attempt(path, "0123456789ab")                       # no marker: gone
    fake_attempt(path, "00000000dead", {"host": socket.gethostname(), "pid": 2**22 + 17,
                                        "time": time.time()})  # marker of a dead pid
    assert len(leftover(path)) == 5
    pyckpt.save({"w": np.arange(10.0) + 1}, path)
    assert leftover(path) == set()
    np.testing.assert_array_equal(pyckpt.load(path)["w"], np.arange(10.0) + 1)


def test_files_of_a_live_save_are_kept(tmp_path):
    path = str(tmp_path / "ck")
    pyckpt.save({"w": np.arange(10.0)}, path)
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        fake_attempt(path, "aaaaaaaaaaaa", {"host": socket.gethostname(), "pid": sleeper.pid,
                                            "time": time.time()})
        fake_attempt(path, "bbbbbbbbbbbb", {"host": "another-host", "pid": 1,
                                            "time": time.time()})  # recent, elsewhere: live
        fake_attempt(path, "cccccccccccc", {"host": "another-host", "pid": 1,
                                            "time": time.time() - 7 * 3600})  # stale
        pyckpt.save({"w": np.arange(10.0)}, path)
        left = leftover(path)
        assert {n for n in left if "aaaa" in n} and {n for n in left if "bbbb" in n}
        assert not {n for n in left if "cccc" in n}
    finally:
        sleeper.kill()
        sleeper.wait()
    pyckpt.save({"w": np.arange(10.0)}, path)
    assert {n for n in leftover(path) if "aaaa" in n} == set()


def test_nothing_is_swept_without_a_valid_index(tmp_path):
    from pyckpt.engine import attempts
    from pyckpt.storage import resolve

    path = str(tmp_path / "ck")
    pyckpt.save({"w": np.arange(10.0)}, path)
    fake_attempt(path, "0123456789ab")
    with open(os.path.join(path, INDEX_NAME), "r+b") as f:  # damage the index
        f.seek(20)
        f.write(b"\xff\xff")
    before = set(os.listdir(path))
    assert attempts.sweep(*resolve(path, None)) == []
    assert set(os.listdir(path)) == before


def test_manager_saves_leave_no_markers(tmp_path):
    m = pyckpt.CheckpointManager(pyckpt.Checkpoint(v=pyckpt.Variable(np.zeros(3))), tmp_path)
    m.save()
    m.save(blocking=False)
    m.wait_until_finished()
    for ck in m.checkpoints:
        assert leftover(ck) == set()


def test_verify_fix_removes_orphans(tmp_path):
    path = str(tmp_path / "ck")
    pyckpt.save({"w": np.arange(10.0)}, path)
    fake_attempt(path, "0123456789ab")
    env = dict(os.environ, PYTHONPATH="")
    out = subprocess.run([sys.executable, "-m", "pyckpt", "verify", path, "--fix", "--json"],
                         capture_output=True, text=True, cwd=tmp_path, env=env, timeout=120)
    assert out.returncode == 0, out.stderr
    doc = json.loads(out.stdout)
    assert sorted(doc["removed"]) == [f"data-0123456789ab-00000-000{i}.bin" for i in range(2)]
    assert leftover(path) == set()
