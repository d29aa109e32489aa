"""Worker program of the incremental torchrun test (test_torchrun.py).

    torchrun --nproc-per-node=4 torchrun_workers.py DIRECTORY STEPS

Every worker initializes gloo and saves STEPS steps of a Checkpoint with a frozen
torch base (replicated), a trained head, a per-worker frozen table and a
per-worker trained row through CheckpointManager(..., incremental=True), odd
steps blocking, even ones in the background; then restores the newest into fresh
objects and reports what it saw to $PYCKPT_TEST_RESULTS/<rank>. DIRECTORY may
be an s3:// URL (options in $PYCKPT_TEST_S3, JSON).
"""

import datetime
import json
import os
import sys

import numpy as np

import pyckpt


def build(torch, rank):
    torch.manual_seed(0)
    base = torch.nn.Linear(256, 256)  # 257 KiB, frozen
    head = torch.nn.Linear(256, 4)
    for p in base.parameters():
        p.requires_grad_(False)
    return pyckpt.Checkpoint(base=base, head=head, step=pyckpt.Variable(np.int64(0)),
                             table=pyckpt.PerWorker(np.full(20_000, float(rank))),
                             mine=pyckpt.PerWorker(np.zeros(100)))


def main():
    directory, steps = sys.argv[1], int(sys.argv[2])
    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=60))
    rank = dist.get_rank()
    options = json.loads(os.environ.get("PYCKPT_TEST_S3", "null"))
    out = {}
    try:
        ck = build(torch, rank)
        m = pyckpt.CheckpointManager(ck, directory, max_to_keep=2, storage_options=options,
                                     incremental=True)
        for step in range(1, steps + 1):
            ck.step.assign(step)
            with torch.no_grad():
                ck.head.weight.fill_(float(step))
            ck.mine.value[:] = 1000 * rank + step
            m.save(blocking=step % 2 == 1)
            if step % 2 == 0:  # the copy is taken: these values never reach storage
                ck.mine.value[:] = -1.0
        m.close()
        out["kept"] = [u.rstrip("/").rsplit("/", 1)[-1] for u in m.checkpoints]
        fresh = build(torch, rank)
        with torch.no_grad():
            fresh.base.weight.zero_()
            fresh.head.weight.zero_()
        fresh.mine.value[:] = 0
        fresh.table.value[:] = 0
        with pyckpt.CheckpointManager(fresh, directory, storage_options=options,
                                      incremental=True) as m2:
            out["restored"] = m2.restore_or_initialize().rstrip("/").rsplit("/", 1)[-1]
        out["step"] = int(fresh.step.numpy())
        out["mine"] = float(fresh.mine.value[0])
        out["table"] = float(fresh.table.value[0])
        out["head"] = float(fresh.head.weight[0, 0])
        out["base_equal"] = bool(torch.equal(fresh.base.weight, build(torch, rank).base.weight))
    except BaseException as e:  # noqa: BLE001 - reported to the test
        import traceback
        out["error"] = f"{type(e).__name__}: {e}\n{traceback.format_exc()[-3000:]}"
    with open(os.path.join(os.environ["PYCKPT_TEST_RESULTS"], str(rank)), "w") as f:
        json.dump(out, f)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
