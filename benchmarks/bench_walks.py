#!/usr/bin/env python3
"""Per-value work of pyckpt's object-graph walks with torch state (issue 21), this tree
against an earlier revision, in one run with rounds interleaved.

What the in-memory copies of the object API cost beyond the copy itself shows best
on many small tensors: there the bytes take little time and each value's Python work
is most of it. Two states, on the CPU (a CUDA device copies the same way, with the
same Python work in front of it):

- ``dict``: ``Checkpoint(state=...)`` of 1,162 float32 tensors (bench_gpu.py's
  32-layer transformer with Adam m and v; ``--mib`` of them, 64 by default);
- ``module``: ``Checkpoint(model=..., opt=...)`` of a ``Sequential`` of ``--linears``
  ``Linear(64, 64)`` layers (290: 580 parameters) and its Adam optimizer (2,910 values).

Per state, the median of ``--reps`` calls of: ``torch._foreach_copy_`` of the same
tensors (the limit: an in-place copy without any walk), ``copy_state`` (between two
such checkpoints), ``snapshot()``, ``snapshot(into=)``, ``restore(snapshot)``,
``write`` to a tmpfs (/dev/shm) and ``restore`` from it. Each round runs every tree in
a fresh interpreter (the order alternating); the table gives the median over rounds,
its ratio to the limit, and the earlier revision's time over this tree's.

Usage: python benchmarks/bench_walks.py [--before REV] [--rounds 3] [--reps 9]
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

from harness import against, child_json

HERE = Path(__file__).resolve().parent

MEASURE = """
import json, os, shutil, statistics, sys, tempfile, time
sys.path.insert(0, sys.argv[1])
import torch
import pyckpt
from bench_gpu import build_state
from harness import copy_rows, median_best

mib, linears, reps = int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
torch.set_num_threads(1)


def med(fn):
    return median_best(fn, reps)[0]


def module_state(seed):
    torch.manual_seed(seed)
    model = torch.nn.Sequential(*[torch.nn.Linear(64, 64) for _ in range(linears)])
    opt = torch.optim.Adam(model.parameters())
    model(torch.zeros(1, 64)).sum().backward()
    opt.step()
    return pyckpt.Checkpoint(model=model, opt=opt)


def tensors(ckpt):
    if hasattr(ckpt, "model"):
        st = ckpt.opt.state_dict()["state"]
        return list(ckpt.model.parameters()) + [v for s in st.values() for v in s.values()]
    return list(ckpt.state.values())


scratch = tempfile.mkdtemp(dir="/dev/shm" if os.path.isdir("/dev/shm") else None)
out = {}
pairs = {
    "dict": (pyckpt.Checkpoint(state=build_state(mib << 20, 32, torch.device("cpu"), 0)),
             pyckpt.Checkpoint(state=build_state(mib << 20, 32, torch.device("cpu"), 1))),
    "module": (module_state(0), module_state(1)),
}
for name, (src, dst) in pairs.items():
    rows, snap = copy_rows(med, src, dst, tensors(src), tensors(dst))
    row = out[name] = {"values": len(snap), **rows}
    n = [0]

    def write():
        n[0] += 1
        src.write(f"{scratch}/{name}-{n[0]}")

    row["write"] = med(write)
    path = src.write(f"{scratch}/{name}-r")
    row["restore(path)"] = med(lambda: dst.restore(path))
shutil.rmtree(scratch)
print(json.dumps(out))
"""


def measure(tree: Path | None, args: argparse.Namespace) -> dict:
    return child_json(MEASURE, [str(HERE), str(args.mib), str(args.linears), str(args.reps)],
                      tree)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--before", default=None, help="the earlier revision to compare with")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--reps", type=int, default=9, help="calls per contender and round")
    ap.add_argument("--mib", type=int, default=64, help="MiB of the dict state")
    ap.add_argument("--linears", type=int, default=290, help="Linear layers of the module state")
    a = ap.parse_args()
    runs = against(a.before, a.rounds, lambda tree: measure(tree, a), "pyckpt-bench-walks-")
    this = runs["this tree"]
    for state in this[0]:
        print(f"\n{state}: {this[0][state]['values']} values, median of {a.rounds} rounds "
              f"x {a.reps} calls")
        head = f"  {'operation':20s} {'this tree':>10s} {'vs limit':>9s}"
        if a.before:
            head += f" {a.before:>10s} {'speed-up':>9s}"
        print(head)
        limit = statistics.median(x[state]["foreach"] for x in this)
        for op in [k for k in this[0][state] if k != "values"]:
            own = statistics.median(x[state][op] for x in this)
            line = f"  {op:20s} {own * 1e3:8.2f}ms {own / limit:8.2f}x"
            if a.before:
                old = statistics.median(x[state][op] for x in runs[a.before])
                line += f" {old * 1e3:8.2f}ms {old / own:8.2f}x"
            print(line)
    print("\n(vs limit: time over torch._foreach_copy_ of the same tensors; speed-up: the "
          "earlier revision's time over this tree's)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
