"""Child process of the kill -9 tests (test_crash.py, test_tiers.py): trains
forever, saving every step through a CheckpointManager (alternating blocking and
async saves), and prints "saved <step>" once a checkpoint of that step is known to
be committed (pyckpt.testing.crash).

    python crash_child.py DIRECTORY            a plain manager
    python crash_child.py LOCAL DURABLE        a tiered manager: local_max_to_keep=2,
                                               a persist every 2nd save
"""

import sys

import numpy as np

import pyckpt


def main(directory: str, durable: str | None = None) -> None:
    ck = pyckpt.Checkpoint(
        step=pyckpt.Variable(np.int64(0)),
        a=pyckpt.Variable(np.zeros(400_000)),
        b=pyckpt.Variable(np.zeros((200, 300), np.float32)),
        opt=pyckpt.Checkpoint(m=[pyckpt.Variable(np.zeros(2000)) for _ in range(20)]),
    )
    variables = [ck.a, ck.b] + list(ck.opt.m)
    if durable is None:
        manager = pyckpt.CheckpointManager(ck, directory, max_to_keep=3)
        local = manager
    else:
        manager = pyckpt.CheckpointManager(ck, durable, max_to_keep=3, local_dir=directory,
                                           local_max_to_keep=2, persist_every=2)
        local = manager._tiers.local  # wait for the local commit, not the persist
    manager.restore_or_initialize()
    step = int(ck.step)
    print(f"start {step}", flush=True)
    while True:
        step += 1
        ck.step.assign(step)
        for v in variables:
            v.assign(np.full(v.shape, step, dtype=v.dtype))
        if step % 2:
            manager.save()
        else:
            manager.save(blocking=False)
            for v in variables:  # keep training: these values must not reach the checkpoint
                v.assign(np.full(v.shape, step + 0.5, dtype=v.dtype))
            local.wait_until_finished()
        print(f"saved {step}", flush=True)


if __name__ == "__main__":
    main(*sys.argv[1:3])
