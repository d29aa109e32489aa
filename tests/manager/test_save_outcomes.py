"""Issue 10, weaker spots of the manager: an unambiguous outcome when recording a
committed save fails, no empty directory after a failed save, and one answer
to "which checkpoint is the latest"."""

import errno
import os

import numpy as np
import pytest

import pyckpt
import pyckpt.manager.run_state as manager_module
from pyckpt.errors import CheckpointIOError


def make_ckpt():
    return pyckpt.Checkpoint(v=pyckpt.Variable(np.arange(4.0)))


def ckpt_dirs(d):
    return sorted(n for n in os.listdir(d) if n.startswith("ckpt-"))


def test_disk_full_at_the_state_write_says_the_save_counts(tmp_path, monkeypatch):
    m = pyckpt.CheckpointManager(make_ckpt(), tmp_path)
    m.save()
    real = manager_module.write_state

    def full(*a, **k):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(manager_module, "write_state", full)
    with pytest.raises(CheckpointIOError, match="ckpt-2 was committed and counts") as e:
        m.save()
    assert e.value.errno == errno.ENOSPC
    assert isinstance(e.value.__cause__, OSError)
    assert m.latest_checkpoint == str(tmp_path / "ckpt-2")
    assert pyckpt.latest_checkpoint(tmp_path) == str(tmp_path / "ckpt-2")
    monkeypatch.setattr(manager_module, "write_state", real)
    m.close()
    again = pyckpt.CheckpointManager(make_ckpt(), tmp_path)  # adopts the unrecorded commit
    assert again.latest_checkpoint == str(tmp_path / "ckpt-2")
    assert [os.path.basename(p) for p in again.checkpoints] == ["ckpt-1", "ckpt-2"]
    again.close()


@pytest.mark.parametrize("blocking", [True, False])
def test_failed_save_leaves_no_directory(tmp_path, monkeypatch, blocking):
    import pyckpt.engine.commit as commits

    m = pyckpt.CheckpointManager(make_ckpt(), tmp_path)
    m.save()

    def full(*a, **k):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(commits, "finish", full)
    with pytest.raises(OSError) as e:
        m.save(blocking=blocking)
        m.wait_until_finished()
    if hasattr(e.value, "__notes__"):
        assert "ckpt-2 was not saved by this call: nothing of it" in "".join(e.value.__notes__)
    assert ckpt_dirs(tmp_path) == ["ckpt-1"]
    assert [os.path.basename(p) for p in m.checkpoints] == ["ckpt-1"]
    monkeypatch.undo()
    assert m.save() == str(tmp_path / "ckpt-2")  # the number was rolled back as well
    assert ckpt_dirs(tmp_path) == ["ckpt-1", "ckpt-2"]


def test_a_manager_numbering_below_existing_checkpoints_warns_and_agrees(tmp_path):
    m = pyckpt.CheckpointManager(make_ckpt(), tmp_path, max_to_keep=10)
    for _ in range(5):
        m.save()
    m.close()
    fresh = pyckpt.CheckpointManager(make_ckpt(), tmp_path, max_to_keep=10)  # no restore
    with pytest.warns(UserWarning, match="ckpt-1 although ckpt-5 exists"):
        path = fresh.save()
    assert path == str(tmp_path / "ckpt-1")
    # TensorFlow's rule: the latest is the one saved last, and everyone agrees
    assert fresh.latest_checkpoint == path
    assert pyckpt.latest_checkpoint(tmp_path) == path
    assert pyckpt.load_checkpoint(str(tmp_path)).path == path
    fresh.close()
    assert pyckpt.CheckpointManager(make_ckpt(), tmp_path).latest_checkpoint == path
