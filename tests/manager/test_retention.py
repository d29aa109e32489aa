"""CheckpointManager retention, intervals, recovery and the writer lease (API.md section 3)."""

import json
import os
import subprocess
import sys

import numpy as np
import pytest

import pyckpt


class Clock:
    def __init__(self):
        self.t = 1_000_000.0

    def __call__(self):
        return self.t


def names(paths):
    return [os.path.basename(p) for p in paths]


def on_disk(d):
    return sorted((p for p in os.listdir(d) if p.startswith("ckpt-")), key=lambda n: int(n[5:]))


def make_ckpt():
    return pyckpt.Checkpoint(v=pyckpt.Variable(np.zeros(4)))


def test_max_to_keep_keeps_the_newest(tmp_path):
    m = pyckpt.CheckpointManager(make_ckpt(), tmp_path, max_to_keep=3)
    paths = [m.save() for _ in range(6)]
    assert names(paths) == [f"ckpt-{i}" for i in range(1, 7)]
    assert names(m.checkpoints) == ["ckpt-4", "ckpt-5", "ckpt-6"]
    assert on_disk(tmp_path) == ["ckpt-4", "ckpt-5", "ckpt-6"]
    assert m.latest_checkpoint == str(tmp_path / "ckpt-6")
    assert pyckpt.latest_checkpoint(tmp_path) == str(tmp_path / "ckpt-6")
    assert m.directory == str(tmp_path)


def test_max_to_keep_none_keeps_everything(tmp_path):
    m = pyckpt.CheckpointManager(make_ckpt(), tmp_path, max_to_keep=None)
    for _ in range(7):
        m.save()
    assert len(m.checkpoints) == 7


def test_keep_checkpoint_every_n_hours(tmp_path):
    clock = Clock()
    m = pyckpt.CheckpointManager(make_ckpt(), tmp_path, max_to_keep=2,
                                 keep_checkpoint_every_n_hours=2, clock=clock)
    for _ in range(8):  # one save per hour
        clock.t += 3600
        m.save()
    # leaving the active set: ckpt-1 (t0+1h, < 2h after creation: deleted), ckpt-2 (+2h: kept),
    # ckpt-3 deleted, ckpt-4 (+4h) kept, ckpt-5 deleted, ckpt-6 (+6h) kept
    assert names(m.preserved_checkpoints) == ["ckpt-2", "ckpt-4", "ckpt-6"]
    assert names(m.checkpoints) == ["ckpt-7", "ckpt-8"]
    assert on_disk(tmp_path) == ["ckpt-2", "ckpt-4", "ckpt-6", "ckpt-7", "ckpt-8"]
    # preserved checkpoints survive a restart and are never deleted
    del m
    m2 = pyckpt.CheckpointManager(make_ckpt(), tmp_path, max_to_keep=2,
                                  keep_checkpoint_every_n_hours=2, clock=clock)
    assert names(m2.preserved_checkpoints) == ["ckpt-2", "ckpt-4", "ckpt-6"]


def test_checkpoint_interval_and_step_counter(tmp_path):
    step = pyckpt.Variable(np.int64(0))
    m = pyckpt.CheckpointManager(make_ckpt(), tmp_path, step_counter=step, checkpoint_interval=10)
    assert m.save() is not None           # step 0: first save always happens
    step.assign(5)
    assert m.save() is None               # too soon
    assert m.save(check_interval=False) is not None
    assert m.save(check_interval=False) is None  # same step twice: nothing to save
    step.assign(14)
    assert m.save() is None               # 14 < 5 + 10
    step.assign(15)
    assert m.save() is not None
    assert len(m.checkpoints) == 3
    with pytest.raises(ValueError, match="step_counter"):
        pyckpt.CheckpointManager(make_ckpt(), tmp_path / "x", checkpoint_interval=3)


def test_checkpoint_number_and_name(tmp_path):
    m = pyckpt.CheckpointManager(make_ckpt(), tmp_path, checkpoint_name="model")
    assert m.save(checkpoint_number=100) == str(tmp_path / "model-100")
    assert m.save(checkpoint_number=pyckpt.Variable(np.int64(200))) == str(tmp_path / "model-200")
    assert pyckpt.latest_checkpoint(tmp_path) == str(tmp_path / "model-200")


def test_best_fn_keeps_the_best_and_always_the_newest(tmp_path):
    m = pyckpt.CheckpointManager(make_ckpt(), tmp_path, max_to_keep=2,
                                 best_fn=lambda metrics: metrics["acc"], best_mode="max")
    for acc in [0.5, 0.9, 0.7, 0.95, 0.1]:
        m.save(metrics={"acc": acc})
    # best two: ckpt-4 (0.95), ckpt-2 (0.9); ckpt-5 is the newest: kept too
    assert names(m.checkpoints) == ["ckpt-2", "ckpt-4", "ckpt-5"]
    assert on_disk(tmp_path) == ["ckpt-2", "ckpt-4", "ckpt-5"]
    m.save(metrics={"acc": 0.2})  # the old newest (0.1) goes, the new newest stays
    assert names(m.checkpoints) == ["ckpt-2", "ckpt-4", "ckpt-6"]
    lo = pyckpt.CheckpointManager(make_ckpt(), tmp_path / "min", max_to_keep=1,
                                  best_fn=lambda mt: mt["loss"], best_mode="min")
    for loss in [3.0, 1.0, 2.0]:
        lo.save(metrics={"loss": loss})
    assert names(lo.checkpoints) == ["ckpt-2", "ckpt-3"]
    with pytest.raises(ValueError):
        pyckpt.CheckpointManager(make_ckpt(), tmp_path / "bad", best_mode="median")


