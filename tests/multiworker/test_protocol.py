"""The multi-worker save protocol with threads as workers (fast, in-process);
real processes (torchrun, mpiexec) are in test_torchrun.py and test_mpi.py."""

import os
import time

import numpy as np

import pyckpt
from pyckpt.testing.thread_comm import ThreadGroup

G = np.arange(10 * 6 * 4, dtype=np.float32).reshape(10, 6, 4)  # a 3-D global array


def rows(rank, world, n=10):
    """Uneven row split: rank r gets [starts[r], starts[r+1])."""
    starts = [0, 4, 4, 7, 10][: world + 1] if world == 4 else np.linspace(0, n, world + 1).astype(int)
    return int(starts[rank]), int(starts[rank + 1])


def worker_tree(comm):
    a, b = rows(comm.rank, comm.world_size)
    col = slice(0, 3) if comm.rank % 2 == 0 else slice(3, 6)  # also split along axis 1
    return {
        "rows": pyckpt.ShardedArray(G[a:b], G.shape, (a, 0, 0)),          # rank 1: zero rows
        "grid": pyckpt.ShardedArray(G[comm.rank // 2 * 5:(comm.rank // 2 + 1) * 5, col],
                                    G.shape, (comm.rank // 2 * 5, col.start, 0)),
        "replicated": {"lr": np.float32(0.1), "table": np.arange(1000.0), "step": 7},
    }


def test_four_workers_save_and_any_layout_loads(tmp_path):
    path = str(tmp_path / "ckpt-1")
    group = ThreadGroup(4)
    results = group.run(lambda comm: pyckpt.save(worker_tree(comm), path, comm=comm))
    assert results == [path] * 4
    out = pyckpt.load(path)  # one process, no comm: whole arrays
    np.testing.assert_array_equal(out["rows"], G)
    np.testing.assert_array_equal(out["grid"], G)
    assert out["replicated"]["step"] == 7
    reader = pyckpt.load_checkpoint(path)
    reader.verify()
    # replicated values were written once, and not all by rank 0
    m = reader._ck.manifest
    assert len(m.files) >= 2 and len({f.name.split("-")[2] for f in m.files}) >= 2
    # two workers load column-sharded blocks of the row-sharded array
    for c0, c1 in [(0, 2), (2, 6)]:
        target = pyckpt.ShardedArray(np.zeros((10, c1 - c0, 4), np.float32), G.shape, (0, c0, 0))
        pyckpt.load(path, into={"rows": target})
        np.testing.assert_array_equal(target.local, G[:, c0:c1])
    # an arbitrary box across block boundaries
    box = pyckpt.ShardedArray(np.zeros((5, 4, 2), np.float32), G.shape, (3, 1, 2))
    pyckpt.load(path, into={"grid": box})
    np.testing.assert_array_equal(box.local, G[3:8, 1:5, 2:4])


def test_invalid_layouts_are_refused_on_every_worker(tmp_path):
    path = str(tmp_path / "bad")

    def overlap(comm):
        a = 0 if comm.rank == 0 else 3  # rows 3..5 twice
        return pyckpt.save({"x": pyckpt.ShardedArray(G[a:a + 6], G.shape, (a, 0, 0))}, path,
                           comm=comm)

    results = ThreadGroup(2).run(overlap)
    for r in results:
        assert isinstance(r, ValueError) and "'x'" in str(r) and "cover" in str(r)
    assert not os.path.exists(os.path.join(path, "pyckpt.index"))

    def disagree(comm):
        dtype = np.float32 if comm.rank == 0 else np.float64
        return pyckpt.save({"r": np.zeros(3, dtype)}, path, comm=comm)

    for r in ThreadGroup(2).run(disagree):
        assert isinstance(r, ValueError) and "disagree" in str(r)


def test_a_failing_worker_fails_the_save_everywhere_and_nothing_commits(tmp_path, monkeypatch):
    path = str(tmp_path / "ckpt")
    from pyckpt.engine import writer

    real = writer.write_data

    def flaky(store, p, tensors, *, attempt, rank=0, options=writer.DEFAULT):
        if rank == 2:
            raise OSError(28, "No space left on device")
        return real(store, p, tensors, attempt=attempt, rank=rank, options=options)

    monkeypatch.setattr(writer, "write_data", flaky)
    results = ThreadGroup(4).run(lambda comm: pyckpt.save(worker_tree(comm), path, comm=comm))
    for r in results:
        assert isinstance(r, pyckpt.CheckpointError)
        assert "rank 2" in str(r) and "No space" in str(r)
    assert not os.path.exists(os.path.join(path, "pyckpt.index"))
    assert [n for n in os.listdir(path) if n.startswith("data-")] == []  # attempt cleaned up
    monkeypatch.undo()
    assert ThreadGroup(4).run(lambda comm: pyckpt.save(worker_tree(comm), path, comm=comm)) == [path] * 4


def test_a_dead_worker_makes_the_others_raise_within_the_timeout(tmp_path):
    path = str(tmp_path / "ckpt")

    def body(comm):
        if comm.rank == 3:
            return "died"  # never takes part
        return pyckpt.save(worker_tree(comm), path, comm=comm)

    t = time.monotonic()
    results = ThreadGroup(4, timeout=1.0).run(body)
    assert time.monotonic() - t < 10
    assert results[3] == "died"
    for r in results[:3]:
        assert isinstance(r, pyckpt.dist.WorkerTimeoutError)
    assert "3" in str(results[0])  # the coordinator names the missing worker
    assert not os.path.exists(os.path.join(path, "pyckpt.index"))


def test_checkpoint_save_with_workers_spreads_replicated_values(tmp_path):
    def body(comm):
        ck = pyckpt.Checkpoint(layers=[pyckpt.Variable(np.full(1000, float(i))) for i in range(8)])
        return ck.save(str(tmp_path / "ck"), comm=comm)

    paths = ThreadGroup(4).run(body)
    assert paths == [str(tmp_path / "ck-1")] * 4
    m = pyckpt.load_checkpoint(paths[0])._ck.manifest
    ranks = {f.name.split("-")[2] for f in m.files}
    assert len(ranks) > 1  # not all written by rank 0
    restored = pyckpt.Checkpoint(layers=[pyckpt.Variable(np.zeros(1000)) for _ in range(8)])
    restored.restore(paths[0]).assert_consumed()
    assert float(restored.layers[5][0]) == 5.0
