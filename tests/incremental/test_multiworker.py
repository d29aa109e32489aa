"""Incremental saves of multi-worker runs, 4 workers played by threads (the
torchrun run with FSDP2-sharded parameters and SeaweedFS is test_torchrun.py):
replicated values and per-worker rows are referenced when unchanged, written
when not."""

import numpy as np
import pytest

import pyckpt
from pyckpt.engine.reader import open_checkpoint
from pyckpt.testing.thread_comm import ThreadGroup

W = 4
G = np.random.default_rng(5).standard_normal((64, 128)).astype(np.float32)  # frozen


def _ck(rank):
    return pyckpt.Checkpoint(
        frozen=pyckpt.Variable(G.copy()),                  # replicated, frozen
        frozen_rows=pyckpt.PerWorker(G[rank].copy()),      # per worker, frozen
        head=pyckpt.Variable(np.zeros(300)),               # replicated, trained
        mine=pyckpt.PerWorker(np.zeros(50)),               # per worker, trained
        table=pyckpt.Variable(np.arange(20_000.0)),        # replicated, frozen
        step=pyckpt.Variable(np.int64(0)))


def _train(ck, rank, step):
    ck.step.assign(step)
    ck.head.assign(np.full(300, float(step)))
    ck.mine.value[...] = 100 * rank + step


def _expect(step):
    return {"head": np.full(300, float(step)), "table": np.arange(20_000.0),
            "mine": np.stack([np.full(50, 100.0 * r + step) for r in range(W)])}


@pytest.mark.parametrize("blocking", [True, False], ids=["blocking", "async"])
def test_four_workers_reference_unchanged_blocks(tmp_path, blocking):
    run = tmp_path / "run"

    def worker(comm):
        ck = _ck(comm.rank)
        m = pyckpt.CheckpointManager(ck, run, max_to_keep=2, comm=comm, incremental=True)
        for step in range(1, 5):
            _train(ck, comm.rank, step)
            m.save(blocking=blocking)
            if not blocking:
                ck.head.assign(np.full(300, -1.0))  # after the copy: never saved
        m.close()
        return m.checkpoints

    out = ThreadGroup(W, timeout=60).run(worker)
    for o in out:
        if isinstance(o, BaseException):
            raise o
    kept = out[0]
    assert [p.rsplit("/", 1)[-1] for p in kept] == ["ckpt-3", "ckpt-4"]
    for p in kept:
        step = int(p.rsplit("-", 1)[-1])
        man = open_checkpoint(p).manifest
        own, referenced = man.own_and_referenced_bytes()
        assert man.version == 2 and referenced >= G.nbytes * 1.06 + 20_000 * 8, (own, referenced)
        assert own < 8_000, own  # head, the rows of mine, the step
        r = pyckpt.load_checkpoint(p)
        r.verify()

        def get(name):
            return r.get_tensor(next(k for k in r.keys() if k.split("/")[0] == name))

        assert np.array_equal(get("frozen"), G) and np.array_equal(get("frozen_rows"), G[:W])
        for k, want in _expect(step).items():
            assert np.array_equal(get(k), want), (p, k)
