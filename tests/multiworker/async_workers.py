"""Worker program of tests/multiworker/test_async_commit.py (torchrun, gloo):

    torchrun --nproc-per-node=4 async_workers.py SCENARIO DIRECTORY

``train``: a training loop whose every step runs the job's own collectives
(all_reduce of a large and a small tensor, an object broadcast) and checks their
results, with an async CheckpointManager save every 3 steps whose background part
is slowed down so that it overlaps those collectives; the state is changed right
after each save() returns. Then a new manager restores the latest checkpoint and
the values are compared. ``fail``: rank 2's background write of the second save
fails; every worker must raise at its next call, and the run goes on.

Each worker writes its outcome to $PYCKPT_TEST_RESULTS/<rank> ("ok ..." or
"raised ...").
"""

import datetime
import os
import sys
import time

import torch
import torch.distributed as dist

import pyckpt
from pyckpt.engine import writer

EVERY, STEPS = 3, 12


def state():
    torch.manual_seed(0)
    return pyckpt.Checkpoint(model=torch.nn.Linear(256, 256),
                             own=pyckpt.PerWorker(torch.zeros(1000)), step=pyckpt.Variable(0))


def set_values(ck, rank, step):
    with torch.no_grad():
        ck.model.weight.fill_(float(step))
        ck.model.bias.fill_(float(-step))
        ck.own.value.fill_(float(step * 10 + rank))
    ck.step.assign(step)


def job_collectives(rank, world, step):
    """The training job's own collectives on the default group, checked."""
    big = torch.full((1 << 20,), float(rank + step))
    dist.all_reduce(big)
    expect = float(sum(r + step for r in range(world)))
    assert bool((big == expect).all()), f"all_reduce gave {big[:3]}, not {expect}"
    small = torch.tensor([rank + 1.0])
    dist.all_reduce(small)
    assert small.item() == world * (world + 1) / 2, small
    box = [("step", step, rank)] if rank == 0 else [None]
    dist.broadcast_object_list(box, src=0)
    assert box[0] == ("step", step, 0), box


def slow_writes():
    """Each background write takes 0.3 s longer: it overlaps the next steps."""
    real = writer.write_data

    def slow(*a, **k):
        time.sleep(0.3)
        return real(*a, **k)

    writer.write_data = slow


def train(rank, world, directory):
    slow_writes()
    ck = state()
    mgr = pyckpt.CheckpointManager(ck, directory, max_to_keep=3)
    longest = 0.0
    for step in range(1, STEPS + 1):
        set_values(ck, rank, step)
        job_collectives(rank, world, step)
        if step % EVERY == 0:
            t = time.perf_counter()
            mgr.save(blocking=False)
            longest = max(longest, time.perf_counter() - t)
            set_values(ck, rank, -1000)  # changed at once: must not reach the checkpoint
        job_collectives(rank, world, -step)
    mgr.wait_until_finished()
    kept = ",".join(os.path.basename(p) for p in mgr.checkpoints)
    mgr.close()
    ck2 = state()
    set_values(ck2, rank, 0)
    mgr2 = pyckpt.CheckpointManager(ck2, directory)
    latest = mgr2.restore_or_initialize()
    assert os.path.basename(latest) == f"ckpt-{STEPS // EVERY}", latest
    assert bool((ck2.model.weight == STEPS).all()) and bool((ck2.model.bias == -STEPS).all())
    assert bool((ck2.own.value == STEPS * 10 + rank).all()), ck2.own.value[:3]
    assert int(ck2.step) == STEPS and int(ck2.save_counter) == STEPS // EVERY
    mgr2.close()
    return f"ok {kept} {longest:.3f}"


def fail(rank, world, directory):
    real = writer.write_data
    seen = []

    def write_data(store, path, *a, **k):
        if rank == 2 and path.endswith("ckpt-2") and not seen:
            seen.append(path)
            raise OSError(28, "No space left on device")
        return real(store, path, *a, **k)

    writer.write_data = write_data
    ck = state()
    mgr = pyckpt.CheckpointManager(ck, directory)
    set_values(ck, rank, 1)
    mgr.save(blocking=False)
    set_values(ck, rank, 2)
    mgr.save(blocking=False)  # fails in the background on rank 2
    job_collectives(rank, world, 2)
    set_values(ck, rank, 3)
    try:
        mgr.save(blocking=False)
        return "no error"
    except pyckpt.CheckpointError as e:
        error = str(e)
    assert "No space left on device" in error and "rank 2" in error, error
    job_collectives(rank, world, 3)  # the workers are still in step
    path = mgr.save(blocking=False)  # ckpt-2 again: the failed save gave its number back
    mgr.wait_until_finished()
    assert os.path.basename(path) == "ckpt-2", path
    kept = ",".join(os.path.basename(p) for p in mgr.checkpoints)
    mgr.close()
    return f"ok {kept}"


def main():
    scenario, directory = sys.argv[1:3]
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=60))
    rank, world = dist.get_rank(), dist.get_world_size()
    try:
        result = {"train": train, "fail": fail}[scenario](rank, world, directory)
    except BaseException as e:  # reported, not hidden: the test checks every line
        import traceback

        result = f"raised {type(e).__name__}: {e}\n{traceback.format_exc()[-3000:]}"
    with open(os.path.join(os.environ["PYCKPT_TEST_RESULTS"], str(rank)), "w") as f:
        f.write(result)
    try:
        dist.destroy_process_group()
    except Exception:
        pass
    os._exit(0)


if __name__ == "__main__":
    main()
