"""``pyckpt.save(tree, path, blocking=False)`` (API.md section 9): returns a handle
once the values are copied aside; values changed afterwards never reach that
checkpoint; errors surface at ``wait()``."""

import errno

import numpy as np
import pytest

import pyckpt
from pyckpt.saving import PendingSave


@pytest.mark.parametrize("where", ["local", "memory"])
def test_values_changed_after_return_never_reach_the_checkpoint(tmp_path, where):
    state = {"w": np.arange(1 << 20, dtype=np.float32), "b": np.ones(7), "step": 3,
             "name": "run", "nested": [np.zeros((4, 4))]}
    handles = []
    for i in range(3):  # several saves in a row, each mutated at once after the call
        path = str(tmp_path / f"ck-{i}") if where == "local" else f"memory://nb/{tmp_path.name}/ck-{i}"
        h = pyckpt.save(state, path, blocking=False, metadata={"i": i})
        assert isinstance(h, PendingSave)
        state["w"] += 1          # the training step runs on while the save writes
        state["nested"][0][:] = -1
        handles.append((h, path, i))
    for h, path, i in handles:
        assert h.wait(timeout=120) == path and h.done()
        out = pyckpt.load(path)
        np.testing.assert_array_equal(out["w"], np.arange(1 << 20, dtype=np.float32) + i)
        np.testing.assert_array_equal(out["nested"][0], np.zeros((4, 4)) if i == 0
                                      else np.full((4, 4), -1.0))
        assert out["step"] == 3 and out["name"] == "run"
        assert pyckpt.load_checkpoint(path).metadata == {"i": i}


def test_background_error_is_raised_by_wait_and_nothing_is_committed(tmp_path, monkeypatch):
    import pyckpt.engine.writer as writer

    def full(*a, **k):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(writer, "commit", full)
    path = str(tmp_path / "ck")
    h = pyckpt.save({"w": np.ones(1000)}, path, blocking=False)
    with pytest.raises(OSError, match="No space left"):
        h.wait(timeout=60)
    assert h.done()
    with pytest.raises(pyckpt.CheckpointNotFoundError):
        pyckpt.load(path)


def test_progress_with_blocking_false_is_refused(tmp_path):
    with pytest.raises(ValueError, match="blocking=False"):
        pyckpt.save({"w": np.ones(3)}, str(tmp_path / "ck"), blocking=False,
                    progress=lambda done, total: None)
