#!/usr/bin/env python3
"""Host memory over many async saves of GPU state, with and without a pinned budget
(issue 21, item 3), with and without a snapshot in device memory (issue 40 item 2).

For each mode (``full``: pinned staging of the whole state, kept between saves;
``budget``: ``max_pinned_bytes``, a ring of pinned memory reused while the writers
go; ``device`` and ``device-budget``: the same, the call copying the state into
device memory first, ``max_device_snapshot_bytes=None``, the others passing 0) it
starts from released staging memory (so the 1st save is a first save: its blocked
time is issue 40 item 1's figure) and runs ``--saves`` consecutive ``pyckpt.save(state, path, blocking=False)``
calls on a GPT-like CUDA state, with a "training step" (every tensor changed in
place on the device) between the call and the wait, and after each save records
VmRSS, RssAnon, pyckpt's pinned memory, the time the caller was blocked (call to
return), the time to durable (call to ``wait()``) and the save's route and device
bytes (``PendingSave.staging``). It reports the growth of RSS from the 2nd save to
the last (the target: none beyond noise), the peak, and the median times against
one blocking save of the same mode (run after the async saves).

    python benchmarks/bench_pinned_budget.py --size-gb 4 --budget-mb 512 --saves 20

``--fake`` runs the same loop without a GPU on host arrays wrapped as device
values of pyckpt.testing.late_copies' engine (to check the script itself).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time

import numpy as np

from harness import import_pyckpt, optional_import

pyckpt = import_pyckpt()
MiB, GiB = 1 << 20, 1 << 30


def status() -> dict[str, int]:
    out = {}
    with open("/proc/self/status") as f:
        for line in f:
            k, _, v = line.partition(":")
            if k in ("VmRSS", "RssAnon", "VmHWM"):
                out[k] = int(v.split()[0]) * 1024
    return out


def cuda_state(size_gb: float, layers: int):
    torch = optional_import("torch")
    from bench_gpu import build_state  # the same state as bench_gpu.py

    state = build_state(int(size_gb * GiB), layers, torch.device("cuda", 0), seed=0)

    def step() -> None:
        with torch.no_grad():
            for t in state.values():
                t.add_(1.0)
        torch.cuda.current_stream().synchronize()

    return state, step, torch.cuda.synchronize


def fake_state(size_gb: float, layers: int):
    from pyckpt.registry import register_adapter
    from pyckpt.testing.late_copies import LateCopyEngine

    class Dev:
        def __init__(self, a):
            self.a = a

    eng = LateCopyEngine(delay=0.0, device_free=64 * GiB)
    register_adapter("bench-fake", leaf=lambda o: eng.array(o.a) if isinstance(o, Dev) else None)
    n = max(1, int(size_gb * GiB) // (layers * 4 * 4))  # float32 values per tensor
    state = {f"l{i}.w{j}": Dev(np.ones(n, np.float32)) for i in range(layers)
             for j in range(4)}
    state["step"] = Dev(np.zeros((), np.float32))

    def step() -> None:
        for d in state.values():
            d.a += 1.0

    return state, step, eng.synchronize


MODES = ("budget", "full", "device", "device-budget")


def run_mode(mode: str, state, step, sync, args, workdir: str) -> dict:
    budget = args.budget_mb * MiB if mode.endswith("budget") else None
    device = None if mode.startswith("device") else 0  # None: automatic, from free memory
    pyckpt.device.release_staging_memory()  # the 1st save below is a first save
    rows = []
    for i in range(args.saves):
        path = os.path.join(workdir, f"{mode}-{i % 2}")
        sync()
        t0 = time.perf_counter()
        pending = pyckpt.save(state, path, blocking=False, max_pinned_bytes=budget,
                              max_device_snapshot_bytes=device)
        t1 = time.perf_counter()
        step()  # the training goes on while the save writes
        pending.wait()
        t2 = time.perf_counter()
        st = status()
        rows.append({"save": i + 1, "blocked_s": t1 - t0, "durable_s": t2 - t0,
                     "route": pending.staging.route,
                     "device_bytes": pending.staging.device_bytes,
                     "rss": st["VmRSS"], "anon": st["RssAnon"],
                     "pinned": pyckpt.device.pinned_memory_kept()})
        other = os.path.join(workdir, f"{mode}-{(i + 1) % 2}")
        shutil.rmtree(other, ignore_errors=True)
    # one blocking save of the same mode: the reference of call-to-durable
    t0 = time.perf_counter()
    pyckpt.save(state, os.path.join(workdir, f"{mode}-blocking"), max_pinned_bytes=budget)
    blocking_s = time.perf_counter() - t0
    shutil.rmtree(os.path.join(workdir, f"{mode}-blocking"))
    pyckpt.device.release_staging_memory()
    later = rows[1:]
    return {"mode": mode, "routes": sorted({r["route"] for r in rows}),
            "first_route": rows[0]["route"], "device_bytes": rows[-1]["device_bytes"],
            "max_pinned_bytes": budget, "blocking_durable_s": blocking_s,
            "blocked_first_s": rows[0]["blocked_s"], "durable_first_s": rows[0]["durable_s"],
            "blocked_median_s": statistics.median(r["blocked_s"] for r in later),
            "durable_median_s": statistics.median(r["durable_s"] for r in later),
            "rss_growth_bytes": rows[-1]["rss"] - rows[1]["rss"],
            "anon_growth_bytes": rows[-1]["anon"] - rows[1]["anon"],
            "rss_peak_bytes": max(r["rss"] for r in rows),
            "pinned_bytes": rows[-1]["pinned"], "rows": rows}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--size-gb", type=float, default=4.0)
    p.add_argument("--layers", type=int, default=32)
    p.add_argument("--budget-mb", type=int, default=512)
    p.add_argument("--saves", type=int, default=20)
    p.add_argument("--modes", default=",".join(MODES))
    p.add_argument("--dir", default=None, help="where the checkpoints go (default: /tmp)")
    p.add_argument("--json", default=None)
    p.add_argument("--fake", action="store_true", help="no GPU: the late-copies test engine")
    args = p.parse_args()
    if pyckpt is None:
        print("pyckpt is not importable", file=sys.stderr)
        return 1
    torch = optional_import("torch")
    if not args.fake and (torch is None or not torch.cuda.is_available()):
        print("no CUDA device: run with --fake to check the script", file=sys.stderr)
        return 1
    state, step, sync = (fake_state if args.fake else cuda_state)(args.size_gb, args.layers)
    workdir = tempfile.mkdtemp(prefix="pyckpt-bench-budget-", dir=args.dir or "/tmp")
    base = status()
    print(f"state {args.size_gb:g} GiB, {len(state)} tensors; baseline VmRSS "
          f"{base['VmRSS'] / MiB:.0f} MiB, RssAnon {base['RssAnon'] / MiB:.0f} MiB")
    results = []
    try:
        for mode in args.modes.split(","):
            r = run_mode(mode, state, step, sync, args, workdir)
            results.append(r)
            print(f"{mode:13s} routes {'/'.join(r['routes'])} (1st {r['first_route']}), device "
                  f"{r['device_bytes'] / MiB:.1f} MiB, pinned {r['pinned_bytes'] / MiB:8.1f} MiB | "
                  f"blocked: 1st "
                  f"{r['blocked_first_s']:.3f} s, later median {r['blocked_median_s']:.3f} s | "
                  f"durable: 1st {r['durable_first_s']:.3f} s, later median "
                  f"{r['durable_median_s']:.3f} s (blocking save {r['blocking_durable_s']:.3f} s,"
                  f" ratio {r['durable_median_s'] / r['blocking_durable_s']:.2f}) | RSS growth "
                  f"save 2..{args.saves}: {r['rss_growth_bytes'] / MiB:+.1f} MiB (anon "
                  f"{r['anon_growth_bytes'] / MiB:+.1f}), peak {r['rss_peak_bytes'] / MiB:.0f} MiB")
            print("        RSS after each save (MiB): " + " ".join(
                f"{row['rss'] / MiB:.0f}" for row in r["rows"]))
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"args": vars(args), "baseline": base, "results": results}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
