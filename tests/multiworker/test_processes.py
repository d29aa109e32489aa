"""Multi-worker saves with real processes: torchrun (gloo) and mpiexec (MPICH).

Each launch costs seconds (torch imports), so scenarios are grouped: one
launch saves with 4 workers, one loads with 2 workers in another layout, and
the test process itself loads everything as one process.
"""

import os
import pathlib

import numpy as np
import pytest

import pyckpt
from pyckpt.testing.launch import run_workers

WORKERS = pathlib.Path(__file__).with_name("workers.py")
G = np.arange(10 * 6 * 4, dtype=np.float32).reshape(10, 6, 4)
def launch(engine, n, scenario, path, timeout=180, **kw):
    return run_workers(WORKERS, [engine, scenario, path], n=n, engine=engine, timeout=timeout, **kw)


@pytest.mark.parametrize("engine", ["torch", "mpi"])
def test_save_with_4_workers_load_with_2_and_with_1(engine, tmp_path):
    path = str(tmp_path / "ckpt-1")
    results, r = launch(engine, 4, "save", path)
    assert results == {0: "ok", 1: "ok", 2: "ok", 3: "ok"}, r.stdout + r.stderr[-3000:]
    results, r = launch(engine, 2, "load_columns", path)
    assert results == {0: "ok", 1: "ok"}, r.stdout + r.stderr[-3000:]
    out = pyckpt.load(path)  # one process, no communicator: whole arrays
    np.testing.assert_array_equal(out["rows"], G)
    np.testing.assert_array_equal(out["grid"], G)
    assert out["replicated"]["step"] == 7
    pyckpt.load_checkpoint(path).verify()


@pytest.mark.parametrize("scenario", ["die_before", "die_during"])
def test_a_dying_worker_fails_the_save_on_the_others(scenario, tmp_path):
    path = str(tmp_path / "ckpt")
    # torchrun terminates the survivors at its next poll after worker 2 exits:
    # poll every 10 s, so that they report how their save ended (gloo sees the
    # closed connection at once, pyckpt's collectives raise)
    results, r = launch("torch", 4, scenario, path, timeout=240, monitor_interval=10)
    assert 2 not in results  # it died
    survivors = {k: v for k, v in results.items() if k != 2}
    assert survivors, r.stdout + r.stderr[-3000:]
    for rank, text in survivors.items():
        assert text.startswith("raised"), (rank, text)
    assert not os.path.exists(os.path.join(path, "pyckpt.index"))
    with pytest.raises(pyckpt.CheckpointNotFoundError):
        pyckpt.load(path)
    # a later save to the same path succeeds
    results, r = launch("torch", 4, "save", path)
    assert results == {0: "ok", 1: "ok", 2: "ok", 3: "ok"}, r.stdout + r.stderr[-3000:]
    np.testing.assert_array_equal(pyckpt.load(path)["rows"], G)


def test_checkpoint_manager_with_4_workers(tmp_path):
    path = str(tmp_path / "run")
    results, r = launch("torch", 4, "manager", path)
    assert results == {0: "ok", 1: "ok", 2: "ok", 3: "ok"}, r.stdout + r.stderr[-3000:]
    assert sorted(n for n in os.listdir(path) if n.startswith("ckpt-")) == ["ckpt-3", "ckpt-4"]
    assert pyckpt.latest_checkpoint(path) == os.path.join(path, "ckpt-4")
    reader = pyckpt.load_checkpoint(path)
    assert (reader.get_tensor("table/.ATTRIBUTES/VARIABLE_VALUE") == 4.0).all()


@pytest.mark.parametrize("engine", ["torch", "mpi"])
def test_async_node_local_tiers(engine, tmp_path):
    """Tiered manager, one local directory per worker, blocking=False: the replica
    exchange and commit records run on a background communicator (a gloo group of
    its own; an MPI Dup under MPI_THREAD_MULTIPLE)."""
    path = str(tmp_path)
    results, r = launch(engine, 4, "tiers_async", path)
    assert results == {0: "ok", 1: "ok", 2: "ok", 3: "ok"}, r.stdout + r.stderr[-3000:]
    # ckpt-2 was persisted (every 2nd save): the durable copy holds every worker's row
    reader = pyckpt.load_checkpoint(os.path.join(path, "durable", "ckpt-2"))
    reader.verify()
    rows = reader.get_tensor("mine/per_worker/.ATTRIBUTES/VARIABLE_VALUE")
    np.testing.assert_array_equal(rows[:, 0], [100 * r + 2 for r in range(4)])
