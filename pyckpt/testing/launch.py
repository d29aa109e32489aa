"""Launching worker programs as real multi-process jobs, for tests and benchmarks:
torchrun (gloo) or mpiexec (MPICH).

Each worker writes its outcome to the file ``$PYCKPT_TEST_RESULTS/<rank>``
(stdout lines of several processes can interleave); ``run_workers`` returns
those texts by rank, and the finished launcher process (for its output)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from typing import Any, Sequence

from .requirements import REQUIRE_ALL, require


def launcher(engine: str) -> str:
    """The launcher's path; skips the calling test without one (fails it in CI)."""
    import pytest

    require("torch" if engine == "torch" else "mpi4py")
    exe = shutil.which("torchrun" if engine == "torch" else "mpiexec")
    if exe is None:
        if REQUIRE_ALL:
            pytest.fail(f"the {engine} launcher is missing in CI")
        pytest.skip(f"needs the {engine} launcher")
    return exe


def run_workers(script: Any, args: Sequence[Any], n: int = 4, engine: str = "torch",
                timeout: float = 240, env: dict | None = None,
                monitor_interval: float | None = None
                ) -> tuple[dict[int, str], subprocess.CompletedProcess]:
    """Runs ``script args...`` as ``n`` workers; returns ({rank: text}, process).

    ``monitor_interval`` (torchrun only): how often torchrun polls its workers.
    Once one worker has exited with an error, torchrun terminates the others at
    its next poll (every 0.1 s by default); tests in which a worker dies on
    purpose pass a few seconds so that the survivors can report their own
    outcome first."""
    exe = launcher(engine)
    out_dir = tempfile.mkdtemp(prefix="pyckpt-results-")
    if engine == "torch":
        cmd = [exe, "--standalone", f"--nproc-per-node={n}"]
        if monitor_interval is not None:
            cmd.append(f"--monitor-interval={monitor_interval}")
        cmd.append(str(script))
    else:
        cmd = [exe, "-n", str(n), sys.executable, str(script)]
    cmd += [str(a) for a in args]
    full_env = dict(os.environ, OMP_NUM_THREADS="1", PYCKPT_THREADS="2",
                    PYCKPT_TEST_RESULTS=out_dir, **(env or {}))
    try:
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=full_env)
        results = {int(k): open(os.path.join(out_dir, k)).read() for k in os.listdir(out_dir)}
    finally:
        shutil.rmtree(out_dir, ignore_errors=True)
    return results, r
