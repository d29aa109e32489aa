"""Worker program for the real multi-process tests (torchrun and mpiexec).

    python workers.py {torch|mpi} SCENARIO PATH

Each worker writes its outcome to $PYCKPT_TEST_RESULTS/<rank> ("ok" or "raised ...");
the tests read them (stdout lines of several processes can interleave).
"""

import datetime
import os
import sys

import numpy as np

import pyckpt

G = np.arange(10 * 6 * 4, dtype=np.float32).reshape(10, 6, 4)
REPL = {"lr": np.float32(0.1), "table": np.arange(1000.0), "step": 7}


def comm_for(engine):
    if engine == "torch":
        import torch.distributed as dist

        dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=20))
        return None  # pyckpt picks up the initialized default group by itself
    return pyckpt.dist.MPIComm(timeout=20)


def rank_world(engine, comm):
    if engine == "torch":
        import torch.distributed as dist

        return dist.get_rank(), dist.get_world_size()
    return comm.rank, comm.world_size


def tree_for(rank):
    starts = [0, 4, 4, 7, 10]  # uneven rows; rank 1 holds a zero-size block
    a, b = starts[rank], starts[rank + 1]
    col = slice(0, 3) if rank % 2 == 0 else slice(3, 6)  # a tensor split on two axes
    r0 = rank // 2 * 5
    return {"rows": pyckpt.ShardedArray(G[a:b], G.shape, (a, 0, 0)),
            "grid": pyckpt.ShardedArray(G[r0:r0 + 5, col], G.shape, (r0, col.start, 0)),
            "replicated": REPL}


def main():
    engine, scenario, path = sys.argv[1:4]
    comm = comm_for(engine)
    rank, world = rank_world(engine, comm)
    result = "ok"
    try:
        if scenario == "save":
            assert world == 4
            assert pyckpt.save(tree_for(rank), path, comm=comm) == path
        elif scenario == "load_columns":
            assert world == 2
            c0, c1 = (0, 2) if rank == 0 else (2, 6)
            target = pyckpt.ShardedArray(np.zeros((10, c1 - c0, 4), np.float32), G.shape, (0, c0, 0))
            grid = pyckpt.ShardedArray(np.zeros((5, 6, 4), np.float32), G.shape, (5 * rank, 0, 0))
            into = {"rows": target, "grid": grid, "replicated": {"table": np.zeros(1000), "step": 0}}
            pyckpt.load(path, into=into, comm=comm)
            assert np.array_equal(target.local, G[:, c0:c1])
            assert np.array_equal(grid.local, G[5 * rank:5 * rank + 5])
            assert into["replicated"]["step"] == 7
        elif scenario in ("die_before", "die_during"):
            if scenario == "die_during" and rank == 2:
                from pyckpt.engine import writer

                def dying(*a, **k):
                    os._exit(3)  # killed in the middle of writing its part

                writer.write_data = dying
            elif rank == 2:
                os._exit(3)  # dies before the save
            pyckpt.save(tree_for(rank), path, comm=comm)
        elif scenario == "tiers_async":  # node-local tiers, async: a background communicator
            ck = pyckpt.Checkpoint(mine=pyckpt.PerWorker(np.zeros(1000)), step=pyckpt.Variable(0))
            mgr = pyckpt.CheckpointManager(ck, os.path.join(path, "durable"), comm=comm,
                                           local_dir=os.path.join(path, f"node{rank}"),
                                           persist_every=2, replicate=1)
            for step in range(1, 4):
                ck.step.assign(step)
                ck.mine.value[:] = 100 * rank + step
                mgr.save(blocking=False)
                ck.mine.value[:] = -1  # staged: changes after save returns are not saved
            mgr.close()
            assert mgr._tiers.local.background.comm is not None, "the saves ran blocking"
            ck.mine.value[:] = 0
            with pyckpt.CheckpointManager(ck, os.path.join(path, "durable"), comm=comm,
                                          local_dir=os.path.join(path, f"node{rank}"),
                                          replicate=1) as again:
                assert again.restore_or_initialize().endswith(f"node{rank}/ckpt-3")
            assert float(ck.mine.value[0]) == 100 * rank + 3 and int(ck.step) == 3
        elif scenario == "manager":
            ck = pyckpt.Checkpoint(table=pyckpt.Variable(np.zeros(1000)), step=pyckpt.Variable(0))
            mgr = pyckpt.CheckpointManager(ck, path, max_to_keep=2, comm=comm)
            for step in range(1, 5):
                ck.step.assign(step)
                ck.table.assign(np.full(1000, float(step)))
                mgr.save()
            assert [os.path.basename(p) for p in mgr.checkpoints] == ["ckpt-3", "ckpt-4"]
            mgr.close()
        else:
            raise ValueError(scenario)
    except BaseException as e:  # reported, not hidden: the test checks every line
        result = f"raised {type(e).__name__}: {str(e).splitlines()[0][:200]}"
    with open(os.path.join(os.environ["PYCKPT_TEST_RESULTS"], str(rank)), "w") as f:
        f.write(result)
    if engine == "torch":
        import torch.distributed as dist

        try:
            dist.destroy_process_group()
        except Exception:
            pass
        os._exit(0)
    comm.barrier()  # MPI: leave together; mpi4py finalizes at a normal exit


if __name__ == "__main__":
    main()
