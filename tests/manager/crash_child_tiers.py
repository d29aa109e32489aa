"""Child process of test_tiers.py's kill -9 test: trains forever with a tiered
CheckpointManager (local directory + durable directory, a persist every 2nd save,
alternating blocking and async saves) and prints "saved <step>" once the local
checkpoint of that step is committed."""

import sys

import numpy as np

import pyckpt


def main(local: str, durable: str) -> None:
    ck = pyckpt.Checkpoint(
        step=pyckpt.Variable(np.int64(0)),
        a=pyckpt.Variable(np.zeros(400_000)),
        b=pyckpt.Variable(np.zeros((200, 300), np.float32)),
    )
    variables = [ck.a, ck.b]
    manager = pyckpt.CheckpointManager(ck, durable, max_to_keep=3, local_dir=local,
                                       local_max_to_keep=2, persist_every=2)
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
            for v in variables:  # these values must not reach the checkpoint
                v.assign(np.full(v.shape, step + 0.5, dtype=v.dtype))
            manager._tiers.local.wait_until_finished()  # the local commit, not the persist
        print(f"saved {step}", flush=True)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
