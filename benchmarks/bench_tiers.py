#!/usr/bin/env python3
"""Tiered managers (docs/API.md section 13) against saving straight to S3.

A training loop of ``--saves`` steps, each ``--step-seconds`` of simulated work
(sleep) then one ``CheckpointManager.save``, on a state of ``--mib`` MiB, against a
local SeaweedFS (S3) server started here:

- ``s3 blocking`` / ``s3 async``: a plain manager on ``s3://bucket/run``;
- ``tiered blocking`` / ``tiered async``: ``local_dir`` on this machine's temp
  disk, ``persist_every`` (default 5) to the same S3 run.

Per mode: the stall per save (time inside ``save()``, which includes waiting for
the previous async save: what the loop loses), the bytes written per save to
each tier, and, after the loop, the restore time from the local tier and from
the durable tier (a fresh manager with an empty ``local_dir``).
Usage: ``python benchmarks/bench_tiers.py [--mib 256] [--saves 10]``.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import tempfile
import time
import uuid

import numpy as np

import pyckpt
from pyckpt.testing import servers


def state(mib: int) -> pyckpt.Checkpoint:
    n = mib * (1 << 20) // 4 // 4
    return pyckpt.Checkpoint(step=pyckpt.Variable(np.int64(0)),
                             **{f"w{i}": pyckpt.Variable(np.random.default_rng(i).random(
                                 n, dtype=np.float32)) for i in range(4)})


def tree_bytes(path: str) -> int:
    return sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(path) for f in fs)


def run(mode: str, args: argparse.Namespace, options: dict) -> dict:
    url = f"s3://bench/{uuid.uuid4().hex[:10]}"
    local = tempfile.mkdtemp(prefix="pyckpt-bench-tiers-")
    ck = state(args.mib)
    tiered = mode.startswith("tiered")
    tier = pyckpt.LocalTierOptions(local, max_to_keep=2, persist_every=args.persist_every) \
        if tiered else None
    m = pyckpt.CheckpointManager(ck, url, max_to_keep=3, storage_options=options,
                                 options=pyckpt.CheckpointManagerOptions(local_tier=tier))
    stalls = []
    for step in range(1, args.saves + 1):
        time.sleep(args.step_seconds)
        ck.step.assign(step)
        t = time.perf_counter()
        m.save(blocking=mode.endswith("blocking"))
        stalls.append(time.perf_counter() - t)
    t = time.perf_counter()
    m.close()
    drain = time.perf_counter() - t
    out = {"mode": mode, "stall_median_s": statistics.median(stalls),
           "stall_max_s": max(stalls), "drain_at_close_s": drain}
    state_bytes = sum(v.numpy().nbytes for v in (ck.w0, ck.w1, ck.w2, ck.w3))
    if tiered:
        out["local_bytes_per_save"] = state_bytes
        out["durable_bytes_per_save"] = state_bytes / args.persist_every
        for tier, local_dir in (("local", local), ("durable", tempfile.mkdtemp())):
            ck2 = state(args.mib)
            m2 = pyckpt.CheckpointManager(
                ck2, url, storage_options=options, options=pyckpt.CheckpointManagerOptions(
                    local_tier=pyckpt.LocalTierOptions(local_dir)))
            t = time.perf_counter()
            where = m2.restore_or_initialize()
            out[f"restore_{tier}_s"] = time.perf_counter() - t
            assert where is not None and (tier == "local") == where.startswith(local), where
            m2.close()
            if tier == "durable":
                shutil.rmtree(local_dir, ignore_errors=True)
    else:
        out["durable_bytes_per_save"] = state_bytes
        ck2 = state(args.mib)
        m2 = pyckpt.CheckpointManager(ck2, url, storage_options=options)
        t = time.perf_counter()
        m2.restore_or_initialize()
        out["restore_durable_s"] = time.perf_counter() - t
        m2.close()
    shutil.rmtree(local, ignore_errors=True)
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--mib", type=int, default=256)
    p.add_argument("--saves", type=int, default=10)
    p.add_argument("--step-seconds", type=float, default=0.5)
    p.add_argument("--persist-every", type=int, default=5)
    p.add_argument("--modes", default="s3 blocking,s3 async,tiered blocking,tiered async")
    args = p.parse_args()
    with servers.seaweedfs() as options:
        servers.make_bucket("s3", options, "bench")
        print(f"state {args.mib} MiB, {args.saves} saves, {args.step_seconds} s per step, "
              f"persist_every={args.persist_every}; S3 = local SeaweedFS")
        for mode in args.modes.split(","):
            r = run(mode.strip(), args, options)
            print("  ".join(f"{k}={v:.3f}" if isinstance(v, float) else f"{k}={v}"
                            for k, v in r.items()), flush=True)


if __name__ == "__main__":
    main()
