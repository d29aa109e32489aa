"""Worker program of tests/multiworker/test_per_worker.py (torchrun, gloo).

    torchrun --nproc-per-node=4 per_worker_workers.py DIRECTORY

Each worker saves per-worker state (a numpy Generator's state as words, torch's
RNG state, a data position) declared with pyckpt.PerWorker beside replicated
values, through pyckpt.save and a CheckpointManager, restores it into fresh
objects and checks that its RNGs continue where they were; then it saves
per-worker state without declaring it, which must fail. It writes its outcome,
step by step, to $PYCKPT_TEST_RESULTS/<rank> as JSON.
"""

import datetime
import json
import os
import sys

import numpy as np

import pyckpt
from pyckpt import PerWorker

WEIGHTS = np.arange(1 << 17, dtype=np.float64)  # 1 MiB, replicated
MASK = (1 << 64) - 1


def pcg_words(gen):
    """A numpy Generator's (PCG64) state as 4 uint64 words."""
    s = gen.bit_generator.state["state"]
    return np.array([s["state"] >> 64, s["state"] & MASK, s["inc"] >> 64, s["inc"] & MASK],
                    dtype=np.uint64)


def set_pcg_words(gen, words):
    w = [int(x) for x in words]
    st = gen.bit_generator.state
    st["state"] = {"state": (w[0] << 64) | w[1], "inc": (w[2] << 64) | w[3]}
    st["has_uint32"], st["uinteger"] = 0, 0
    gen.bit_generator.state = st


def generator(rank):
    """Worker ``rank``'s numpy Generator, advanced by a rank-dependent amount."""
    gen = np.random.Generator(np.random.PCG64(1000 + rank))
    gen.random(rank + 1)
    return gen


def flat_save_and_restore(rank, directory):
    import torch

    gen = generator(rank)
    torch.manual_seed(2000 + rank)
    position = 17 * rank + 5
    state = {"rng": {"numpy": PerWorker(pcg_words(gen)), "torch": PerWorker(torch.get_rng_state())},
             "data": {"position": PerWorker(position), "epoch": 3},
             "weights": WEIGHTS, "step": 42}
    path = os.path.join(directory, "flat")
    assert pyckpt.save(state, path) == path
    expect_np, expect_torch = gen.random(4), torch.rand(4)
    torch.manual_seed(0)  # lose the state, then restore it
    into = {"rng": {"numpy": PerWorker(np.zeros(4, np.uint64)),
                    "torch": PerWorker(torch.zeros(5056, dtype=torch.uint8))},
            "data": {"position": PerWorker(0), "epoch": 0},
            "weights": np.zeros_like(WEIGHTS), "step": 0}
    pyckpt.load(path, into=into)  # the rank comes from the torch.distributed group
    fresh = np.random.Generator(np.random.PCG64(0))
    set_pcg_words(fresh, into["rng"]["numpy"].value)
    assert np.array_equal(fresh.random(4), expect_np), "numpy RNG not restored"
    torch.set_rng_state(into["rng"]["torch"].value)
    assert torch.equal(torch.rand(4), expect_torch), "torch RNG not restored"
    assert into["data"]["position"].value == position, into["data"]["position"]
    assert into["data"]["epoch"] == 3 and into["step"] == 42
    assert np.array_equal(into["weights"], WEIGHTS)


def manager_save_and_restore(rank, directory):
    gen = generator(rank)
    position = 17 * rank + 5
    ck = pyckpt.Checkpoint(rng=PerWorker(pcg_words(gen)),
                           position=PerWorker(pyckpt.Variable(position)),
                           weights=pyckpt.Variable(WEIGHTS))
    mgr = pyckpt.CheckpointManager(ck, os.path.join(directory, "run"), max_to_keep=2)
    mgr.save()
    expect = gen.random(4)
    ck2 = pyckpt.Checkpoint(rng=PerWorker(np.zeros(4, np.uint64)),
                            position=PerWorker(pyckpt.Variable(0)),
                            weights=pyckpt.Variable(np.zeros_like(WEIGHTS)))
    ck2.restore(mgr.latest_checkpoint).assert_consumed()
    fresh = np.random.Generator(np.random.PCG64(0))
    set_pcg_words(fresh, ck2.rng.value)
    assert np.array_equal(fresh.random(4), expect), "numpy RNG not restored"
    assert int(ck2.position.value) == position
    mgr.close()


def undeclared_flat(rank, directory):
    gen = generator(rank)
    pyckpt.save({"rng": pcg_words(gen), "weights": WEIGHTS, "step": 42},
                os.path.join(directory, "undeclared"))


def undeclared_manager(rank, directory):
    ck = pyckpt.Checkpoint(position=pyckpt.Variable(17 * rank + 5), weights=pyckpt.Variable(WEIGHTS))
    mgr = pyckpt.CheckpointManager(ck, os.path.join(directory, "run-undeclared"))
    try:
        mgr.save()
    finally:
        mgr.close()


STEPS = [flat_save_and_restore, manager_save_and_restore, undeclared_flat, undeclared_manager]


def main():
    import torch.distributed as dist

    directory = sys.argv[1]
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=20))
    rank = dist.get_rank()
    out = {}
    for step in STEPS:
        try:
            step(rank, directory)
            out[step.__name__] = "ok"
        except BaseException as e:  # reported, not hidden: the test checks every step
            out[step.__name__] = f"raised {type(e).__name__}: {e}"
    with open(os.path.join(os.environ["PYCKPT_TEST_RESULTS"], str(rank)), "w") as f:
        json.dump(out, f)
    try:
        dist.destroy_process_group()
    except Exception:
        pass
    os._exit(0)


if __name__ == "__main__":
    main()
