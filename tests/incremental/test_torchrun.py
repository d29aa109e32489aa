"""Incremental saves of a real 4-process job (torchrun, gloo), on local disk and on
SeaweedFS over S3: each save after the first writes the trained head and the
per-worker rows only; every worker restores the newest checkpoint whole."""

import json
import pathlib
import uuid

import pytest

from pyckpt.engine.reader import open_checkpoint
from pyckpt.testing.launch import run_workers

WORKER = pathlib.Path(__file__).with_name("torchrun_workers.py")
STEPS = 4


def _job(directory, options=None):
    env = {"PYCKPT_TEST_S3": json.dumps(options)}
    texts, r = run_workers(WORKER, [directory, STEPS], timeout=240, env=env)
    results = {rank: json.loads(t) for rank, t in texts.items()}
    assert sorted(results) == [0, 1, 2, 3], r.stdout[-2000:] + r.stderr[-4000:]
    for rank, res in results.items():
        assert "error" not in res, (rank, res["error"])
        assert res["kept"] == ["ckpt-3", "ckpt-4"] and res["restored"] == "ckpt-4"
        assert (res["step"], res["mine"], res["table"], res["head"]) == \
            (STEPS, 1000.0 * rank + STEPS, float(rank), float(STEPS))
        assert res["base_equal"]
    return results


@pytest.mark.slow
@pytest.mark.parametrize("where", ["local", "seaweedfs"])
def test_torchrun_4_workers_incremental(tmp_path, where, request):
    options = None
    if where == "local":
        directory = str(tmp_path / "run")
    else:
        options = request.getfixturevalue("seaweed_server").options
        directory = f"s3://pyckpt/{uuid.uuid4().hex[:12]}"
    _job(directory, options)
    for name in ("ckpt-3", "ckpt-4"):
        man = open_checkpoint(f"{directory}/{name}", options).manifest
        own, referenced = man.own_and_referenced_bytes()
        # the frozen base (257 KiB) and the tables (4 x 160 KB) are referenced in ckpt-1
        assert referenced > 800_000 and own < 12_000, (name, own, referenced)
        assert {f.at for f in man.files if f.at} == {"ckpt-1"}
        assert man.info["world_size"] == 4
