"""Issue 22, attack 1: a training job whose object store dies while a checkpoint
streams to it ends, with the error reported, within the documented failure bound
(``RemoteOptions.failure_bound()``, docs/PROTOCOL.md 1c). Before, a tiered
manager's persist left an fsspec ``S3File`` to a finalizer that waited forever at
interpreter exit.

Each case runs in a child process against a SeaweedFS of this module's own,
killed (SIGKILL) while the child's transfer is in flight, and started again after."""

import os
import subprocess
import sys
import textwrap
import time

import pytest

from pyckpt.storage.options import RemoteOptions
from pyckpt.testing import servers
from pyckpt.testing.requirements import require

LIMITS = {"stall_timeout": 3, "deadline": 8, "cleanup_timeout": 3, "max_concurrency": 2,
          "part_size": 8 << 20}
BOUND = RemoteOptions(**LIMITS).failure_bound()

CHILD = textwrap.dedent("""
    import json, sys, time
    import numpy as np
    import pyckpt
    mode, url, local, options = sys.argv[1], sys.argv[2], sys.argv[3], json.loads(sys.argv[4])
    state = {f"w{i}": np.full(8 << 20, i, np.float32) for i in range(8)}  # 256 MiB
    ck = pyckpt.Checkpoint(**state)
    extra = {"local_dir": local, "persist_every": 1} if mode == "tiered" else {}
    m = pyckpt.CheckpointManager(ck, url, storage_options=options, **extra)
    m.save(blocking=(mode == "tiered"))
    print("in flight", flush=True)
    sys.stdin.readline()  # the parent has killed the store
    t = time.monotonic()
    try:
        m.close()
        print("no error", flush=True)
    except pyckpt.CheckpointError as e:
        print(f"error after {time.monotonic() - t:.1f} s: {type(e).__name__}", flush=True)
""")


@pytest.fixture(scope="module")
def weed():
    require("s3fs", "a storage server or its client")
    with servers.seaweedfs_server() as server:
        servers.make_bucket("s3", server.options, "pyckpt")
        yield server


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["tiered", "async"])
def test_the_job_ends_when_its_store_dies_mid_transfer(weed, tmp_path, mode):
    options = {**weed.options, "pyckpt": LIMITS}
    url = f"s3://pyckpt/exit-{mode}-{os.getpid()}"
    child = subprocess.Popen(
        [sys.executable, "-c", CHILD, mode, url, str(tmp_path / "local"),
         __import__("json").dumps(options)],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env={**os.environ, "PYTHONPATH": os.getcwd()})
    try:
        assert child.stdout.readline().strip() == "in flight", child.stderr.read()
        time.sleep(0.5)  # the transfer is under way (256 MiB take seconds here)
        weed.kill()
        killed = time.monotonic()
        child.stdin.write("go\n")
        child.stdin.flush()
        try:
            out, err = child.communicate(timeout=BOUND + 60)
        except subprocess.TimeoutExpired:
            child.kill()
            out, err = child.communicate()
            pytest.fail(f"the child did not exit within {BOUND + 60:.0f} s of the store's "
                        f"death: {out}\n{err[-3000:]}")
        took = time.monotonic() - killed
    finally:
        if child.poll() is None:
            child.kill()
        weed.start()  # the same data and ports, for the next case
    assert child.returncode == 0, err[-3000:]
    assert out.strip().startswith("error after"), (out, err[-3000:])
    assert "CheckpointIOError" in out or "CheckpointError" in out
    assert took < BOUND + 15, f"exited {took:.0f} s after the store died (bound {BOUND:.0f} s)"
