"""Tiered managers of multi-worker jobs (docs/API.md section 13, docs/PROTOCOL.md
section 7): each worker a local directory of its own, replicas on the next worker,
restores from the peers and from the durable tier. Workers are threads with a
ThreadComm here; tests/multiworker/test_tiers_torchrun.py runs real processes."""

import os
import shutil

import numpy as np
import pytest

import pyckpt
from pyckpt.workers import node_local
from pyckpt.errors import CheckpointError
from pyckpt.testing.thread_comm import ThreadGroup

W = 4


def _ck(rank):
    return pyckpt.Checkpoint(w=pyckpt.Variable(np.zeros(3000, np.float32)),
                             mine=pyckpt.PerWorker(np.zeros(500, np.float64)))


def _set(ck, rank, step):
    ck.w.assign(np.full(3000, float(step), np.float32))
    ck.mine.value[:] = 100 * rank + step


def _run(fn, timeout=30):
    out = ThreadGroup(W, timeout=timeout).run(fn)
    for o in out:
        if isinstance(o, BaseException):
            raise o
    return out


def _manager(base, comm, ck, **kw):
    opts = dict(max_to_keep=5, local_max_to_keep=2, persist_every=3, replicate=1)
    opts.update(kw)
    return pyckpt.CheckpointManager(ck, os.path.join(base, "durable"), comm=comm,
                                    local_dir=os.path.join(base, f"node{comm.rank}"), **opts)


def _train(base, steps, **kw):
    def fn(comm):
        ck = _ck(comm.rank)
        with _manager(base, comm, ck, **kw) as m:
            got = m.restore_or_initialize()
            first = int(ck.save_counter)
            for step in range(first + 1, first + steps + 1):
                _set(ck, comm.rank, step)
                m.save()
        return got
    return _run(fn)


def _restore(base, **kw):
    def fn(comm):
        ck = _ck(comm.rank)
        with _manager(base, comm, ck, **kw) as m:
            got = m.restore_or_initialize()
        return got, float(ck.w.numpy()[0]), float(ck.mine.value[0]), int(ck.save_counter)
    return _run(fn)


def _files(base, node, name):
    return sorted(os.listdir(os.path.join(base, f"node{node}", name)))


def _ranks(names):
    return sorted({node_local.writer_rank(n) for n in names if n.startswith("data-")})


def _fail_replica_write(monkeypatch, name):
    """Node 3's first write of replicas of checkpoint ``name`` fails (disk full)."""
    real = node_local._write_files
    failures = []

    def failing(store, path, files):
        if files and "node3" in path and name in path and not failures:
            failures.append(path)
            raise OSError(28, "No space left on device")
        return real(store, path, files)

    monkeypatch.setattr(node_local, "_write_files", failing)


def test_each_node_holds_its_part_and_its_predecessors_replica(tmp_path):
    base = str(tmp_path)
    _train(base, 4)
    for r in range(W):
        assert sorted(n for n in os.listdir(os.path.join(base, f"node{r}"))
                      if n.startswith("ckpt-")) == ["ckpt-3", "ckpt-4"]  # local_max_to_keep=2
        names = _files(base, r, "ckpt-4")
        assert "pyckpt.index" in names
        assert _ranks(names) == sorted({r, (r - 1) % W})
    # persist_every=3: ckpt-3 reached the durable tier, committed, all four parts in it
    assert sorted(n for n in os.listdir(tmp_path / "durable") if n.startswith("ckpt-")) == ["ckpt-3"]
    durable = sorted(os.listdir(tmp_path / "durable" / "ckpt-3"))
    assert _ranks(durable) == [0, 1, 2, 3] and "pyckpt.index" in durable
    pyckpt.load_checkpoint(str(tmp_path / "durable" / "ckpt-3")).verify()


