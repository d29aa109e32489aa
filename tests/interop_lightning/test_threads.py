"""The plugin called from several threads, as Lightning's AsyncCheckpointIO does: it
saves in a thread of its own while ModelCheckpoint removes older checkpoints from the
trainer's thread (issue 38 item 1: a run under AsyncCheckpointIO failed now and then
with "cannot create .../epoch=0-step=4.ckpt/data-...: No such file or directory")."""

from __future__ import annotations

import threading

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("lightning")

from pyckpt import saving  # noqa: E402
from pyckpt.lightning import CheckpointIO  # noqa: E402


def test_removal_waits_for_a_save_of_the_same_path(tmp_path, monkeypatch):
    """A removal of a path a save in another thread is writing waits for that save,
    then removes the checkpoint: the save does not fail, and nothing outlives the
    removal."""
    io = CheckpointIO()
    path = tmp_path / "epoch=0-step=4.ckpt"
    real, removal = saving.write, []

    def write(*args, **kwargs):  # the removal comes while this save is under way
        removal.append(threading.Thread(target=io.remove_checkpoint, args=(path,)))
        removal[0].start()
        removal[0].join(timeout=1)  # returns at once if the removal does not wait
        real(*args, **kwargs)

    monkeypatch.setattr(saving, "write", write)
    io.save_checkpoint({"w": torch.ones(3)}, path)
    removal[0].join()
    assert not path.exists()


def test_saves_of_other_paths_do_not_wait(tmp_path, monkeypatch):
    """Only the same path waits: a save may remove another path while it writes."""
    io = CheckpointIO()
    io.save_checkpoint({"w": torch.zeros(2)}, tmp_path / "old.ckpt")
    real = saving.write

    def write(*args, **kwargs):
        io.remove_checkpoint(tmp_path / "old.ckpt")  # same thread, other path: no wait
        real(*args, **kwargs)

    monkeypatch.setattr(saving, "write", write)
    io.save_checkpoint({"w": torch.ones(3)}, tmp_path / "new.ckpt")
    assert not (tmp_path / "old.ckpt").exists() and (tmp_path / "new.ckpt").is_dir()
