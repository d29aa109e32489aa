"""Worker program of the multi-worker tiered-manager tests (test_tiers_torchrun.py).

    torchrun --nproc-per-node=4 tier_workers.py BASE DURABLE_URL STEPS

Every worker initializes gloo, builds a Checkpoint (a model shared by all workers
and a PerWorker value of its own), a tiered manager with its local tier in
BASE/node<rank>, replicate=1 and persist_every=3, restores, trains STEPS steps
(saving each), closes, and writes a JSON line of what it restored and what it
saw to $PYCKPT_TEST_RESULTS/<rank>. S3 options come in $PYCKPT_TEST_S3 (JSON).
With $PYCKPT_TEST_ASYNC=1 it saves with blocking=False and overwrites its values
right after each save returns (the checkpoint must hold the values at save time).
"""

import datetime
import json
import os
import sys

import numpy as np

import pyckpt


def main():
    base, durable, steps = sys.argv[1], sys.argv[2], int(sys.argv[3])
    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=60))
    rank = dist.get_rank()
    options = json.loads(os.environ.get("PYCKPT_TEST_S3", "null"))
    torch.manual_seed(0)
    model = torch.nn.Linear(64, 32)
    ck = pyckpt.Checkpoint(model=model, step=pyckpt.Variable(np.int64(0)),
                           mine=pyckpt.PerWorker(np.zeros(1000, np.float64)))
    out = {}
    kill_after = float(os.environ.get("PYCKPT_TEST_KILL_AFTER", "0"))
    blocking = os.environ.get("PYCKPT_TEST_ASYNC") != "1"
    if kill_after and rank == int(os.environ.get("PYCKPT_TEST_KILL_RANK", "1")):
        import signal
        import threading

        # a kill -9 at a moment of the test's choosing: mid-save, mid-replication,
        # mid-upload or between saves; torchrun then stops the other workers
        threading.Timer(kill_after, os.kill, (os.getpid(), signal.SIGKILL)).start()
    try:
        m = pyckpt.CheckpointManager(ck, durable, storage_options=options, max_to_keep=5,
                                     local_dir=os.path.join(base, f"node{rank}"),
                                     local_max_to_keep=2, persist_every=3, replicate=1)
        restored = m.restore_or_initialize()
        out["restored"] = restored
        out["step"] = int(ck.step.numpy())
        out["mine"] = float(ck.mine.value[0])
        out["weight"] = float(model.weight.detach()[0, 0])
        for _ in range(steps):
            step = int(ck.step.numpy()) + 1
            ck.step.assign(step)
            with torch.no_grad():
                model.weight.fill_(float(step))
            ck.mine.value[:] = 1000 * rank + step
            m.save(blocking=blocking)
            if not blocking:  # staged: the values may change while it is written
                with torch.no_grad():
                    model.weight.fill_(-1.0)
                ck.mine.value[:] = -1.0
                ck.step.assign(step)
        m.close()
        out["background"] = m._tiers.local.background.comm is not None  # async saves ran
        out["durable"] = [u.rstrip("/").rsplit("/", 1)[-1] for u in m._tiers.durable.checkpoints]
        out["local"] = [u.rstrip("/").rsplit("/", 1)[-1] for u in m._tiers.local.checkpoints]
    except BaseException as e:  # noqa: BLE001 - reported to the test
        out["error"] = f"{type(e).__name__}: {e}"
    with open(os.path.join(os.environ["PYCKPT_TEST_RESULTS"], str(rank)), "w") as f:
        json.dump(out, f)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
