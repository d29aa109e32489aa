"""Issue 13, item 1: a second CheckpointManager on one directory in one process.

Restore-and-continue (TensorFlow's "Training checkpoints" guide) re-creates the
Checkpoint and the CheckpointManager while the first run's objects may still be
referenced. The new manager takes the writer lease over (with a warning); the
old one's saves raise ConcurrentWriterError and leave nothing behind; an async
save of the old manager in flight finishes before the new one writes
(docs/PROTOCOL.md section 4, "Takeover within one process").
"""

import os
import subprocess
import sys
import threading
import time
import warnings

import numpy as np
import pytest

import pyckpt
from pyckpt.manager import keeper as manager_module


# -- a guide-style training program: lazily built layer, slot variables, an iterator ---

class Dense(pyckpt.Module):
    def __init__(self, units):
        self.units = units

    def __call__(self, x):
        if "kernel" not in self.__dict__:  # built on first use, as Keras layers are
            self.kernel = pyckpt.Variable(np.random.default_rng(7).standard_normal((x.shape[1], self.units)))
            self.bias = pyckpt.Variable(np.zeros(self.units))
        return x @ self.kernel.numpy() + self.bias.numpy()


class Momentum(pyckpt.Trackable):
    """SGD with momentum; its slot variables appear on the first step."""

    def __init__(self, lr=0.05, beta=0.9):
        self.lr, self.beta = lr, beta
        self.iterations = pyckpt.Variable(np.int64(0))
        self.slots = []

    def apply(self, grads, variables):
        while len(self.slots) < len(variables):
            self.slots.append(pyckpt.Variable(np.zeros(variables[len(self.slots)].shape)))
        self.iterations.assign_add(1)
        for g, var, s in zip(grads, variables, self.slots):
            s.assign(self.beta * s.numpy() + g)
            var.assign(var.numpy() - self.lr * s.numpy())


class Batches(pyckpt.Trackable):
    """x = 0..9, y = 3x + [0, 1, 2], in batches of 2, repeated; its position is saved."""

    def __init__(self):
        self.position = pyckpt.Variable(np.int64(0))
        self._x = np.arange(10.0)[:, None] / 10
        self._y = self._x * 3 + np.arange(3.0)[None, :]

    def __next__(self):
        i = int(self.position) % 5
        self.position.assign_add(1)
        return self._x[2 * i:2 * i + 2], self._y[2 * i:2 * i + 2]


def make():
    return pyckpt.Checkpoint(step=pyckpt.Variable(np.int64(1)), net=Dense(3),
                             optimizer=Momentum(), iterator=Batches())


def train(ckpt, manager, steps=50):
    """The guide's train_and_checkpoint: restore or start, train, save every 10 steps."""
    restored = manager.restore_or_initialize()
    saved = []
    for _ in range(steps):
        x, y = next(ckpt.iterator)
        d = (ckpt.net(x) - y) / y.size  # gradient of half the mean squared error
        ckpt.optimizer.apply([x.T @ d, d.sum(0)], [ckpt.net.kernel, ckpt.net.bias])
        ckpt.step.assign_add(1)
        if int(ckpt.step) % 10 == 0:
            saved.append(manager.save())
    return restored, saved


def listing(d):
    """Every file under d (relative path -> bytes): "nothing behind" means no change."""
    out = {}
    for root, _, files in os.walk(d):
        for f in files:
            p = os.path.join(root, f)
            with open(p, "rb") as fh:
                out[os.path.relpath(p, d)] = fh.read()
    return out


def steps_in(d):
    return sorted((p for p in os.listdir(d) if p.startswith("ckpt-")), key=lambda n: int(n[5:]))


