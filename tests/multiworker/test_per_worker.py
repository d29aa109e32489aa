"""Per-worker state (issue 14): values that differ between workers are declared with
pyckpt.PerWorker, stored once per worker and restored to the same worker; an
undeclared difference under one key is refused on every worker before anything is
committed; identical replicated values are still written once.

One torchrun launch with 4 workers (per_worker_workers.py) covers real processes;
the fast cases run in-process, threads playing the workers (ThreadGroup).
"""

import importlib.util
import json
import os
import pathlib

import numpy as np
import pytest

import pyckpt
from pyckpt import PerWorker
from pyckpt.testing.launch import run_workers
from pyckpt.testing.thread_comm import ThreadGroup

WORKERS = pathlib.Path(__file__).with_name("per_worker_workers.py")
_spec = importlib.util.spec_from_file_location("per_worker_workers", WORKERS)
assert _spec is not None and _spec.loader is not None
workers = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(workers)  # the worker program: its state and helpers


def data_bytes(path):
    """The bytes of a checkpoint's shard files on disk."""
    return sum(os.path.getsize(os.path.join(path, n)) for n in os.listdir(path)
               if n.startswith("data-"))


# ---------------------------------------------------------------------------
# torchrun, 4 workers
# ---------------------------------------------------------------------------

@pytest.fixture(scope="module")
def torchrun_run(tmp_path_factory):
    directory = tmp_path_factory.mktemp("per-worker")
    texts, r = run_workers(WORKERS, [directory], n=4)
    results = {rank: json.loads(t) for rank, t in texts.items()}
    assert sorted(results) == [0, 1, 2, 3], r.stdout + r.stderr[-3000:]
    return directory, results


def _expected_rows():
    import torch

    words = np.stack([workers.pcg_words(workers.generator(r)) for r in range(4)])
    states = []
    for r in range(4):
        torch.manual_seed(2000 + r)
        states.append(torch.get_rng_state().numpy())
    return words, np.stack(states)


def test_declared_state_is_saved_per_worker_and_restored_to_its_worker(torchrun_run):
    directory, results = torchrun_run
    for rank in range(4):
        assert results[rank]["flat_save_and_restore"] == "ok", (rank, results[rank])
        assert results[rank]["manager_save_and_restore"] == "ok", (rank, results[rank])
    words, torch_states = _expected_rows()
    flat = str(directory / "flat")
    out = pyckpt.load(flat)  # without into: every worker's copy, one row each
    np.testing.assert_array_equal(out["rng"]["numpy"], words)
    np.testing.assert_array_equal(out["rng"]["torch"], torch_states)
    np.testing.assert_array_equal(out["data"]["position"], [5, 22, 39, 56])
    assert out["step"] == 42 and out["data"]["epoch"] == 3
    reader = pyckpt.load_checkpoint(flat)
    reader.verify()
    assert sorted(reader._ck.manifest.info["per_worker"]) == [
        "data/position", "rng/numpy", "rng/torch"]
    # one worker's copy from a single process
    pick = {"rng": {"numpy": PerWorker(np.zeros(4, np.uint64), worker=2)}}
    pyckpt.load(flat, into=pick, select="rng/numpy")
    np.testing.assert_array_equal(pick["rng"]["numpy"].value, words[2])
    run = pyckpt.latest_checkpoint(str(directory / "run"))
    rows = pyckpt.load_variable(run, "rng/per_worker/.ATTRIBUTES/VARIABLE_VALUE")
    np.testing.assert_array_equal(rows, words)


def test_identical_values_are_written_once(torchrun_run):
    directory, _ = torchrun_run
    flat = str(directory / "flat")
    reader = pyckpt.load_checkpoint(flat)
    assert reader._ck.blocks(reader._ck.index_of("weights")) == 1
    per_worker = 4 * (4 * 8 + 5056 + 8)  # the rows: numpy words, torch state, position
    total = data_bytes(flat)
    # the 1 MiB of weights once (4 copies would be 4 MiB), the rows, a little padding
    weights = workers.WEIGHTS.nbytes
    assert weights + per_worker <= total < weights + per_worker + 4096, total


