"""Tiered managers in a real multi-process job (issue 16): torchrun with 4 gloo
workers, each worker's local tier in a directory of its own (a node of its own),
replicate=1, every 3rd save persisted to SeaweedFS over S3 on loopback."""

import json
import os
import pathlib
import shutil
import subprocess
import tempfile
import uuid

import pytest

from pyckpt.testing import servers
from pyckpt.testing.requirements import REQUIRE_ALL, require

WORKER = pathlib.Path(__file__).with_name("tier_workers.py")


@pytest.fixture(scope="module")
def seaweed():
    require("s3fs", "a storage server or its client")
    require("torch")
    try:
        ctx = servers.seaweedfs_server()
        server = ctx.__enter__()
    except RuntimeError as e:
        if REQUIRE_ALL:  # CI: a server that cannot start is a failure, never a skip
            pytest.fail(f"PYCKPT_REQUIRE_ALL=1 but SeaweedFS did not start: {e}")
        pytest.skip(str(e))
    servers.make_bucket("s3", server.options, "pyckpt")
    yield server
    ctx.__exit__(None, None, None)


def _launch(base, durable, options, steps):
    exe = shutil.which("torchrun")
    if exe is None:
        if REQUIRE_ALL:
            pytest.fail("torchrun is missing in CI")
        pytest.skip("needs torchrun")
    out_dir = tempfile.mkdtemp(prefix="pyckpt-results-")
    env = dict(os.environ, OMP_NUM_THREADS="1", PYCKPT_THREADS="2", PYCKPT_TEST_RESULTS=out_dir,
               PYCKPT_TEST_S3=json.dumps(options))
    cmd = [exe, "--standalone", "--nproc-per-node=4", str(WORKER), base, durable, str(steps)]
    try:
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=240, env=env)
        results = {int(n): json.load(open(os.path.join(out_dir, n))) for n in os.listdir(out_dir)}
    finally:
        shutil.rmtree(out_dir, ignore_errors=True)
    assert sorted(results) == [0, 1, 2, 3], r.stdout[-2000:] + r.stderr[-4000:]
    for rank, res in results.items():
        assert "error" not in res, (rank, res, r.stderr[-4000:])
    return results


def test_torchrun_tiers_with_replicas_and_seaweedfs(tmp_path, seaweed):
    base = str(tmp_path)
    durable = f"s3://pyckpt/{uuid.uuid4().hex[:12]}"
    first = _launch(base, durable, seaweed.options, 4)
    for rank, res in first.items():
        assert res["restored"] is None and res["step"] == 0
        assert res["durable"] == ["ckpt-3"] and res["local"] == ["ckpt-3", "ckpt-4"]

    # a replaced node: worker 2's local directory is gone. The restart restores the
    # newest local step (4) from the replica on worker 3, not the durable step 3.
    shutil.rmtree(tmp_path / "node2")
    second = _launch(base, durable, seaweed.options, 3)
    for rank, res in second.items():
        assert res["restored"] == os.path.join(base, f"node{rank}", "ckpt-4"), res
        assert (res["step"], res["mine"], res["weight"]) == (4, 1000 * rank + 4.0, 4.0)
        # the cadence counts this manager's saves: the 3rd of them (ckpt-7) is persisted
        assert res["durable"] == ["ckpt-3", "ckpt-7"] and res["local"] == ["ckpt-6", "ckpt-7"]

    # every local directory gone: the restart restores from SeaweedFS
    for rank in range(4):
        shutil.rmtree(tmp_path / f"node{rank}")
    third = _launch(base, durable, seaweed.options, 0)
    for rank, res in third.items():
        assert res["restored"] == f"{durable}/ckpt-7", res
        assert (res["step"], res["mine"], res["weight"]) == (7, 1000 * rank + 7.0, 7.0)