def test_restore_and_continue_with_the_first_run_still_referenced(tmp_path):
    d = tmp_path / "tf_ckpts"
    history = []  # what a notebook's Out[] keeps alive
    first = make()
    manager = pyckpt.CheckpointManager(first, d, max_to_keep=3)
    history.append((first, manager))
    restored, saved = train(first, manager)
    assert restored is None and saved == [str(d / f"ckpt-{i}") for i in range(1, 6)]

    # The guide's second run: fresh objects and a new manager; the old ones are still alive.
    second = make()
    manager = pyckpt.CheckpointManager(second, d, max_to_keep=3)
    with pytest.warns(UserWarning, match="takes the directory over from an older") as caught:
        restored, saved = train(second, manager)
    assert sum("takes the directory over" in str(w.message) for w in caught) == 1  # once
    assert restored == str(d / "ckpt-5")
    assert saved == [str(d / f"ckpt-{i}") for i in range(6, 11)]
    assert manager.checkpoints == [str(d / f"ckpt-{i}") for i in (8, 9, 10)]
    assert steps_in(d) == ["ckpt-8", "ckpt-9", "ckpt-10"]
    assert pyckpt.latest_checkpoint(d) == str(d / "ckpt-10")
    assert pyckpt.CheckpointManager(make(), d).checkpoints == manager.checkpoints  # the state file

    # The second run continued the first one: the same as 99 uninterrupted steps
    # (the first run's 50th step came after its last save, at step 50).
    straight = make()
    with pyckpt.CheckpointManager(straight, tmp_path / "straight", max_to_keep=3) as m:
        train(straight, m, steps=99)
    for key in ("net/kernel", "net/bias", "optimizer/slots/0", "optimizer/iterations", "step"):
        a = pyckpt.load_checkpoint(str(d / "ckpt-10")).get_tensor(_key(d / "ckpt-10", key))
        b = pyckpt.load_checkpoint(str(tmp_path / "straight" / "ckpt-10")).get_tensor(
            _key(tmp_path / "straight" / "ckpt-10", key))
        np.testing.assert_array_equal(a, b)

    # The first run's manager, still referenced, may no longer write.
    old_ckpt, old_manager = history[0]
    before, counter = listing(d), int(old_ckpt.save_counter)
    with pytest.raises(pyckpt.ConcurrentWriterError, match="taken over by a newer CheckpointManager"):
        old_manager.save()
    with pytest.raises(pyckpt.ConcurrentWriterError, match="a newer CheckpointManager of this process"):
        old_manager.save(blocking=False)  # and again: it never takes the lease back
    assert listing(d) == before and int(old_ckpt.save_counter) == counter == 5
    assert old_manager.checkpoints == [str(d / f"ckpt-{i}") for i in (3, 4, 5)]  # its own view
    # the new manager is undisturbed
    assert manager.save() == str(d / "ckpt-11")
    assert steps_in(d) == ["ckpt-9", "ckpt-10", "ckpt-11"]


def _key(path, suffix):
    """The checkpoint key ending in ``suffix`` (object-graph keys carry a suffix)."""
    keys = [k for k, _ in pyckpt.list_variables(str(path))]
    hits = [k for k in keys if k.startswith(suffix + "/") or k == suffix]
    assert len(hits) == 1, (suffix, keys)
    return hits[0]


def _ckpt(value=1.0):
    return pyckpt.Checkpoint(v=pyckpt.Variable(np.full(4, value)))


def test_old_manager_async_save_in_flight_finishes_before_the_takeover(tmp_path, monkeypatch):
    old = pyckpt.CheckpointManager(_ckpt(1.0), tmp_path, max_to_keep=5)
    assert old.save() == str(tmp_path / "ckpt-1")

    started, release = threading.Event(), threading.Event()
    real_stage = manager_module.saving.stage

    def slow_stage(*args, **kwargs):
        work = real_stage(*args, **kwargs)

        def held_back():
            started.set()
            assert release.wait(60)
            return work()
        return held_back

    monkeypatch.setattr(manager_module.saving, "stage", slow_stage)
    assert old.save(blocking=False) == str(tmp_path / "ckpt-2")
    assert started.wait(60)
    lock_before = (tmp_path / "pyckpt-manager.lock").read_bytes()

    new = pyckpt.CheckpointManager(_ckpt(2.0), tmp_path, max_to_keep=5)
    assert [os.path.basename(p) for p in new.checkpoints] == ["ckpt-1"]  # read before ckpt-2
    out = {}

    def save_new():
        try:
            out["path"] = new.save(checkpoint_number=3)
        except BaseException as e:  # reported below
            out["error"] = e

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        t = threading.Thread(target=save_new)
        t.start()
        time.sleep(0.5)
        assert t.is_alive()  # waiting for the old manager's save in flight
        assert (tmp_path / "pyckpt-manager.lock").read_bytes() == lock_before
        assert not (tmp_path / "ckpt-3").exists()
        release.set()
        t.join(60)
    assert not t.is_alive() and "error" not in out, out
    assert out["path"] == str(tmp_path / "ckpt-3")
    assert any("takes the directory over" in str(w.message) for w in caught)
    old.wait_until_finished()  # the old save committed and was recorded: no error
    # the new manager read the state again after the takeover: ckpt-2 is listed
    assert [os.path.basename(p) for p in new.checkpoints] == ["ckpt-1", "ckpt-2", "ckpt-3"]
    np.testing.assert_array_equal(pyckpt.load_checkpoint(str(tmp_path / "ckpt-2")).get_tensor(
        _key(tmp_path / "ckpt-2", "v")), np.full(4, 1.0))
    assert steps_in(tmp_path) == ["ckpt-1", "ckpt-2", "ckpt-3"]
    before = listing(tmp_path)
    with pytest.raises(pyckpt.ConcurrentWriterError):
        old.save()
    assert listing(tmp_path) == before