def test_replaced_node_restores_the_newest_local_step_from_its_peer(tmp_path):
    base = str(tmp_path)
    _train(base, 4)
    shutil.rmtree(tmp_path / "node2")  # a replaced node: its disk is empty
    out = _restore(base)
    for r, (got, w, mine, counter) in enumerate(out):
        assert got == os.path.join(base, f"node{r}", "ckpt-4")  # local, not durable ckpt-3
        assert (w, mine, counter) == (4.0, 100 * r + 4.0, 4)
    # the replaced node holds the whole checkpoint again, its own part included
    assert _ranks(_files(base, 2, "ckpt-4")) == [0, 1, 2, 3]
    pyckpt.load_checkpoint(os.path.join(base, "node2", "ckpt-4")).verify()


def test_every_local_tier_gone_restores_from_the_durable_tier(tmp_path):
    base = str(tmp_path)
    _train(base, 4)
    for r in range(W):
        shutil.rmtree(tmp_path / f"node{r}")
    for r, (got, w, mine, counter) in enumerate(_restore(base)):
        assert got == os.path.join(base, "durable", "ckpt-3")
        assert (w, mine, counter) == (3.0, 100 * r + 3.0, 3)


def test_part_and_replica_both_gone_falls_back_to_durable(tmp_path):
    base = str(tmp_path)
    _train(base, 4)
    shutil.rmtree(tmp_path / "node1")  # rank 1's part ...
    for name in ("ckpt-3", "ckpt-4"):  # ... and its replica on node 2
        for n in os.listdir(tmp_path / "node2" / name):
            if n.startswith("data-") and node_local.writer_rank(n) == 1:
                os.remove(tmp_path / "node2" / name / n)
    for r, (got, w, mine, _) in enumerate(_restore(base)):
        assert got == os.path.join(base, "durable", "ckpt-3")
        assert (w, mine) == (3.0, 100 * r + 3.0)


def test_corrupt_local_copy_falls_back_to_durable_on_every_worker(tmp_path):
    base = str(tmp_path)
    _train(base, 3)  # ckpt-3 is local and durable
    _train(base, 1)  # ckpt-4 local only
    for r in range(W):  # flip a byte of rank 0's part everywhere it is held
        d = tmp_path / f"node{r}" / "ckpt-4"
        for n in os.listdir(d):
            if n.startswith("data-") and node_local.writer_rank(n) == 0:
                with open(d / n, "r+b") as f:
                    f.seek(10)
                    b = f.read(1)
                    f.seek(10)
                    f.write(bytes([b[0] ^ 0x40]))
    with pytest.warns(UserWarning, match="cannot restore ckpt-4 from the local tiers"):
        out = _restore(base)
    for r, (got, w, mine, _) in enumerate(out):
        assert got == os.path.join(base, "durable", "ckpt-3")
        assert (w, mine) == (3.0, 100 * r + 3.0)


def test_durable_newer_than_local_wins(tmp_path):
    base = str(tmp_path)
    _train(base, 6, persist_every=3)  # durable: 3, 6; local: 5, 6
    for r in range(W):
        shutil.rmtree(tmp_path / f"node{r}" / "ckpt-6")
    for r, (got, w, _, _) in enumerate(_restore(base)):
        assert got == os.path.join(base, "durable", "ckpt-6") and w == 6.0


def test_failed_replica_write_commits_nothing_anywhere(tmp_path, monkeypatch):
    base = str(tmp_path)
    _train(base, 1)
    _fail_replica_write(monkeypatch, "ckpt-2")

    def fn(comm):
        ck = _ck(comm.rank)
        with _manager(base, comm, ck) as m:
            m.restore_or_initialize()
            _set(ck, comm.rank, 2)
            with pytest.raises(CheckpointError, match="rank 3: OSError.*No space left"):
                m.save()
            return [os.path.basename(u) for u in m._tiers.local.checkpoints]
    assert _run(fn) == [["ckpt-1"]] * W
    for r in range(W):  # no index and no data of ckpt-2 on any node
        d = tmp_path / f"node{r}" / "ckpt-2"
        assert not d.exists() or not any(n.startswith(("data-", "pyckpt.index")) for n in os.listdir(d))


