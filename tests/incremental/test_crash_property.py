"""Property: random change schedules, max_to_keep and full_save_every values, and a
kill -9 before any storage mutation of an incremental run; afterwards every
committed checkpoint restores bit-exactly, a restarted manager keeps them whole
through its next saves, and nothing a kept checkpoint references was deleted."""

import json
import os
import pathlib
import subprocess
import sys

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import pyckpt

HERE = pathlib.Path(__file__).parent
sys.path.insert(0, str(HERE))
import kill_child  # noqa: E402

schedules = st.lists(st.lists(st.integers(0, kill_child.N_TENSORS - 1), max_size=3, unique=True),
                     min_size=2, max_size=7)


def _check_all(run, schedule):
    """Every committed checkpoint under ``run`` restores exactly; returns their steps."""
    steps = []
    for name in sorted(os.listdir(run)):
        path = run / name
        if not (path / "pyckpt.index").exists():
            continue
        ck = kill_child.model()
        ck.restore(str(path)).assert_consumed()
        step = int(ck.step)
        for v, want in zip(ck.t, kill_child.expected(schedule, step)):
            assert v.numpy().tobytes() == want.tobytes(), (name, step)
        steps.append(step)
    return steps


@settings(max_examples=12, deadline=None, derandomize=False,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(schedule=schedules, max_to_keep=st.sampled_from([1, 2, 3, None]),
       full_every=st.sampled_from([2, 3, 10]), kill_at=st.integers(0, 40))
def test_kill_anywhere_leaves_every_committed_checkpoint_whole(tmp_path_factory, schedule,
                                                               max_to_keep, full_every,
                                                               kill_at):
    run = tmp_path_factory.mktemp("run")
    spec = {"dir": str(run), "max_to_keep": max_to_keep, "full_every": full_every,
            "schedule": schedule, "kill_at": kill_at}
    proc = subprocess.run([sys.executable, str(HERE / "kill_child.py"), json.dumps(spec)],
                          capture_output=True, text=True, timeout=120, cwd=run)
    assert proc.returncode in (0, -9), proc.stderr
    saved = [int(line.split()[1]) for line in proc.stdout.splitlines()]
    if proc.returncode == 0:
        assert saved == list(range(1, len(schedule) + 1))
    steps = _check_all(run, schedule)
    # the last save reported committed is there, unless a later save, killed before it
    # could report, committed and retired it (max_to_keep)
    assert not saved or saved[-1] in steps or max(steps, default=0) > saved[-1], (saved, steps)
    # a restarted manager: recovery, then two more saves and their retention
    ck = kill_child.model()
    m = pyckpt.CheckpointManager(ck, run, max_to_keep=max_to_keep, incremental=True,
                                 full_save_every=full_every)
    m.restore_or_initialize()
    longer = schedule + [[0], []]
    start = int(ck.step)
    for step in (start + 1, start + 2):
        ck.step.assign(step)
        for v, want in zip(ck.t, kill_child.expected(longer, step)):
            v.assign(want)
        m.save()
    m.close()
    _check_all(run, longer)
    for p in m.checkpoints:  # the kept ones, by the manager's own list
        assert (pathlib.Path(p) / "pyckpt.index").exists()
        pyckpt.load_checkpoint(p).verify()


@pytest.mark.slow
def test_retiring_a_chain_never_leaves_a_committed_checkpoint_without_its_data(tmp_path):
    """Every kill point of a run whose retention retires an incremental checkpoint and
    collects the base it references in one go (max_to_keep=1): the retiring one is
    un-committed before any data it references is deleted (a kill between the two
    once left ckpt-4 committed with ckpt-3's file gone)."""
    schedule = [[], [], [], [], []]
    for kill_at in range(1, 61):
        run = tmp_path / f"k{kill_at}"
        run.mkdir()
        spec = {"dir": str(run), "max_to_keep": 1, "full_every": 2, "schedule": schedule,
                "kill_at": kill_at}
        proc = subprocess.run([sys.executable, str(HERE / "kill_child.py"), json.dumps(spec)],
                              capture_output=True, text=True, timeout=120, cwd=run)
        assert proc.returncode in (0, -9), proc.stderr
        _check_all(run, schedule)