def test_an_older_manager_never_takes_the_lease_back(tmp_path):
    old = pyckpt.CheckpointManager(_ckpt(1.0), tmp_path)
    new = pyckpt.CheckpointManager(_ckpt(2.0), tmp_path)
    assert new.save() == str(tmp_path / "ckpt-1")  # the lease was free: no warning needed
    before = listing(tmp_path)
    with pytest.raises(pyckpt.ConcurrentWriterError, match="a newer CheckpointManager"):
        old.save()
    assert listing(tmp_path) == before and int(old.checkpoint.save_counter) == 0
    new.close()  # the directory is free again: the old manager may write, seeing ckpt-1
    old.checkpoint.save_counter.assign(1)
    assert old.save() == str(tmp_path / "ckpt-2")
    assert [os.path.basename(p) for p in old.checkpoints] == ["ckpt-1", "ckpt-2"]


def test_a_live_manager_of_another_process_is_still_refused(tmp_path):
    go = tmp_path / "go"
    code = ("import sys, time, os, numpy as np, pyckpt\n"
            "m = pyckpt.CheckpointManager(pyckpt.Checkpoint(v=pyckpt.Variable(np.ones(4))), sys.argv[1])\n"
            "m.save()\n"
            "open(sys.argv[2] + '.ready', 'w').close()\n"
            "t = time.time()\n"
            "while not os.path.exists(sys.argv[2]) and time.time() - t < 120: time.sleep(0.05)\n"
            "m.close()\n")
    run = tmp_path / "run"
    err = open(tmp_path / "stderr.txt", "wb")
    p = subprocess.Popen([sys.executable, "-c", code, str(run), str(go)], cwd=tmp_path, stderr=err)
    try:
        t = time.time()
        while not (tmp_path / "go.ready").exists():
            assert p.poll() is None, (tmp_path / "stderr.txt").read_text()
            assert time.time() - t < 120
            time.sleep(0.05)
        m = pyckpt.CheckpointManager(_ckpt(), run)
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # no takeover across processes
            with pytest.raises(pyckpt.ConcurrentWriterError, match="another CheckpointManager"):
                m.save()
        assert steps_in(run) == ["ckpt-1"]
    finally:
        go.touch()
        p.wait(120)
        err.close()
    assert m.restore_or_initialize() == str(run / "ckpt-1")
    assert m.save() == str(run / "ckpt-2")  # released by the other process: free again


def test_a_failed_save_of_the_old_manager_does_not_hold_up_the_new_one(tmp_path, monkeypatch):
    old_ck = _ckpt(1.0)
    old = pyckpt.CheckpointManager(old_ck, tmp_path)
    old.save()

    def broken(*a, **k):
        raise OSError(28, "No space left on device")

    with monkeypatch.context() as mp:
        mp.setattr(manager_module.saving, "write", broken)
        mp.setattr(manager_module.saving, "stage", lambda *a, **k: broken)
        with pytest.raises(OSError):
            old.save()
        assert old.save(blocking=False) == str(tmp_path / "ckpt-2")  # fails in the background
        with pytest.raises(OSError):
            old.wait_until_finished()
    new = pyckpt.CheckpointManager(_ckpt(2.0), tmp_path)
    new.restore_or_initialize()
    done = []
    t = threading.Thread(target=lambda: done.append(new.save()))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        t.start()
        t.join(60)
    assert done == [str(tmp_path / "ckpt-2")]
    assert steps_in(tmp_path) == ["ckpt-1", "ckpt-2"]