def test_restart_recovers_the_list_and_adopts_unrecorded_commits(tmp_path):
    ck = make_ckpt()
    m = pyckpt.CheckpointManager(ck, tmp_path, max_to_keep=3)
    for _ in range(4):
        m.save()
    m.close()
    # a commit that never reached the state file (crash between commit and state update)
    ck.save_counter.assign_add(1)
    ck.write(tmp_path / "ckpt-5")
    m2 = pyckpt.CheckpointManager(make_ckpt(), tmp_path, max_to_keep=3)
    assert names(m2.checkpoints) == ["ckpt-2", "ckpt-3", "ckpt-4", "ckpt-5"]
    assert m2.latest_checkpoint == str(tmp_path / "ckpt-5")
    assert m2.restore_or_initialize() == str(tmp_path / "ckpt-5")
    m2.save()
    assert names(m2.checkpoints) == ["ckpt-4", "ckpt-5", "ckpt-6"]
    assert on_disk(tmp_path) == ["ckpt-4", "ckpt-5", "ckpt-6"]


def test_interrupted_deletion_and_uncommitted_leftovers_are_cleaned(tmp_path):
    m = pyckpt.CheckpointManager(make_ckpt(), tmp_path, max_to_keep=3)
    for _ in range(3):
        m.save()
    m.close()
    state_file = tmp_path / "pyckpt-manager.json"
    state = json.loads(state_file.read_text())
    state["deleting"] = ["ckpt-1"]  # died while deleting ckpt-1...
    state["checkpoints"] = state["checkpoints"][1:]
    state_file.write_text(json.dumps(state))
    os.makedirs(tmp_path / "ckpt-9")  # ...and with an uncommitted save
    (tmp_path / "ckpt-9" / "data-000000000000-00000-0000.bin").write_bytes(b"x" * 100)
    m2 = pyckpt.CheckpointManager(make_ckpt(), tmp_path, max_to_keep=3)
    assert names(m2.checkpoints) == ["ckpt-2", "ckpt-3"]  # never reported as valid
    assert m2.restore_or_initialize() == str(tmp_path / "ckpt-3")
    m2.save()
    assert on_disk(tmp_path) == ["ckpt-2", "ckpt-3", "ckpt-4"]


def test_restore_or_initialize(tmp_path):
    calls = []
    ck = make_ckpt()
    m = pyckpt.CheckpointManager(ck, tmp_path, init_fn=lambda: calls.append("init"))
    assert m.restore_or_initialize() is None and calls == ["init"]
    ck.v.assign(np.full(4, 3.0))
    m.save()
    m.close()
    ck2 = make_ckpt()
    m2 = pyckpt.CheckpointManager(ck2, tmp_path, init_fn=lambda: calls.append("again"))
    assert m2.restore_or_initialize() == str(tmp_path / "ckpt-1")
    assert calls == ["init"] and float(ck2.v[0]) == 3.0 and int(ck2.save_counter) == 1


def test_a_newer_manager_in_one_process_takes_the_directory_over(tmp_path):
    a = pyckpt.CheckpointManager(make_ckpt(), tmp_path)
    b = pyckpt.CheckpointManager(make_ckpt(), tmp_path)
    a.save()
    with pytest.warns(UserWarning, match="takes the directory over"):
        b.save()
    with pytest.raises(pyckpt.ConcurrentWriterError, match="taken over by a newer"):
        a.save()  # the older one never interleaves
    assert isinstance(pyckpt.ConcurrentWriterError("x"), pyckpt.CheckpointError)
    a.close()
    b.save()
    with pytest.raises(pyckpt.ConcurrentWriterError, match="taken over"):
        a._keeper.lease.held = True  # a stale manager that still believes it owns the lease
        a.save()


def test_lease_of_a_dead_process_is_taken_over(tmp_path):
    code = ("import sys, numpy as np, pyckpt, os; "
            "m = pyckpt.CheckpointManager(pyckpt.Checkpoint(v=pyckpt.Variable(np.ones(2))), sys.argv[1]); "
            "m.save(); os._exit(0)")  # exits without releasing the lease
    subprocess.run([sys.executable, "-c", code, str(tmp_path)], check=True, timeout=120,
                   cwd=tmp_path)
    assert (tmp_path / "pyckpt-manager.lock").exists()
    m = pyckpt.CheckpointManager(make_ckpt(), tmp_path)
    assert m.save() == str(tmp_path / "ckpt-1")  # the counter was not restored: number 1 again
    assert names(m.checkpoints) == ["ckpt-1"]


def test_failed_save_keeps_the_counter_and_the_list(tmp_path, monkeypatch):
    ck = make_ckpt()
    m = pyckpt.CheckpointManager(ck, tmp_path)
    m.save()

    def broken(*a, **k):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(pyckpt.saving, "write", broken)  # the manager's one way to write
    with pytest.raises(OSError):
        m.save()
    assert int(ck.save_counter) == 1 and names(m.checkpoints) == ["ckpt-1"]