def test_failed_upload_is_reported_and_persisted_again(tmp_path, monkeypatch):
    base = str(tmp_path)
    from pyckpt.engine import copy as copies
    real = copies.copy_file
    calls = {"n": 0}

    def flaky(ck, f, store, dst, *args, **kwargs):
        calls["n"] += 1
        if "ckpt-3" in dst and "-00002-" in dst:  # rank 2's upload of the first persist
            raise OSError(5, "connection reset")
        return real(ck, f, store, dst, *args, **kwargs)

    monkeypatch.setattr(copies, "copy_file", flaky)

    def fn(comm):
        ck = _ck(comm.rank)
        with _manager(base, comm, ck, persist_every=3) as m:
            for step in range(1, 4):
                _set(ck, comm.rank, step)
                m.save()
            # the failure of ckpt-3's persist surfaces at the next call that settles it
            with pytest.raises(CheckpointError, match="rank 2: OSError.*connection reset"):
                m.wait_until_finished()
            _set(ck, comm.rank, 4)
            m.save()  # ckpt-4: due again, persisted
            m.wait_until_finished()
            return [os.path.basename(u) for u in m._tiers.durable.checkpoints]
    assert _run(fn) == [["ckpt-4"]] * W
    assert not (tmp_path / "durable" / "ckpt-3").exists()  # removed, never half-committed
    pyckpt.load_checkpoint(str(tmp_path / "durable" / "ckpt-4")).verify()


def test_replicate_is_checked():
    def fn(comm):
        with pytest.raises(ValueError, match="replicate must be between 0 and 3"):
            pyckpt.CheckpointManager(_ck(0), "memory://x", comm=comm, local_dir="/tmp/x",
                                     replicate=4)
    _run(fn)
    with pytest.raises(ValueError, match="replicate needs a multi-worker job"):
        pyckpt.CheckpointManager(_ck(0), "memory://x", local_dir="/tmp/x", replicate=1)
    with pytest.raises(ValueError, match="need a local_dir"):
        pyckpt.CheckpointManager(_ck(0), "memory://x", replicate=1)


@pytest.mark.parametrize("replicate", [0, 2])
def test_replica_count(tmp_path, replicate):
    base = str(tmp_path)
    _train(base, 1, replicate=replicate)
    for r in range(W):
        want = sorted({(r - d) % W for d in range(replicate + 1)})
        assert _ranks(_files(base, r, "ckpt-1")) == want
    out = _restore(base, replicate=replicate)  # without replicas the peers send the parts
    assert [o[1:3] for o in out] == [(1.0, 100 * r + 1.0) for r in range(W)]


