"""Fixtures of the real multi-process tests.

``torchrun``: launches a worker program with torchrun (gloo); each worker writes
its outcome to $PYCKPT_TEST_RESULTS/<rank>, and the call returns those texts by
rank and the finished process (for its output)."""

import os
import shutil
import subprocess
import tempfile

import pytest


def _torchrun(script, args, n=4, timeout=240, env=None):
    from pyckpt.testing.requirements import REQUIRE_ALL, require

    require("torch")
    exe = shutil.which("torchrun")
    if exe is None:
        if REQUIRE_ALL:
            pytest.fail("the torch launcher is missing in CI")
        pytest.skip("needs torchrun")
    out_dir = tempfile.mkdtemp(prefix="pyckpt-results-")
    cmd = [exe, "--standalone", f"--nproc-per-node={n}", str(script), *map(str, args)]
    full_env = dict(os.environ, OMP_NUM_THREADS="1", PYCKPT_THREADS="2",
                    PYCKPT_TEST_RESULTS=out_dir, **(env or {}))
    try:
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=full_env)
        results = {int(k): open(os.path.join(out_dir, k)).read() for k in os.listdir(out_dir)}
    finally:
        shutil.rmtree(out_dir, ignore_errors=True)
    return results, r


@pytest.fixture
def torchrun():
    return _torchrun
