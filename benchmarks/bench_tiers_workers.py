#!/usr/bin/env python3
"""Tiered managers of a 4-worker job (issue 16), against saving straight to S3.

torchrun starts 4 gloo workers per mode; together they hold ``--gib`` GiB of state
(each worker a quarter, as PerWorker values: the workers' parts differ). A
training loop of ``--saves`` steps (``--step-seconds`` of simulated work, then
``CheckpointManager.save``) runs against a SeaweedFS (S3) server started here,
on loopback. Modes:

- ``s3``: a plain multi-worker manager on ``s3://bench/run`` (every worker
  uploads its part, rank 0 commits);
- ``local``: node-local saves only (each worker's ``local_dir`` of its own,
  ``replicate=1``), never persisted: the local tier's own cost;
- ``tiered``: the same, plus every ``--persist-every``-th save persisted to S3 in
  the background;
- ``tiered-async``: ``tiered`` with ``save(blocking=False)``: the stall is the
  staging copy and the planning (plus any wait for the previous save), the
  writing, replica exchange and commit records run in background threads on a
  gloo group of their own.

Per mode, per worker: the stall per save (time inside ``save()``: what the loop
loses; median over the saves, then the median over workers), the bytes it writes
locally, sends to its peer and uploads per save. Then, for the tiered run's
directories, the time of ``restore_or_initialize`` (slowest worker) from the
local tier, from a peer replica (worker 2's directory wiped), and from the
durable tier (every local directory wiped).
Target: the stall per save with tiers is at most 1.1x the local-only one.

    python benchmarks/bench_tiers_workers.py [--gib 1] [--saves 9] [--rounds 3]
        [--modes s3,local,tiered,tiered-async] [--no-restore]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import uuid

import numpy as np

PARTS = 4  # arrays per worker


def worker(args: argparse.Namespace) -> None:
    import datetime

    import torch.distributed as dist

    import pyckpt

    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=600))
    rank, world = dist.get_rank(), dist.get_world_size()
    n = int(args.gib * (1 << 30)) // world // PARTS // 4
    rng = np.random.default_rng(rank)
    ck = pyckpt.Checkpoint(step=pyckpt.Variable(np.int64(0)),
                           parts=[pyckpt.PerWorker(rng.random(n, dtype=np.float32))
                                  for _ in range(PARTS)])
    options = json.loads(os.environ["BENCH_S3"])
    tiered = args.mode in ("local", "tiered", "tiered-async")
    tier = pyckpt.LocalTierOptions(os.path.join(args.base, f"node{rank}"), max_to_keep=2,
                                   replicate=1, persist_every=args.persist_every
                                   if args.mode != "local" else 10 ** 9) if tiered else None
    blocking = args.mode != "tiered-async"
    m = pyckpt.CheckpointManager(ck, args.url, max_to_keep=3, storage_options=options,
                                 options=pyckpt.CheckpointManagerOptions(local_tier=tier))
    out: dict = {"rank": rank}
    t = time.perf_counter()
    out["restored"] = m.restore_or_initialize()
    out["restore_s"] = time.perf_counter() - t
    stalls = []
    for _ in range(args.saves):
        time.sleep(args.step_seconds)
        ck.step.assign(int(ck.step.numpy()) + 1)
        t = time.perf_counter()
        m.save(blocking=blocking)
        stalls.append(time.perf_counter() - t)
    t = time.perf_counter()
    m.close()
    out["drain_s"] = time.perf_counter() - t
    out["stalls"] = stalls
    out["part_bytes"] = n * 4 * PARTS
    with open(os.path.join(os.environ["BENCH_OUT"], str(rank)), "w") as f:
        json.dump(out, f)
    dist.destroy_process_group()


def launch(mode: str, url: str, base: str, args: argparse.Namespace, options: dict,
           saves: int) -> list[dict]:
    out_dir = tempfile.mkdtemp(prefix="pyckpt-bench-out-")
    env = dict(os.environ, OMP_NUM_THREADS="1", BENCH_S3=json.dumps(options), BENCH_OUT=out_dir)
    cmd = [shutil.which("torchrun") or "torchrun", "--standalone", "--nproc-per-node=4",
           __file__, "--worker", "--mode", mode, "--url", url, "--base", base,
           "--gib", str(args.gib), "--saves", str(saves), "--step-seconds",
           str(args.step_seconds), "--persist-every", str(args.persist_every)]
    r = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=1800)
    try:
        res = [json.load(open(os.path.join(out_dir, str(k)))) for k in range(4)]
    except OSError:
        raise SystemExit(f"{mode}: workers failed:\n{r.stdout[-2000:]}\n{r.stderr[-4000:]}")
    finally:
        shutil.rmtree(out_dir, ignore_errors=True)
    return res


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--mode", default="tiered")
    p.add_argument("--url", default="")
    p.add_argument("--base", default="")
    p.add_argument("--gib", type=float, default=1.0)
    p.add_argument("--saves", type=int, default=9)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--step-seconds", type=float, default=2.0)
    p.add_argument("--persist-every", type=int, default=3)
    p.add_argument("--modes", default="s3,local,tiered,tiered-async")
    p.add_argument("--no-restore", action="store_true", help="skip the restore timings")
    args = p.parse_args()
    if args.worker:
        worker(args)
        return
    from pyckpt.testing import servers

    with servers.seaweedfs() as options:
        servers.make_bucket("s3", options, "bench")
        print(f"4 workers (torchrun, gloo), {args.gib} GiB of state in all, {args.saves} saves "
              f"per run, {args.step_seconds} s per step, persist_every={args.persist_every}, "
              f"{args.rounds} rounds; S3 = SeaweedFS on loopback; nproc={os.cpu_count()}")
        modes = args.modes.split(",")
        stall: dict[str, list[float]] = {m: [] for m in modes}
        restore: dict[str, list[float]] = {"local tier": [], "peer replica": [],
                                           "durable tier": [], "s3 (plain manager)": []}
        part = 0
        for rnd in range(args.rounds):
            for mode in modes[rnd % len(modes):] + modes[:rnd % len(modes)]:
                base = tempfile.mkdtemp(prefix="pyckpt-bench-nodes-")
                url = f"s3://bench/{uuid.uuid4().hex[:10]}"
                res = launch(mode, url, base, args, options, args.saves)
                per_worker = [statistics.median(r["stalls"]) for r in res]
                stall[mode].append(statistics.median(per_worker))
                part = res[0]["part_bytes"]
                print(f"  round {rnd + 1} {mode:12s} stall per save: median "
                      f"{stall[mode][-1]:.3f} s (workers {', '.join(f'{x:.3f}' for x in per_worker)})",
                      flush=True)
                if args.no_restore:
                    pass
                elif mode == "s3":
                    res = launch("s3", url, base, args, options, 0)
                    restore["s3 (plain manager)"].append(max(r["restore_s"] for r in res))
                if mode == "tiered":
                    for what, wipe in (("local tier", []), ("peer replica", [2]),
                                       ("durable tier", [0, 1, 2, 3])):
                        for k in wipe:
                            shutil.rmtree(os.path.join(base, f"node{k}"), ignore_errors=True)
                        res = launch("tiered", url, base, args, options, 0)
                        restore[what].append(max(r["restore_s"] for r in res))
                        want = "node" if what != "durable tier" else "s3://"
                        assert all(want in (r["restored"] or "") for r in res), res
                shutil.rmtree(base, ignore_errors=True)
        print("\n== STALL PER SAVE (median over rounds of the median worker)")
        for mode, xs in stall.items():
            print(f"  {mode:12s} {statistics.median(xs):7.3f} s   rounds: "
                  + ", ".join(f"{x:.3f}" for x in xs))

        def ratio(a: str, b: str, target: float | None = None) -> None:
            if a not in stall or b not in stall:
                return
            r = statistics.median(stall[a]) / statistics.median(stall[b])
            pairs = ", ".join(f"{x / y:.2f}" for x, y in zip(stall[a], stall[b]))
            verdict = "" if target is None else \
                f"  target <= {target:.2f}x  {'met' if r <= target else 'MISSED'}"
            print(f"  {a} / {b}: {r:.2f}x (per round {pairs}){verdict}")

        ratio("tiered", "local", 1.10)
        ratio("tiered-async", "local")
        ratio("tiered-async", "tiered")
        ratio("s3", "tiered")
        if args.no_restore:
            return
        print("\n== RESTORE (slowest worker's restore_or_initialize, median over rounds)")
        for what, xs in restore.items():
            print(f"  {what:19s} {statistics.median(xs):7.3f} s   rounds: "
                  + ", ".join(f"{x:.3f}" for x in xs))
        mib = part / 2 ** 20
        print("\n== BYTES PER WORKER PER SAVE")
        print(f"  written to the local tier: {2 * mib:.0f} MiB (its part {mib:.0f} + its peer's "
              f"replica {mib:.0f}); sent to its peer: {mib:.0f} MiB; uploaded: "
              f"{mib / args.persist_every:.0f} MiB on average ({mib:.0f} MiB once every "
              f"{args.persist_every} saves); plain s3 manager: {mib:.0f} MiB uploaded per save")


if __name__ == "__main__":
    sys.exit(main())
