#!/usr/bin/env python3
"""Open times of large and hostile index / ``.metadata`` files (issue 37, item 2).

The inputs are fuzz/hostile_open.py's cases: legitimate layouts of many blocks
(1,024 column blocks x 20 tensors, 200,000 blocks of one tensor, as pyckpt indexes
and as DCP ``.metadata``) and hostile files that once took time quadratic in their
size (a 300 KB index, 1 MB ``.metadata`` files, a 128 KB pickle with a wide tuple
key, ...). Each case is opened ``--runs`` times in a child process (``--timeout``
seconds at most); the table gives the median and what opening gave (opened or
refused). ``--rev REV`` also measures the code of a git revision (a worktree with
this install's compiled core), for before/after figures.

    python benchmarks/bench_open_scale.py [--runs 5] [--scale 1] [--only 'dcp|300 KB']
                                         [--rev REV [--rev-runs 3]] [--tree DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "fuzz"))
sys.path.insert(0, str(HERE))

import harness  # noqa: E402

CHILD = harness.TREE_PRELUDE + """
import json, sys, time
from pyckpt.errors import CorruptCheckpointError
kind, path, runs = sys.argv[1], sys.argv[2], int(sys.argv[3])
data = open(path, "rb").read()
if kind == "index":
    from pyckpt.format import decode_index as _open
else:
    from pyckpt.codecs.distcp.metadata import decode_metadata as _open
times, outcome = [], "opened"
for _ in range(runs):
    t = time.perf_counter()
    try:
        _open(data, path)
    except CorruptCheckpointError as e:
        outcome = "refused: " + str(e).replace(path, "FILE")
    times.append(time.perf_counter() - t)
print(json.dumps({"times": times, "outcome": outcome}))
"""


def measure(kind: str, path: str, runs: int, timeout: float, tree: str | None) -> dict:
    env = dict(os.environ)
    env.pop("PYCKPT_BENCH_TREE", None)
    if tree:
        env["PYCKPT_BENCH_TREE"] = tree
    try:
        out = subprocess.run([sys.executable, "-c", CHILD, kind, path, str(runs)], env=env,
                             capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return {"median": None, "outcome": f"not done after {timeout:.0f} s"}
    if out.returncode:
        return {"median": None, "outcome": "failed: " + out.stderr.strip().splitlines()[-1]}
    res = json.loads(out.stdout.strip().splitlines()[-1])
    res["median"] = statistics.median(res["times"])
    return res


def main() -> int:
    import hostile_open as cases
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=5, help="opens per case (median reported)")
    ap.add_argument("--scale", type=float, default=1.0, help="size factor of every case")
    ap.add_argument("--only", default="", help="cases whose name matches this regular "
                    "expression")
    ap.add_argument("--timeout", type=float, default=600, help="seconds per case and code")
    ap.add_argument("--rev", help="also measure this git revision's Python code")
    ap.add_argument("--rev-runs", type=int, default=3, help="opens per case of --rev")
    ap.add_argument("--tree", help="measure the pyckpt package in this directory (a checkout "
                    "with the compiled core beside its sources) instead of the installed one")
    ap.add_argument("--json", help="write the figures here")
    args = ap.parse_args()
    torch = cases.have_torch()
    tree = None
    report = []
    with tempfile.TemporaryDirectory() as tmp:
        if args.rev:
            tree = str(harness.tree_at(args.rev, Path(tmp) / "rev"))
        try:
            print(f"{'case':44s} {'KB':>7s} {'this code':>10s}"
                  + (f" {args.rev[:10]:>10s}" if args.rev else "") + "  outcome")
            for name, _legit, build, kind, needs_torch in cases.CASES:
                if not re.search(args.only, name) or (needs_torch and not torch):
                    continue
                path = os.path.join(tmp, "input")
                data = build(args.scale)
                with open(path, "wb") as f:
                    f.write(data)
                now = measure(kind, path, args.runs, args.timeout, args.tree)
                row = {"case": name, "bytes": len(data), "now": now}
                line = f"{name:44s} {len(data) / 1e3:7.0f} {_secs(now):>10s}"
                if tree:
                    row["rev"] = before = measure(kind, path, args.rev_runs, args.timeout, tree)
                    line += f" {_secs(before):>10s}"
                print(line + "  " + now["outcome"][:70], flush=True)
                report.append(row)
        finally:
            if tree:
                harness.remove_tree(Path(tree))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=1)
    return 0


def _secs(res: dict) -> str:
    return "-" if res["median"] is None else f"{res['median']:.3f} s"


if __name__ == "__main__":
    sys.exit(main())
