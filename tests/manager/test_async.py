"""CheckpointManager.save(blocking=False) (issue 4)."""

import os
import time

import numpy as np
import pytest

import pyckpt
from pyckpt.engine import writer

KEY = "v/.ATTRIBUTES/VARIABLE_VALUE"


@pytest.fixture
def slow_writes(monkeypatch):
    """Makes every checkpoint commit 0.3 s late, so a race would show."""
    real = writer._finish

    def slow(*args, **kwargs):
        time.sleep(0.3)
        return real(*args, **kwargs)

    monkeypatch.setattr(writer, "_finish", slow)


def test_values_mutated_after_save_returns_do_not_leak(tmp_path, slow_writes):
    v = pyckpt.Variable(np.zeros(1_000_000))
    m = pyckpt.CheckpointManager(pyckpt.Checkpoint(v=v), tmp_path)
    t = time.perf_counter()
    path = m.save(blocking=False)
    assert time.perf_counter() - t < 0.25  # returned before the (slow) write
    v.assign(np.ones(1_000_000))           # training goes on, mutating the state
    assert not os.path.exists(os.path.join(path, "pyckpt.index"))
    m.wait_until_finished()
    assert (pyckpt.load_variable(path, KEY) == 0).all()
    assert m.checkpoints == [path]


def test_next_save_waits_for_the_previous_one(tmp_path, slow_writes):
    v = pyckpt.Variable(np.zeros(10))
    m = pyckpt.CheckpointManager(pyckpt.Checkpoint(v=v), tmp_path, max_to_keep=1)
    first = m.save(blocking=False)
    v.assign(np.ones(10))
    second = m.save()  # blocking: returns after both are done
    assert m.checkpoints == [second]
    assert not os.path.exists(first)  # retention ran after the first finished
    assert (pyckpt.load_variable(second, KEY) == 1).all()


def test_background_error_surfaces_at_the_next_call(tmp_path, monkeypatch):
    m = pyckpt.CheckpointManager(pyckpt.Checkpoint(v=pyckpt.Variable(np.zeros(3))), tmp_path)
    m.save()

    def broken(*args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(writer, "_finish", broken)
    path = m.save(blocking=False)
    with pytest.raises(OSError, match="No space"):
        m.save()
    assert not os.path.exists(os.path.join(path, "pyckpt.index"))
    assert [os.path.basename(p) for p in m.checkpoints] == ["ckpt-1"]
    monkeypatch.undo()
    m.save(blocking=False)
    m.wait_until_finished()  # no stale error left behind
    m.save(blocking=False)
    m.wait_until_finished()
    assert len(m.checkpoints) == 3


def test_wait_until_finished_raises_the_background_error(tmp_path, monkeypatch):
    m = pyckpt.CheckpointManager(pyckpt.Checkpoint(v=pyckpt.Variable(np.zeros(3))), tmp_path)

    def broken(*args, **kwargs):
        raise RuntimeError("disk on fire")

    monkeypatch.setattr(writer, "_finish", broken)
    m.save(blocking=False)
    with pytest.raises(RuntimeError, match="disk on fire"):
        m.wait_until_finished()
    m.wait_until_finished()  # raised once


def test_staging_buffers_are_reused(tmp_path):
    v = pyckpt.Variable(np.zeros(100_000))
    m = pyckpt.CheckpointManager(pyckpt.Checkpoint(v=v), tmp_path)
    m.save(blocking=False)
    buf = m._keeper.background.buffers._host[KEY]
    m.wait_until_finished()
    v.assign(np.full(100_000, 2.0))
    p = m.save(blocking=False)
    assert m._keeper.background.buffers._host[KEY] is buf
    m.wait_until_finished()
    assert (pyckpt.load_variable(p, KEY) == 2).all()


def test_max_async_bytes_falls_back_to_blocking(tmp_path, slow_writes):
    v = pyckpt.Variable(np.zeros(10_000))
    m = pyckpt.CheckpointManager(pyckpt.Checkpoint(v=v), tmp_path, max_async_bytes=1000)
    path = m.save(blocking=False)
    assert os.path.exists(os.path.join(path, "pyckpt.index"))  # committed on return


def test_async_save_survives_an_immediate_exit(tmp_path):
    """The pending background save still commits when the program ends right away."""
    import subprocess
    import sys

    code = ("import sys, numpy as np, pyckpt; "
            "m = pyckpt.CheckpointManager(pyckpt.Checkpoint(v=pyckpt.Variable(np.ones(1_000_000))), sys.argv[1]); "
            "print(m.save(blocking=False))")
    out = subprocess.run([sys.executable, "-c", code, str(tmp_path)], capture_output=True,
                         text=True, timeout=120, check=True, cwd=tmp_path).stdout.strip()
    pyckpt.load_checkpoint(out).verify()


def test_an_interrupted_wait_leaves_the_save_to_close(tmp_path, monkeypatch):
    """Regression: Ctrl-C inside wait_until_finished() must not lose the save in flight:
    close() still waits for it before freeing the staging buffers it reads."""
    from pyckpt.saving import PendingSave

    v = pyckpt.Variable(np.arange(200_000, dtype=np.float64))
    m = pyckpt.CheckpointManager(pyckpt.Checkpoint(v=v), tmp_path)
    real_join = PendingSave.join
    interrupted = {"done": False}

    def join(self, timeout=None):
        if not interrupted["done"]:
            interrupted["done"] = True
            raise KeyboardInterrupt
        return real_join(self, timeout)

    monkeypatch.setattr(PendingSave, "join", join)
    path = m.save(blocking=False)
    with pytest.raises(KeyboardInterrupt):
        m.wait_until_finished()
    m.close()  # waits for the save, then frees the buffers
    np.testing.assert_array_equal(pyckpt.load(path, as_numpy=True)["v"]
                                  [".ATTRIBUTES"]["VARIABLE_VALUE"],
                                  np.arange(200_000, dtype=np.float64))
