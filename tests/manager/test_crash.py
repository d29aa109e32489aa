"""Crash safety with real processes: a saving child is SIGKILLed at random moments.

After every kill the latest checkpoint must load, verify, hold the values of one
consistent step, never be older than the last step the child reported saved,
and old checkpoints must not pile up across restarts.
"""

import os
import pathlib
import random
import time

import numpy as np

import pyckpt
from pyckpt.testing.crash import run_and_kill

CHILD = pathlib.Path(__file__).with_name("crash_child.py")
KILLS = 12
MAX_TO_KEEP = 3


def _run_and_kill(directory, rng):
    _, saved = run_and_kill([CHILD, directory], rng)
    return saved[-1] if saved else None


def _check(directory, last_saved):
    latest = pyckpt.latest_checkpoint(directory)
    if latest is None:
        assert last_saved is None
        return 0
    reader = pyckpt.load_checkpoint(latest)
    reader.verify()
    step = int(reader.get_tensor("step/.ATTRIBUTES/VARIABLE_VALUE"))
    for key in reader.keys():
        values = reader.get_tensor(key)
        assert (values == step).all(), f"{latest}: {key} is not all {step}"  # one consistent step
    assert last_saved is None or step >= last_saved
    names = [n for n in os.listdir(directory) if n.startswith("ckpt-")]
    committed = [n for n in names if os.path.exists(os.path.join(directory, n, "pyckpt.index"))]
    # at most one commit not yet recorded, at most one uncommitted leftover
    assert len(committed) <= MAX_TO_KEEP + 1, names
    assert len(names) <= MAX_TO_KEEP + 2, names
    temps = [n for n in os.listdir(directory) if ".tmp-" in n]
    assert len(temps) <= 1, temps  # interrupted state/lock writes are cleaned up too
    return step


def test_sigkill_at_random_moments(tmp_path):
    rng = random.Random(20261122)
    directory = tmp_path / "run"
    last_step = 0
    started = time.monotonic()
    for _ in range(KILLS):
        last_saved = _run_and_kill(directory, rng)
        step = _check(directory, last_saved)
        assert step >= last_step  # never goes backwards across restarts
        last_step = step
        assert time.monotonic() - started < 300
    assert last_step > 0
    # A final restart restores the latest and keeps going with the right numbers.
    ck = pyckpt.Checkpoint(step=pyckpt.Variable(np.int64(0)))
    m = pyckpt.CheckpointManager(ck, directory, max_to_keep=MAX_TO_KEEP)
    status = m.restore_or_initialize()
    assert status == pyckpt.latest_checkpoint(directory)
    assert int(ck.step) == last_step