def test_undeclared_difference_raises_on_every_worker_and_commits_nothing(torchrun_run):
    directory, results = torchrun_run
    for rank in range(4):
        flat = results[rank]["undeclared_flat"]
        assert flat.startswith("raised ValueError"), (rank, flat)
        assert "'rng' (ranks grouped by value: 0 | 1 | 2 | 3)" in flat, flat
        assert "pyckpt.PerWorker" in flat
        mgr = results[rank]["undeclared_manager"]
        assert mgr.startswith("raised ValueError"), (rank, mgr)
        assert "'position/.ATTRIBUTES/VARIABLE_VALUE'" in mgr and "0 | 1 | 2 | 3" in mgr, mgr
    undeclared = directory / "undeclared"
    assert not (undeclared / "pyckpt.index").exists()
    assert not undeclared.exists() or not any(undeclared.iterdir())
    with pytest.raises(pyckpt.CheckpointNotFoundError):
        pyckpt.load(str(undeclared))
    assert pyckpt.latest_checkpoint(str(directory / "run-undeclared")) is None


# ---------------------------------------------------------------------------
# in-process: threads as workers
# ---------------------------------------------------------------------------

def state(rank):
    return {"rng": PerWorker(np.arange(3, dtype=np.int64) + 10 * rank),
            "pos": PerWorker(100 + rank),
            "var": PerWorker(pyckpt.Variable(np.full(2, float(rank)))),
            "weights": np.ones(1000), "step": 7}


def targets(worker=None):
    return {"rng": PerWorker(np.zeros(3, np.int64), worker=worker),
            "pos": PerWorker(0, worker=worker),
            "var": PerWorker(pyckpt.Variable(np.zeros(2)), worker=worker),
            "weights": np.zeros(1000), "step": 0}


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    path = str(tmp_path_factory.mktemp("pw") / "ckpt")
    assert ThreadGroup(4).run(lambda comm: pyckpt.save(state(comm.rank), path, comm=comm)) \
        == [path] * 4
    return path


def _values(t):
    return t["rng"].value.tolist(), t["pos"].value, t["var"].value.numpy().tolist()


def test_same_world_size_restores_each_workers_copy(saved):
    def load(comm):
        t = targets()
        pyckpt.load(saved, into=t, comm=comm)
        assert t["step"] == 7 and np.array_equal(t["weights"], np.ones(1000))
        return _values(t)

    assert ThreadGroup(4).run(load) == [
        ([10 * r, 10 * r + 1, 10 * r + 2], 100 + r, [float(r)] * 2) for r in range(4)]
    out = pyckpt.load(saved)
    assert out["rng"].shape == (4, 3) and out["pos"].tolist() == [100, 101, 102, 103]
    assert pyckpt.load_checkpoint(saved)._ck.manifest.info["per_worker"] == ["rng", "pos", "var"]


def test_a_different_world_size_is_a_clear_error(saved):
    results = ThreadGroup(2).run(lambda comm: pyckpt.load(saved, into=targets(), comm=comm))
    for e in results:
        assert isinstance(e, ValueError), e
        assert "'rng' holds one value per worker, saved by 4 workers; this load runs on " \
               "2 workers" in str(e)
        assert "PerWorker(target, worker=i)" in str(e)
    with pytest.raises(ValueError, match="saved by 4 workers; this load runs on 1 worker"):
        pyckpt.load(saved, into=targets())  # one process


def test_explicit_worker_pick_works_on_any_world_size(saved):
    for w in range(4):
        t = targets(worker=w)
        pyckpt.load(saved, into=t)
        assert _values(t) == ([10 * w, 10 * w + 1, 10 * w + 2], 100 + w, [float(w)] * 2)
    picked = ThreadGroup(2).run(
        lambda comm: _values(pyckpt.load(saved, into=targets(worker=3 - comm.rank), comm=comm)))
    assert [p[1] for p in picked] == [103, 102]
    with pytest.raises(ValueError, match=r"worker=4\) asked for a copy that does not exist"):
        pyckpt.load(saved, into=targets(worker=4))


def test_per_worker_value_into_a_plain_target_says_so(saved):
    with pytest.raises(ValueError, match=r"one value per worker: load it into pyckpt.PerWorker"):
        pyckpt.load(saved, into={"rng": np.zeros(3, np.int64)})


