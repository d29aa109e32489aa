"""Child process of test_crash.py: trains forever, saving every step through a
CheckpointManager (alternating blocking and async saves), and prints
"saved <step>" once a checkpoint of that step is known to be committed."""

import sys

import numpy as np

import pyckpt


def main(directory: str) -> None:
    ck = pyckpt.Checkpoint(
        step=pyckpt.Variable(np.int64(0)),
        a=pyckpt.Variable(np.zeros(400_000)),
        b=pyckpt.Variable(np.zeros((200, 300), np.float32)),
        opt=pyckpt.Checkpoint(m=[pyckpt.Variable(np.zeros(2000)) for _ in range(20)]),
    )
    variables = [ck.a, ck.b] + list(ck.opt.m)
    manager = pyckpt.CheckpointManager(ck, directory, max_to_keep=3)
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
            manager.wait_until_finished()
        print(f"saved {step}", flush=True)


if __name__ == "__main__":
    main(sys.argv[1])
