"""``pyckpt.save(tree, path, blocking=False)`` (API.md section 9): returns a handle
once the values are copied aside; values changed afterwards never reach that
checkpoint; errors surface at ``wait()``."""

import errno
import os
import time

import numpy as np
import pytest

import pyckpt
from pyckpt.saving import PendingSave
from pyckpt.testing.thread_comm import ThreadGroup


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
    import pyckpt.engine.commit as commits

    def full(*a, **k):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(commits, "finish", full)
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


def _slow_commits(monkeypatch, seconds):
    import pyckpt.engine.commit as commits
    real = commits.finish

    def slow(*a, **k):
        time.sleep(seconds)
        return real(*a, **k)

    monkeypatch.setattr(commits, "finish", slow)


@pytest.mark.parametrize("world", [2, 3])
def test_several_workers_return_before_the_commit(tmp_path, monkeypatch, world):
    """With several workers the collectives run in the call and the rest in the
    background (docs/PROTOCOL.md section 6b), as the manager's async saves do."""
    _slow_commits(monkeypatch, 0.5)
    path = str(tmp_path / "ck")

    def body(comm):
        state = {"rows": pyckpt.PerWorker(np.full((2, 1000), float(comm.rank))),
                 "w": np.arange(50_000, dtype=np.float32)}
        t = time.perf_counter()
        h = pyckpt.save(state, path, comm=comm, blocking=False)
        took = time.perf_counter() - t
        running = not h.done()
        state["w"] += 1  # the values change at once: the checkpoint keeps the call's
        state["rows"].value[...] = -1
        return took, running, h.wait(timeout=60)

    results = ThreadGroup(world).run(body)
    for r in results:
        assert not isinstance(r, BaseException), r
    assert all(running and took < 0.5 and got == path for took, running, got in results)
    out = pyckpt.load(path, as_numpy=True)
    np.testing.assert_array_equal(out["w"], np.arange(50_000, dtype=np.float32))
    rows = out["rows"]
    np.testing.assert_array_equal(rows.reshape(world, 2000),
                                  np.repeat(np.arange(world, dtype=float), 2000).reshape(world, -1))
    assert sorted(os.listdir(path)) == sorted(
        n for n in os.listdir(path) if n.startswith("data-") or n == "pyckpt.index")


def test_several_workers_failed_commit_raises_on_every_worker(tmp_path, monkeypatch):
    import pyckpt.engine.commit as commits

    def full(*a, **k):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(commits, "finish", full)
    path = str(tmp_path / "ck")

    def body(comm):
        h = pyckpt.save({"w": np.ones(1000)}, path, comm=comm, blocking=False)
        try:
            h.wait(timeout=60)
        except pyckpt.CheckpointError as e:
            return e
        return None

    errors = ThreadGroup(2).run(body)
    assert all(isinstance(e, pyckpt.CheckpointError) and "No space left" in str(e)
               for e in errors), errors
    with pytest.raises(pyckpt.CheckpointNotFoundError):
        pyckpt.load(path)


def test_sharded_values_of_one_process_are_saved_in_the_background(tmp_path, monkeypatch):
    _slow_commits(monkeypatch, 0.5)
    full = np.arange(40.0).reshape(8, 5)
    block = pyckpt.ShardedArray(full[2:6].copy(), global_shape=(4, 5), offsets=(0, 0))
    h = pyckpt.save({"s": block}, str(tmp_path / "ck"), blocking=False)
    assert not h.done()
    assert h.wait(timeout=60) == str(tmp_path / "ck")
    np.testing.assert_array_equal(pyckpt.load(str(tmp_path / "ck"))["s"], full[2:6])


def test_a_failing_buffer_release_is_raised_not_hung():
    """Regression: an error while freeing the staging buffers becomes the save's error;
    wait() never hangs on it."""
    def release():
        raise RuntimeError("cannot unpin")

    h = PendingSave("p", lambda: None, release=release)
    with pytest.raises(RuntimeError, match="cannot unpin"):
        h.wait(timeout=10)
    assert h.done()


def test_saves_to_one_path_commit_in_the_order_of_their_calls(tmp_path):
    """A background save that finished after a later save of the same path replaced
    its checkpoint: the older values won in most runs, without a word."""
    for t in range(4):
        path = tmp_path / f"a{t}"
        first = pyckpt.save({"a": np.ones(1 << 20, np.float32)}, path, blocking=False)
        pyckpt.save({"a": np.full(4, 2, np.float32)}, path)  # blocking, called later
        first.wait(60)  # it committed first (done() may lag: its callbacks run after)
        np.testing.assert_array_equal(pyckpt.load(path)["a"], np.full(4, 2, np.float32))
        path = tmp_path / f"b{t}"
        handles = [pyckpt.save({"a": np.full(1 << (20 - i), i, np.float32)}, path,
                               blocking=False) for i in range(4)]
        for h in handles:
            h.wait()
        assert pyckpt.load(path)["a"].shape == (1 << 17,)  # the last call's values
