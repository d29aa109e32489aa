"""CheckpointManager.save(blocking=False) with several workers (docs/PROTOCOL.md 6b),
played by threads (pyckpt.testing.thread_comm): the collectives run in save(), the
commit in the background through the store."""

import os
import threading
import time

import numpy as np
import pytest

import pyckpt
from pyckpt.workers import background
from pyckpt.workers.save import DistributedSaveError
from pyckpt.engine import commit as commits, writer
from pyckpt.testing.thread_comm import ThreadGroup

ROWS = 8


def state_for(rank, world):
    """Each worker's own table (a PerWorker value: this worker's rows), a replicated
    vector and a step."""
    return pyckpt.Checkpoint(table=pyckpt.PerWorker(np.zeros((ROWS // world, 1000))),
                             bias=pyckpt.Variable(np.zeros(50_000)), step=pyckpt.Variable(0))


def set_step(ck, rank, step):
    ck.table.value[...] = step * 100 + rank
    ck.bias.assign(np.full(50_000, float(step)))
    ck.step.assign(step)


def expected_table(world, step):
    rows = ROWS // world
    return np.repeat(np.arange(world) + step * 100, rows)[:, None] * np.ones((1, 1000))


@pytest.fixture
def slow_commit(monkeypatch):
    """Rank 0 commits 0.3 s late, so that save() visibly returns first."""
    real = commits.finish

    def slow(*a, **k):
        time.sleep(0.3)
        return real(*a, **k)

    monkeypatch.setattr(commits, "finish", slow)


@pytest.mark.parametrize("world", [2, 4])
def test_async_saves_hold_the_values_at_the_call(tmp_path, world, slow_commit):
    def body(comm):
        ck = state_for(comm.rank, world)
        mgr = pyckpt.CheckpointManager(ck, tmp_path, max_to_keep=2, comm=comm)
        paths, returned = [], []
        for step in (1, 2, 3):
            set_step(ck, comm.rank, step)
            t = time.perf_counter()
            paths.append(mgr.save(blocking=False))
            returned.append(time.perf_counter() - t)
            assert not os.path.exists(os.path.join(paths[-1], "pyckpt.index")) or step > 1
            set_step(ck, comm.rank, -step)  # training goes on, mutating the state at once
        mgr.wait_until_finished()
        out = (paths, [os.path.basename(p) for p in mgr.checkpoints], int(ck.save_counter),
               min(returned))
        mgr.close()
        return out

    results = ThreadGroup(world).run(body)
    for r in results:
        assert not isinstance(r, BaseException), r
    paths, kept, counter, fastest = results[0]
    assert all(r[:3] == (paths, kept, counter) for r in results)
    assert kept == ["ckpt-2", "ckpt-3"] and counter == 3
    assert fastest < 0.3  # returned before the (slow) commit
    assert not os.path.exists(paths[0])  # retention ran on rank 0
    for step, path in ((2, paths[1]), (3, paths[2])):
        out = pyckpt.load(path)
        table = out["table"]["per_worker"][".ATTRIBUTES"]["VARIABLE_VALUE"]
        np.testing.assert_array_equal(table.reshape(ROWS, 1000), expected_table(world, step))
        assert (out["bias"][".ATTRIBUTES"]["VARIABLE_VALUE"] == step).all()
        assert int(out["step"][".ATTRIBUTES"]["VARIABLE_VALUE"]) == step
        pyckpt.load_checkpoint(path).verify()
        left = [n for n in os.listdir(path) if not n.startswith("data-") and n != "pyckpt.index"]
        assert left == []  # no part file, failure file or attempt marker left behind
    assert pyckpt.latest_checkpoint(tmp_path) == paths[2]
    # a restore with the same layout
    def restore(comm):  # (the thread communicator is not found by restore: name the row)
        ck = pyckpt.Checkpoint(table=pyckpt.PerWorker(np.zeros((ROWS // world, 1000)),
                                                      worker=comm.rank),
                               bias=pyckpt.Variable(np.zeros(50_000)), step=pyckpt.Variable(0))
        mgr = pyckpt.CheckpointManager(ck, tmp_path, comm=comm)
        assert mgr.restore_or_initialize() == paths[2]
        assert int(ck.step) == 3 and int(ck.save_counter) == 3
        return ck.table.value.copy()

    tables = ThreadGroup(world).run(restore)
    np.testing.assert_array_equal(np.concatenate(tables), expected_table(world, 3))


def test_save_returns_before_the_background_finishes_and_the_next_save_waits(tmp_path,
                                                                           slow_commit):
    def body(comm):
        ck = state_for(comm.rank, 2)
        mgr = pyckpt.CheckpointManager(ck, tmp_path, comm=comm)
        set_step(ck, comm.rank, 1)
        first = mgr.save(blocking=False)
        set_step(ck, comm.rank, 2)
        second = mgr.save()  # blocking: waits for the first, then saves
        return first, second, [os.path.basename(p) for p in mgr.checkpoints]

    results = ThreadGroup(2).run(body)
    assert results[0] == results[1]
    first, second, kept = results[0]
    assert kept == ["ckpt-1", "ckpt-2"]
    assert int(pyckpt.load_variable(first, "step/.ATTRIBUTES/VARIABLE_VALUE")) == 1
    assert int(pyckpt.load_variable(second, "step/.ATTRIBUTES/VARIABLE_VALUE")) == 2


@pytest.mark.parametrize("failing_rank", [0, 2])
def test_a_failed_background_write_commits_nothing_and_raises_on_every_worker(
        tmp_path, monkeypatch, failing_rank):
    real = writer.write_data
    failed_once = []

    def write_data(store, path, tensors, *, attempt, rank=0, options=writer.DEFAULT):
        if rank == failing_rank and path.endswith("ckpt-2") and not failed_once:
            failed_once.append(attempt)
            raise OSError(28, "No space left on device")
        return real(store, path, tensors, attempt=attempt, rank=rank, options=options)

    monkeypatch.setattr(writer, "write_data", write_data)
    world = 4

    def body(comm):
        ck = state_for(comm.rank, world)
        mgr = pyckpt.CheckpointManager(ck, tmp_path, comm=comm)
        set_step(ck, comm.rank, 1)
        mgr.save(blocking=False)
        set_step(ck, comm.rank, 2)
        failed = mgr.save(blocking=False)  # returns: the write fails in the background
        outcome = None
        try:
            set_step(ck, comm.rank, 3)
            mgr.save(blocking=False)  # the next call raises the failure
        except DistributedSaveError as e:
            outcome = str(e)
        counter_after = int(ck.save_counter)
        third = mgr.save(blocking=False)  # and the run goes on
        mgr.wait_until_finished()
        return failed, outcome, counter_after, third, [os.path.basename(p) for p in mgr.checkpoints]

    t = time.monotonic()
    results = ThreadGroup(world).run(body)
    assert time.monotonic() - t < 8  # the failure file ends every wait at once
    for r in results:
        assert not isinstance(r, BaseException), r
        failed, outcome, counter_after, third, kept = r
        assert failed.endswith("ckpt-2")
        assert outcome is not None and "No space left on device" in outcome, outcome
        assert f"rank {failing_rank}" in outcome
        assert counter_after == 1  # the failed save gave its number back everywhere
        assert third.endswith("ckpt-2")  # the number is used again
        assert kept == ["ckpt-1", "ckpt-2"]
    assert int(pyckpt.load_variable(third, "step/.ATTRIBUTES/VARIABLE_VALUE")) == 3
    pyckpt.load_checkpoint(third).verify()
    assert sorted(n for n in os.listdir(tmp_path) if n.startswith("ckpt-")) == \
        ["ckpt-1", "ckpt-2"]
    assert not [n for n in os.listdir(third) if n.startswith(("pyckpt-part", "pyckpt-failed"))]


def _rank_1_writes_fail(monkeypatch, before=lambda: None, when=lambda: True):
    """Rank 1's data writes raise EIO (after ``before()``) while ``when()`` holds."""
    real = writer.write_data

    def write_data(store, path, tensors, *, attempt, rank=0, options=writer.DEFAULT):
        if rank == 1 and when():
            before()
            raise OSError(5, "Input/output error")
        return real(store, path, tensors, attempt=attempt, rank=rank, options=options)

    monkeypatch.setattr(writer, "write_data", write_data)


def test_a_failure_surfaces_at_wait_until_finished_and_nothing_is_committed(tmp_path,
                                                                             monkeypatch):
    gate = threading.Event()
    _rank_1_writes_fail(monkeypatch, before=lambda: gate.wait(5))

    def body(comm):
        ck = state_for(comm.rank, 2)
        mgr = pyckpt.CheckpointManager(ck, tmp_path, comm=comm)
        path = mgr.save(blocking=False)
        if comm.rank == 0:
            time.sleep(0.2)
            assert not os.path.exists(os.path.join(path, "pyckpt.index"))
            gate.set()
        with pytest.raises(DistributedSaveError, match="Input/output error"):
            mgr.wait_until_finished()
        assert not os.path.exists(os.path.join(path, "pyckpt.index"))
        assert mgr.checkpoints == [] and int(ck.save_counter) == 0
        mgr.wait_until_finished()  # raised once
        return path

    results = ThreadGroup(2).run(body)
    for r in results:
        assert not isinstance(r, BaseException), r
    with pytest.raises(pyckpt.CheckpointNotFoundError):
        pyckpt.load(results[0])
    assert pyckpt.latest_checkpoint(tmp_path) is None


def test_a_worker_that_never_publishes_times_out_on_rank_0(tmp_path, monkeypatch):
    real_run = background.BackgroundSave.run

    def run(self):
        if self.rank == 1:
            return  # as if it died after save() returned: no part, no data
        return real_run(self)

    monkeypatch.setattr(background.BackgroundSave, "run", run)

    def body(comm):
        mgr = pyckpt.CheckpointManager(state_for(comm.rank, 2), tmp_path, comm=comm)
        path = mgr.save(blocking=False)
        if comm.rank == 0:
            with pytest.raises(DistributedSaveError, match=r"no part from rank\(s\) \[1\]"):
                mgr.wait_until_finished()
        return path

    t = time.monotonic()
    results = ThreadGroup(2, timeout=0.5).run(body)
    assert time.monotonic() - t < 5
    assert not isinstance(results[0], BaseException), results[0]
    assert not os.path.exists(os.path.join(results[0], "pyckpt.index"))


def test_non_lead_waits_for_rank_0_and_times_out_when_it_is_gone(tmp_path, monkeypatch):
    real_run = background.BackgroundSave.run

    def run(self):
        if self.rank == 0:
            return  # rank 0 stopped after save() returned
        return real_run(self)

    monkeypatch.setattr(background.BackgroundSave, "run", run)

    def body(comm):
        mgr = pyckpt.CheckpointManager(state_for(comm.rank, 2), tmp_path, comm=comm)
        mgr.save(blocking=False)
        if comm.rank == 1:
            with pytest.raises(pyckpt.dist.WorkerTimeoutError, match="no outcome from rank 0"):
                mgr.wait_until_finished()
            assert mgr.checkpoints == []
        return None

    results = ThreadGroup(2, timeout=0.5).run(body)
    assert results == [None, None]


def test_workers_that_disagree_on_the_number_refuse_together(tmp_path):
    def body(comm):
        mgr = pyckpt.CheckpointManager(state_for(comm.rank, 2), tmp_path, comm=comm)
        with pytest.raises(ValueError, match="different checkpoints"):
            mgr.save(checkpoint_number=10 + comm.rank, blocking=False)
        return mgr.save(checkpoint_number=5, blocking=False) and mgr.wait_until_finished()

    assert ThreadGroup(2).run(body) == [None, None]
    assert os.path.basename(pyckpt.latest_checkpoint(tmp_path)) == "ckpt-5"


def test_max_async_bytes_anywhere_makes_every_worker_save_blocking(tmp_path, monkeypatch):
    started = []
    real = background.prepare
    monkeypatch.setattr(background, "prepare", lambda *a, **k: started.append(1) or real(*a, **k))

    def body(comm):
        ck = state_for(comm.rank, 2)
        limit = None if comm.rank == 0 else 1000  # rank 1's state does not fit
        mgr = pyckpt.CheckpointManager(ck, tmp_path, comm=comm, max_async_bytes=limit)
        return mgr.save(blocking=False)

    paths = ThreadGroup(2).run(body)
    assert paths[0] == paths[1] and started == []
    assert os.path.exists(os.path.join(paths[0], "pyckpt.index"))


@pytest.mark.parametrize("waited", [True, False])
def test_a_worker_that_stopped_waiting_catches_up_with_rank_0s_commit(tmp_path, monkeypatch,
                                                                      waited):
    real = commits.finish
    calls = []

    def late(*a, **k):  # rank 0 commits ckpt-1 long after the others stopped waiting
        calls.append(1)
        time.sleep(1.0 if len(calls) == 1 else 0)
        return real(*a, **k)

    monkeypatch.setattr(commits, "finish", late)

    def body(comm):
        comm.timeout = 0.4  # the background waits' limit (the group's collectives wait 10 s)
        ck = state_for(comm.rank, 2)
        mgr = pyckpt.CheckpointManager(ck, tmp_path, comm=comm)
        first = mgr.save(blocking=False)
        if waited:  # the error surfaces here, once
            if comm.rank == 1:
                with pytest.raises(pyckpt.dist.WorkerTimeoutError, match="no outcome"):
                    mgr.wait_until_finished()
                assert mgr.checkpoints == [] and int(ck.save_counter) == 0
            else:
                mgr.wait_until_finished()
        else:  # the next save raises it on every worker; rank 1 catches up meanwhile
            with pytest.raises(pyckpt.CheckpointError, match="no outcome") as info:
                mgr.save(blocking=False)
            assert comm.rank == 1 or "rank 1: WorkerTimeoutError" in str(info.value)
            assert mgr.checkpoints == [first] and int(ck.save_counter) == 1
        second = mgr.save(blocking=False)
        mgr.wait_until_finished()
        return second, [os.path.basename(p) for p in mgr.checkpoints], int(ck.save_counter)

    results = ThreadGroup(2).run(body)
    assert results[0] == results[1], results
    assert results[0][1:] == (["ckpt-1", "ckpt-2"], 2)


class FakeTensor:
    """A tensor in the memory of a fake device whose copies land late and out of order
    (pyckpt.testing.late_copies): staging must wait for them before save() returns."""

    def __init__(self, data, engine, name):
        self.data = np.array(data, order="C")
        self.engine, self.name = engine, name


@pytest.fixture
def fakedev():
    from pyckpt import registry

    def as_device(obj):
        return obj.engine.array(obj.data, obj.name) if isinstance(obj, FakeTensor) else None

    saved = list(registry._ADAPTERS)
    registry.register_adapter("fakedev", leaf=as_device, target=as_device)
    yield
    registry._ADAPTERS[:] = saved


def test_device_values_are_staged_by_each_worker_before_save_returns(tmp_path, fakedev):
    from pyckpt.testing.late_copies import LateCopyEngine

    def body(comm):
        eng = LateCopyEngine(delay=0.02)
        w = FakeTensor(np.zeros((64, 32), np.float32), eng, f"w{comm.rank}")
        own = FakeTensor(np.zeros(100, np.float32), eng, f"own{comm.rank}")
        ck = pyckpt.Checkpoint(w=w, own=pyckpt.PerWorker(own), step=pyckpt.Variable(0))
        mgr = pyckpt.CheckpointManager(ck, tmp_path, comm=comm)
        paths = []
        for step in (1, 2):
            w.data[...] = step
            own.data[...] = step * 10 + comm.rank
            ck.step.assign(step)
            paths.append(mgr.save(blocking=False))
            w.data[...] = -1  # in place, at once: the late copies must have landed already
            own.data[...] = -1
        mgr.wait_until_finished()
        assert any(e[1] == "d2h" for e in eng.log)
        return paths

    results = ThreadGroup(3).run(body)
    assert results[0] == results[1] == results[2], results
    for step, path in zip((1, 2), results[0]):
        out = pyckpt.load(path)
        assert (out["w"][".ATTRIBUTES"]["VARIABLE_VALUE"] == step).all()
        own = out["own"]["per_worker"][".ATTRIBUTES"]["VARIABLE_VALUE"]
        np.testing.assert_array_equal(own, step * 10 + np.arange(3.0)[:, None] * np.ones(100))


def test_a_failed_device_copy_refuses_the_save_on_every_worker(tmp_path, fakedev):
    from pyckpt.testing.late_copies import LateCopyEngine

    def body(comm):
        eng = LateCopyEngine(delay=0.0)
        w = FakeTensor(np.ones((8, 8), np.float32), eng, f"w{comm.rank}")
        ck = pyckpt.Checkpoint(w=w, step=pyckpt.Variable(0))
        mgr = pyckpt.CheckpointManager(ck, tmp_path, comm=comm)
        if comm.rank == 1:
            eng.fail_on("w1")
        with pytest.raises(ValueError, match="refused: rank 1"):
            mgr.save(blocking=False)  # in save() itself: nothing went to the background
        assert int(ck.save_counter) == 0
        eng.failing.clear()
        path = mgr.save(blocking=False)
        mgr.wait_until_finished()
        return path

    results = ThreadGroup(2).run(body)
    assert results[0] == results[1] and results[0].endswith("ckpt-1"), results
    assert sorted(n for n in os.listdir(tmp_path) if n.startswith("ckpt-")) == ["ckpt-1"]
    assert not [n for n in os.listdir(results[0]) if n.startswith(("pyckpt-part", "pyckpt-att"))]


def test_files_of_a_failure_raised_by_wait_until_finished_go_at_the_next_save(tmp_path,
                                                                              monkeypatch):
    """Regression: the error taken by wait_until_finished() must not make the next save
    forget the failed attempt's files (rank 0 removes them after the settle)."""
    failing = {"on": True}
    _rank_1_writes_fail(monkeypatch, when=lambda: failing["on"])

    def body(comm):
        ck = state_for(comm.rank, 2)
        mgr = pyckpt.CheckpointManager(ck, tmp_path, comm=comm)
        failed = mgr.save(blocking=False)
        with pytest.raises(DistributedSaveError):
            mgr.wait_until_finished()
        comm.all_gather(None)
        if comm.rank == 0:
            failing["on"] = False
        comm.all_gather(None)
        saved = mgr.save()
        mgr.close()
        return failed, saved

    results = ThreadGroup(2).run(body)
    for r in results:
        assert not isinstance(r, BaseException), r
    failed, saved = results[0]
    assert failed == saved  # the number was given back, and reused
    assert sorted(n for n in os.listdir(saved)
                  if not (n.startswith("data-") or n == "pyckpt.index")) == []
    pyckpt.load_checkpoint(saved).verify()