def test_undeclared_difference_is_refused_on_every_worker(tmp_path):
    path = tmp_path / "bad"
    big = np.zeros(3 << 18)  # 6 MiB, several checksum chunks: differs in the last byte only

    def save(comm):
        b = big.copy()
        b[-1] = comm.rank // 2
        return pyckpt.save({"w": np.ones(10), "opt": {"moment": b}, "seed": comm.rank % 2},
                           str(path), comm=comm)

    results = ThreadGroup(4).run(save)
    for e in results:
        assert isinstance(e, ValueError), e
        assert "'opt/moment' (ranks grouped by value: 0, 1 | 2, 3)" in str(e)
        assert "'seed' (ranks grouped by value: 0, 2 | 1, 3)" in str(e)
        assert "'w'" not in str(e)
    assert not (path / "pyckpt.index").exists()
    assert not path.exists() or not any(path.iterdir())  # nothing written at all


def test_identical_values_are_written_once_in_process(tmp_path):
    path = str(tmp_path / "same")
    big = np.arange(1 << 17, dtype=np.float64)  # 1 MiB on every worker
    ThreadGroup(4).run(lambda comm: pyckpt.save({"w": big, "step": 3}, path, comm=comm))
    m = pyckpt.load_checkpoint(path)._ck.manifest
    assert len(m.files) >= 1 and sum(f.size for f in m.files) < big.nbytes + 1024
    assert big.nbytes <= data_bytes(path) < big.nbytes + 1024


def test_declarations_must_agree(tmp_path):
    def half(comm):
        v = np.arange(3) + comm.rank
        return pyckpt.save({"x": PerWorker(v) if comm.rank < 2 else v}, str(tmp_path / "a"),
                           comm=comm)

    for e in ThreadGroup(4).run(half):
        assert isinstance(e, ValueError) and "'x' is declared pyckpt.PerWorker on ranks 0, 1 " \
            "but not on ranks 2, 3" in str(e), e

    def shapes(comm):
        return pyckpt.save({"x": PerWorker(np.zeros(comm.rank + 1))}, str(tmp_path / "b"),
                           comm=comm)

    for e in ThreadGroup(2).run(shapes):
        assert isinstance(e, ValueError) and "PerWorker value 'x' must have one dtype and " \
            "shape on every worker" in str(e), e


def test_checkpoint_graph_with_per_worker_values(tmp_path):
    path = str(tmp_path / "graph")

    def make(rank=0, worker=None):
        return pyckpt.Checkpoint(rng=PerWorker(np.arange(3) + 10 * rank, worker=worker),
                                 pos=PerWorker(pyckpt.Variable(100 + rank), worker=worker),
                                 w=pyckpt.Variable(np.ones(4)))

    ThreadGroup(4).run(lambda comm: make(comm.rank).write(path, comm=comm))
    assert dict(pyckpt.list_variables(path))["rng/per_worker/.ATTRIBUTES/VARIABLE_VALUE"] == (4, 3)
    for w in range(4):
        ck = make(worker=w)
        ck.rng.value[:] = 0
        ck.pos.value.assign(0)
        ck.restore(path).assert_consumed()
        assert ck.rng.value.tolist() == [10 * w, 10 * w + 1, 10 * w + 2]
        assert int(ck.pos.value) == 100 + w
    with pytest.raises(ValueError, match="saved by 4 workers; this load runs on 1 worker"):
        make().restore(path)


def test_single_process_and_older_checkpoints(tmp_path):
    one = str(tmp_path / "one")
    pyckpt.save({"a": PerWorker(np.arange(2.0)), "n": PerWorker(5)}, one)
    assert pyckpt.load(one)["a"].shape == (1, 2)
    t = {"a": PerWorker(np.zeros(2)), "n": PerWorker(0)}
    pyckpt.load(one, into=t)
    assert t["a"].value.tolist() == [0.0, 1.0] and t["n"].value == 5 and type(t["n"].value) is int
    handle = pyckpt.save({"a": PerWorker(np.arange(2.0))}, one, blocking=False)
    assert handle.wait() == one
    # a checkpoint saved before the value was declared per-worker loads into a PerWorker
    old = str(tmp_path / "old")
    pyckpt.save({"a": np.arange(2.0)}, old)
    t = {"a": PerWorker(np.zeros(2))}
    pyckpt.load(old, into=t)
    assert t["a"].value.tolist() == [0.0, 1.0]


def test_per_worker_declaration_is_checked():
    with pytest.raises(TypeError):
        PerWorker({"a": 1})
    with pytest.raises(TypeError):
        PerWorker(PerWorker(1))
    with pytest.raises(ValueError):
        PerWorker(1, worker=-1)
    assert repr(PerWorker(3, worker=1)) == "PerWorker(3, worker=1)"