def test_async_saves_return_before_the_replicas_and_commit(tmp_path, monkeypatch):
    """blocking=False: the values are copied before save returns; writing, the replica
    exchange and the commit records run in the background, on a communicator of
    their own, while the job's (here: the next collectives) goes on."""
    import threading

    base = str(tmp_path)
    released = {r: threading.Event() for r in range(W)}
    real = node_local._write_files

    def held(store, path, files):  # the replica write of ckpt-1 waits for the caller
        if "ckpt-1" in path:
            rank = int(path.split("node")[1][0])
            assert released[rank].wait(10), "the save did not return before its replicas"
        return real(store, path, files)

    monkeypatch.setattr(node_local, "_write_files", held)

    def fn(comm):
        ck = _ck(comm.rank)
        with _manager(base, comm, ck, persist_every=2) as m:
            _set(ck, comm.rank, 1)
            assert m.save(blocking=False).endswith("ckpt-1")
            # returned: nothing committed yet; the state may change at once
            assert not os.path.exists(os.path.join(base, f"node{comm.rank}", "ckpt-1",
                                                   "pyckpt.index"))
            _set(ck, comm.rank, -1)
            comm.barrier()  # a collective of the job while the background part waits
            released[comm.rank].set()
            _set(ck, comm.rank, 2)
            m.save(blocking=False)  # settles ckpt-1 first; ckpt-2 is due to persist
            _set(ck, comm.rank, -2)
            m.wait_until_finished()
            assert m._tiers.local.background.comm is not None
            return ([os.path.basename(u) for u in m._tiers.local.checkpoints],
                    [os.path.basename(u) for u in m._tiers.durable.checkpoints])
    assert _run(fn) == [(["ckpt-1", "ckpt-2"], ["ckpt-2"])] * W
    for r in range(W):
        assert _ranks(_files(base, r, "ckpt-1")) == sorted({r, (r - 1) % W})
    for r, (got, w, mine, counter) in enumerate(_restore(base)):
        assert got == os.path.join(base, f"node{r}", "ckpt-2")
        assert (w, mine, counter) == (2.0, 100 * r + 2.0, 2)  # the values at save time
    shutil.rmtree(tmp_path / "node1")
    for r, (got, w, mine, _) in enumerate(_restore(base)):  # node 1's part from node 2
        assert (got, w, mine) == (os.path.join(base, f"node{r}", "ckpt-2"), 2.0, 100 * r + 2.0)


def test_failed_async_save_is_raised_on_every_worker_and_commits_nothing(tmp_path,
                                                                         monkeypatch):
    base = str(tmp_path)
    _fail_replica_write(monkeypatch, "ckpt-1")

    def fn(comm):
        ck = _ck(comm.rank)
        with _manager(base, comm, ck) as m:
            _set(ck, comm.rank, 1)
            m.save(blocking=False)
            with pytest.raises(CheckpointError, match="rank 3: OSError.*No space left"):
                m.save(blocking=False)  # the next call raises it, on every worker
            assert m._tiers.local.background.comm is None  # made anew at the next async save
            _set(ck, comm.rank, 2)
            m.save(blocking=False)
            m.wait_until_finished()
            return [os.path.basename(u) for u in m._tiers.local.checkpoints]
    assert _run(fn) == [["ckpt-1"]] * W  # the number was given back: the retry is ckpt-1
    for r in range(W):
        assert _ranks(_files(base, r, "ckpt-1")) == sorted({r, (r - 1) % W})
    assert [o[1:3] for o in _restore(base)] == [(2.0, 100 * r + 2.0) for r in range(W)]


def test_a_replica_is_read_with_every_chunk_checked(tmp_path, monkeypatch):
    """A worker's own file that rots between its write and its replication fails the
    save on every worker (the replica is read like any checkpoint read), and nothing
    of that checkpoint is committed anywhere."""
    base = str(tmp_path)
    _train(base, 1)
    real = node_local.read_data_files

    def rotting(store, path, manifest, names):
        if path.endswith("ckpt-2") and "node1" in path:
            for n in names:
                with open(os.path.join(path, n), "r+b") as f:
                    f.seek(100)
                    b = f.read(1)
                    f.seek(100)
                    f.write(bytes([b[0] ^ 0x01]))
        return real(store, path, manifest, names)

    monkeypatch.setattr(node_local, "read_data_files", rotting)

    def fn(comm):
        ck = _ck(comm.rank)
        with _manager(base, comm, ck) as m:
            m.restore_or_initialize()
            _set(ck, comm.rank, 2)
            with pytest.raises(CheckpointError, match=r"rank 1: reading its files for replication: CorruptCheckpointError: checksum mismatch .*node1.*bytes \["):
                m.save()
            return [os.path.basename(u) for u in m._tiers.local.checkpoints]

    assert all(kept == ["ckpt-1"] for kept in _run(fn))
    for r in range(W):
        assert not os.path.exists(os.path.join(base, f"node{r}", "ckpt-2", "pyckpt.index"))
