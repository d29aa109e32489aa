"""Issue 10 A: names read from storage never reach outside the run (the manager's
state file, the lock file, data files that are links)."""

import json
import os

import numpy as np
import pytest

import pyckpt
from pyckpt.errors import CorruptCheckpointError


def make_ckpt():
    return pyckpt.Checkpoint(v=pyckpt.Variable(np.arange(4.0)))


def run_with_victim(tmp_path):
    run = tmp_path / "run"
    victim = tmp_path / "victim"
    victim.mkdir()
    (victim / "precious.txt").write_text("keep me")
    m = pyckpt.CheckpointManager(make_ckpt(), run, max_to_keep=2)
    m.save()
    m.save()
    m.close()
    return run, victim


def edit_state(run, **changes):
    path = run / "pyckpt-manager.json"
    doc = json.loads(path.read_text())
    doc.update(changes)
    path.write_text(json.dumps(doc))


@pytest.mark.parametrize("bad", ["../victim", None, "", ".", "ckpt-1/../../victim",
                                 "ckpt-x", "other-3", "ckpt-1/", "ckpt--1"])
def test_state_deleting_outside_the_run_is_refused(tmp_path, bad):
    run, victim = run_with_victim(tmp_path)
    edit_state(run, deleting=[str(victim) if bad is None else bad])  # None: an absolute path
    with pytest.raises(CorruptCheckpointError, match="pyckpt-manager.json") as e:
        pyckpt.CheckpointManager(make_ckpt(), run).save()
    assert "Nothing was deleted" in str(e.value)
    assert (victim / "precious.txt").read_text() == "keep me"
    assert sorted(n for n in os.listdir(run) if n.startswith("ckpt-")) == ["ckpt-1", "ckpt-2"]
    assert pyckpt.load_checkpoint(run / "ckpt-2").get_tensor(
        "v/.ATTRIBUTES/VARIABLE_VALUE").tolist() == [0, 1, 2, 3]


@pytest.mark.parametrize("field,value", [
    ("checkpoints", [{"name": "../victim", "step": 1, "time": 1.0}]),
    ("checkpoints", [{"name": "ckpt-1", "step": 7, "time": 1.0}]),
    ("preserved", [{"name": "/etc", "step": 1, "time": 1.0}]),
    ("checkpoints", "ckpt-1"),
    ("checkpoint_name", "../victim/ckpt"),
    ("checkpoint_name", ""),
])
def test_state_entries_must_name_checkpoints_of_the_run(tmp_path, field, value):
    run, victim = run_with_victim(tmp_path)
    edit_state(run, **{field: value})
    with pytest.raises(CorruptCheckpointError, match=field if field != "checkpoint_name"
                       else "checkpoint_name"):
        pyckpt.CheckpointManager(make_ckpt(), run)
    with pytest.raises(CorruptCheckpointError):
        pyckpt.latest_checkpoint(run)
    assert (victim / "precious.txt").exists()


def test_state_that_is_not_json_is_refused_not_ignored(tmp_path):
    run, _ = run_with_victim(tmp_path)
    (run / "pyckpt-manager.json").write_bytes(b"\x00garbage")
    with pytest.raises(CorruptCheckpointError, match="remove it"):
        pyckpt.CheckpointManager(make_ckpt(), run)
    os.unlink(run / "pyckpt-manager.json")  # the advertised fix: committed ones are adopted
    m = pyckpt.CheckpointManager(make_ckpt(), run)
    assert [os.path.basename(p) for p in m.checkpoints] == ["ckpt-1", "ckpt-2"]


def test_checkpoint_name_must_be_a_plain_name(tmp_path):
    for bad in ["../x", "a/b", ".", "..", "", "a\\b"]:
        with pytest.raises(ValueError, match="checkpoint_name"):
            pyckpt.CheckpointManager(make_ckpt(), tmp_path, checkpoint_name=bad)


def test_lock_file_with_odd_types_gives_a_clear_error(tmp_path):
    run, _ = run_with_victim(tmp_path)
    (run / "pyckpt-manager.lock").write_text(json.dumps(
        {"owner": 12345, "host": "elsewhere", "pid": "x", "heartbeat": 1e18}))
    with pytest.raises(pyckpt.ConcurrentWriterError, match="another CheckpointManager"):
        pyckpt.CheckpointManager(make_ckpt(), run).save()


def test_data_file_that_is_a_symlink_is_refused(tmp_path):
    outside = tmp_path / "outside.bin"
    path = tmp_path / "ck"
    pyckpt.save({"w": np.arange(1000.0)}, str(path))
    (name,) = [n for n in os.listdir(path) if n.startswith("data-")]
    os.rename(path / name, outside)
    os.symlink(outside, path / name)
    with pytest.raises(CorruptCheckpointError, match="symbolic link"):
        pyckpt.load(str(path))
    with pytest.raises(CorruptCheckpointError, match="symbolic link"):
        pyckpt.load_checkpoint(str(path)).verify()
    with pytest.raises(CorruptCheckpointError, match="symbolic link"):
        pyckpt.load(str(path), mmap=True)


def test_retention_of_a_linked_checkpoint_removes_the_link_only(tmp_path):
    run = tmp_path / "run"
    m = pyckpt.CheckpointManager(make_ckpt(), run, max_to_keep=1)
    m.save()
    m.close()
    elsewhere = tmp_path / "elsewhere"
    os.rename(run / "ckpt-1", elsewhere)
    os.symlink(elsewhere, run / "ckpt-1")        # the run's ckpt-1 now points outside
    m = pyckpt.CheckpointManager(make_ckpt(), run, max_to_keep=1)
    m.save(checkpoint_number=2)                  # retention retires ckpt-1
    assert not os.path.lexists(run / "ckpt-1")
    assert (elsewhere / "pyckpt.index").exists()  # what it pointed to is untouched
    assert pyckpt.load_checkpoint(str(elsewhere)).get_tensor(
        "v/.ATTRIBUTES/VARIABLE_VALUE").tolist() == [0, 1, 2, 3]
