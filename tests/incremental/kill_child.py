"""Child process of the kill -9 property test (test_crash_property.py): saves a run
with an incremental CheckpointManager and SIGKILLs itself right before its N-th
storage mutation (a data file write, an atomic index or state write, a delete, a
directory removal): every step of the save and retention protocol is a kill point.

    python kill_child.py SPEC_JSON

SPEC: {"dir", "max_to_keep", "full_every", "schedule": [[changed tensor, ...] per
step], "kill_at": N (0: never)}. Tensor i holds ``expected(schedule, step)[i]``.
"""

import json
import os
import signal
import sys

import numpy as np

import pyckpt
from pyckpt.engine import write_executor
from pyckpt.storage import local

N_TENSORS = 4
SHAPE = (96, 256)  # 96 KiB of float32 each: several chunks with a small chunk size


def expected(schedule, step):
    """The value of every tensor after ``step`` steps of ``schedule``."""
    counts = [0] * N_TENSORS
    for changed in schedule[:step]:
        for i in changed:
            counts[i] += 1
    return [np.full(SHAPE, 1000 * i + c, np.float32) for i, c in enumerate(counts)]


def model():
    return pyckpt.Checkpoint(step=pyckpt.Variable(np.int64(0)),
                             t=[pyckpt.Variable(np.zeros(SHAPE, np.float32))
                                for _ in range(N_TENSORS)])


def _arm(kill_at):
    """Counts storage mutations; SIGKILL right before the kill_at-th."""
    count = [0]

    def wrap(owner, name):
        real = getattr(owner, name)

        def hooked(*a, **k):
            count[0] += 1
            if count[0] == kill_at:
                os.kill(os.getpid(), signal.SIGKILL)
            return real(*a, **k)
        setattr(owner, name, hooked)

    for name in ("write_atomic", "delete", "rmtree"):
        wrap(local.LocalStore, name)
    wrap(write_executor, "write_shards")


def main(spec):
    if spec["kill_at"]:
        _arm(spec["kill_at"])
    ck = model()
    m = pyckpt.CheckpointManager(ck, spec["dir"], max_to_keep=spec["max_to_keep"],
                                 incremental=True, full_save_every=spec["full_every"])
    for step in range(1, len(spec["schedule"]) + 1):
        ck.step.assign(step)
        for v, want in zip(ck.t, expected(spec["schedule"], step)):
            v.assign(want)
        m.save(blocking=step % 2 == 0)
        m.wait_until_finished()
        print(f"saved {step}", flush=True)
    m.close()


if __name__ == "__main__":
    main(json.loads(sys.argv[1]))
