"""Issue 22, attack 1: a training job whose object store dies while a checkpoint
streams to it ends, with the error reported, within the documented failure bound
(``RemoteOptions.failure_bound()``, docs/PROTOCOL.md 1c): a tiered manager's
persist (one worker, and two with node-local tiers) and a plain manager's async
save. Before, a tiered
manager's persist left an fsspec ``S3File`` to a finalizer that waited forever at
interpreter exit.

Each case runs in a child process against a SeaweedFS of this module's own,
killed (SIGKILL) while the child's transfer is in flight, and started again after."""

import json
import os
import subprocess
import sys
import textwrap
import time

import pytest

from pyckpt.storage.options import RemoteOptions

LIMITS = {"stall_timeout": 3, "deadline": 8, "cleanup_timeout": 3, "max_concurrency": 2,
          "part_size": 8 << 20}
BOUND = RemoteOptions(**LIMITS).failure_bound()

CHILD = textwrap.dedent("""
    import json, sys, threading, time
    import numpy as np
    import pyckpt
    from pyckpt.testing.thread_comm import ThreadGroup
    mode, url, local, options = sys.argv[1], sys.argv[2], sys.argv[3], json.loads(sys.argv[4])

    def run(comm=None):
        n = 8 if comm is None else 4  # 256 MiB in all
        if comm is None:
            ck = pyckpt.Checkpoint(**{f"w{i}": np.full(8 << 20, i, np.float32) for i in range(n)})
        else:  # each worker's own 128 MiB
            ck = pyckpt.Checkpoint(**{f"w{i}": pyckpt.PerWorker(np.full(8 << 20, i, np.float32))
                                      for i in range(n)})
        extra = {"local_dir": f"{local}/{getattr(comm, 'rank', 0)}", "persist_every": 1}
        if mode == "nodes":
            extra.update(comm=comm, replicate=1)
        m = pyckpt.CheckpointManager(ck, url, storage_options=options,
                                     **(extra if mode != "async" else {}))
        m.save(blocking=(mode != "async"))
        if comm is None or comm.rank == 0:
            print("in flight", flush=True)
            sys.stdin.readline()  # the parent has killed the store
        if comm is not None:
            comm.barrier()
        t = time.monotonic()
        try:
            m.close()
            return "no error"
        except pyckpt.CheckpointError as e:
            return f"error after {time.monotonic() - t:.1f} s: {type(e).__name__}"

    if mode == "nodes":  # two workers (threads of this process), node-local tiers
        print(" | ".join(map(str, ThreadGroup(2, timeout=300).run(run))), flush=True)
    else:
        print(run(), flush=True)
""")


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["tiered", "async", "nodes"])
def test_the_job_ends_when_its_store_dies_mid_transfer(seaweed_server, tmp_path, mode):
    weed = seaweed_server
    options = {**weed.options, "pyckpt": LIMITS}
    url = f"s3://pyckpt/exit-{mode}-{os.getpid()}"
    child = subprocess.Popen(
        [sys.executable, "-c", CHILD, mode, url, str(tmp_path / "local"),
         json.dumps(options)],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env=dict(os.environ), cwd=tmp_path)
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
    results = out.strip().split(" | ")
    assert len(results) == (2 if mode == "nodes" else 1), (out, err[-3000:])
    for r in results:  # every worker reports the failure
        assert r.startswith("error after") and "Checkpoint" in r, (out, err[-3000:])
    assert took < BOUND + 15, f"exited {took:.0f} s after the store died (bound {BOUND:.0f} s)"
