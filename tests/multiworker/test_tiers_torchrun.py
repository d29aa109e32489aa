"""Tiered managers in a real multi-process job (issue 16): torchrun with 4 gloo
workers, each worker's local tier in a directory of its own (a node of its own),
replicate=1, every 3rd save persisted to SeaweedFS over S3 on loopback."""

import json
import os
import pathlib
import shutil
import uuid

import pytest

from pyckpt.testing.launch import run_workers

WORKER = pathlib.Path(__file__).with_name("tier_workers.py")


def run_job(base, durable, options, steps, kill=None, blocking=True):
    env = {"PYCKPT_TEST_S3": json.dumps(options), "PYCKPT_TEST_ASYNC": "0" if blocking else "1"}
    if kill is not None:
        env["PYCKPT_TEST_KILL_RANK"], env["PYCKPT_TEST_KILL_AFTER"] = str(kill[0]), str(kill[1])
    texts, r = run_workers(WORKER, [base, durable, steps], timeout=240, env=env)
    if kill is not None:  # the others were stopped by torchrun, anywhere
        assert r.returncode != 0, "the killed job should fail"
        return None
    results = {rank: json.loads(t) for rank, t in texts.items()}
    assert sorted(results) == [0, 1, 2, 3], r.stdout[-2000:] + r.stderr[-4000:]
    for rank, res in results.items():
        assert "error" not in res, (rank, res, r.stderr[-4000:])
    return results


@pytest.mark.parametrize("blocking", [True, False], ids=["blocking", "async"])
def test_torchrun_tiers_with_replicas_and_seaweedfs(tmp_path, seaweed_server, blocking):
    """blocking=False: the replica exchange and the commit records run in background
    threads, on a gloo group of their own (Communicator.background)."""
    seaweed = seaweed_server
    base = str(tmp_path)
    durable = f"s3://pyckpt/{uuid.uuid4().hex[:12]}"
    first = run_job(base, durable, seaweed.options, 4, blocking=blocking)
    for rank, res in first.items():
        assert res["background"] is not blocking  # async: a background gloo group was made
        assert res["restored"] is None and res["step"] == 0
        assert res["durable"] == ["ckpt-3"] and res["local"] == ["ckpt-3", "ckpt-4"]

    # a replaced node: worker 2's local directory is gone. The restart restores the
    # newest local step (4) from the replica on worker 3, not the durable step 3.
    shutil.rmtree(tmp_path / "node2")
    second = run_job(base, durable, seaweed.options, 3, blocking=blocking)
    for rank, res in second.items():
        assert res["restored"] == os.path.join(base, f"node{rank}", "ckpt-4"), res
        assert (res["step"], res["mine"], res["weight"]) == (4, 1000 * rank + 4.0, 4.0)
        # the cadence counts this manager's saves: the 3rd of them (ckpt-7) is persisted
        assert res["durable"] == ["ckpt-3", "ckpt-7"] and res["local"] == ["ckpt-6", "ckpt-7"]

    # every local directory gone: the restart restores from SeaweedFS
    for rank in range(4):
        shutil.rmtree(tmp_path / f"node{rank}")
    third = run_job(base, durable, seaweed.options, 0, blocking=blocking)
    for rank, res in third.items():
        assert res["restored"] == f"{durable}/ckpt-7", res
        assert (res["step"], res["mine"], res["weight"]) == (7, 1000 * rank + 7.0, 7.0)


def test_torchrun_tiers_survive_kill_9(tmp_path, seaweed_server):
    """A worker is killed (SIGKILL) at a different moment of a tiered job in each
    round (torchrun then stops the others); every restart restores one committed
    step, the same on every worker, with every worker's own values of that step.
    The first round saves blocking, the second with blocking=False."""
    import random

    seaweed = seaweed_server
    base = str(tmp_path)
    durable = f"s3://pyckpt/{uuid.uuid4().hex[:12]}"
    rng = random.Random(16)
    last = 0
    for round_ in range(2):
        run_job(base, durable, seaweed.options, 400, kill=(rng.randrange(4), rng.uniform(3, 9)),
                blocking=round_ == 0)
        after = run_job(base, durable, seaweed.options, 1)
        steps = {res["step"] for res in after.values()}
        assert len(steps) == 1, after
        step = steps.pop()
        assert step >= last  # never older than a step a previous restart restored
        for rank, res in after.items():
            if step:
                assert (res["mine"], res["weight"]) == (1000 * rank + step, float(step)), res
        last = step + 1  # the clean run saved one more
