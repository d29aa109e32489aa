#!/usr/bin/env python3
"""Before/after figures of bench_local.py, bench_s3.py, bench_dcp.py and bench_dist.py in
one run: each benchmark runs alternately under an earlier revision's Python code
(``--before``, default 804d82e: main before issue 39's work) and under this checkout's
(the working tree as installed, uncommitted changes included), ``--rounds`` times each
(before, after, before, after, ...), every run a fresh process with the same arguments.

The earlier revision runs from a git worktree with this install's compiled core
(``harness.tree_at``; the C++ core must be the same at both revisions), through
``harness.tree_env``: every Python process of its runs, the torchrun and mpiexec workers
included, imports pyckpt from that worktree or exits at start-up. Both sides run this
checkout's benchmark scripts, so that only pyckpt's code differs.

Each run writes its figures with ``--json``; this script reads them (each benchmark's
figures: a median in seconds over the benchmark's own rounds) and prints, per benchmark,
the median over the runs of each side, after / before (> 1: this tree is slower) and the
median of the per-round pairs (after / before within one round). Rows of ``peer`` kind
(raw limits, torch.save, safetensors, DCP's own writers...) do not run pyckpt's code:
their ratio shows the run's noise and should be ~1.0.

    python benchmarks/bench_revs.py [local s3 dcp dist] [--rounds 3] [--preset small|full]
        [--before 804d82e] [--args-BENCH "..."] [--dir DIR] [--json PATH]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shlex
import shutil
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from harness import make_workdir, median_of, remove_tree, tree_at, tree_env, write_json

HERE = Path(__file__).resolve().parent
REPO = HERE.parent

#: name -> (seconds, pyckpt?): the figures of one run, read from its --json document
Figures = dict[str, tuple[float, bool]]


def _summary_figures(doc: dict) -> Figures:
    """bench_local / bench_s3: ``summary[phase]["contenders"][name]["median_s"]``; a
    contender is pyckpt's when its name says so."""
    return {f"{phase}: {name}": (s["median_s"], "pyckpt" in name)
            for phase, block in doc.get("summary", {}).items()
            for name, s in block["contenders"].items()}


def _dcp_figures(doc: list) -> Figures:
    """bench_dcp: per storage, worker count, contender and operation, the median of its
    rounds (``pyckpt`` is pyckpt's StorageWriter / StorageReader)."""
    out: Figures = {}
    for row in doc:
        for op in ("save", "load"):
            rounds = row.get(f"{op}_rounds_s")
            out[f"{row['storage']} {row['workers']}w {op}: {row['contender']}"] = (
                statistics.median(rounds) if rounds else row[f"{op}_s"],
                row["contender"] == "pyckpt")
    return out


def _dist_figures(doc: dict) -> Figures:
    """bench_dist: the slowest worker's save per configuration, the raw write limits (peer),
    plan_global per simulated size and local_plan."""
    out: Figures = {}
    save = doc.get("save", {})
    for s in save.get("summary", {}).values():
        out[f"save {s['workers']}w threads={s['threads']}"] = (s["median_s"], True)
    for kind in dict.fromkeys(r["kind"] for r in save.get("raw_rounds", [])):
        out[f"raw {kind}"] = (median_of([r["seconds"] for r in save["raw_rounds"]
                                         if r["kind"] == kind]), False)
    planner = doc.get("planner", {})
    for name, r in planner.get("plan_global", {}).items():
        out[f"plan_global {name}"] = (r["median_s"], True)
    if "local_plan" in planner:
        out["local_plan"] = (planner["local_plan"]["median_s"], True)
    return out


@dataclass
class Bench:
    script: str
    figures: Callable[[dict], Figures]
    #: the options of each preset ("small": all four in ~10 min on 2 cores with 3 rounds)
    presets: dict[str, list[str]]
    takes_dir: bool = True


BENCHES = {
    "local": Bench("bench_local.py", _summary_figures, {
        "small": ["--size-gb", "0.0625", "--rounds", "2", "--no-cold"],
        "full": ["--size-gb", "0.25", "--rounds", "3"]}),
    "s3": Bench("bench_s3.py", _summary_figures, {
        "small": ["--size-gb", "0.03125", "--rounds", "2", "--sweep-rounds", "0",
                  "--raw-sweep-rounds", "1", "--no-diagnose", "--no-dcp"],
        "full": ["--size-gb", "0.125", "--rounds", "3", "--sweep-rounds", "0",
                 "--raw-sweep-rounds", "1", "--no-diagnose"]}, takes_dir=False),
    "dcp": Bench("bench_dcp.py", _dcp_figures, {
        "small": ["--size-gb", "0.0625", "--s3-size-gb", "0.03125", "--rounds", "2",
                  "--workers", "1", "2"],
        "full": ["--size-gb", "0.25", "--s3-size-gb", "0.125", "--rounds", "3",
                 "--workers", "1", "2"]}),
    "dist": Bench("bench_dist.py", _dist_figures, {
        "small": ["--size-gb", "0.0625", "--workers", "1,2", "--launches", "1", "--rounds", "2"],
        "full": ["--size-gb", "0.25", "--workers", "1,2", "--launches", "2", "--rounds", "3"]}),
}


def _git(*args: str) -> str:
    return subprocess.run(["git", "-C", str(REPO), *args], check=True, capture_output=True,
                          text=True).stdout.strip()


def pyckpt_origin(env: dict) -> str:
    """The file pyckpt is imported from by a process started with ``env``."""
    r = subprocess.run([sys.executable, "-c", "import pyckpt; print(pyckpt.__file__)"], env=env,
                       capture_output=True, text=True, cwd=str(HERE))
    if r.returncode:
        raise SystemExit(f"pyckpt does not import: {r.stderr[-2000:]}")
    return os.path.abspath(r.stdout.strip().splitlines()[-1])


def sides(tree: Path) -> dict[str, dict]:
    """The environment of each side, after checking where each imports pyckpt from."""
    after_env = {k: v for k, v in os.environ.items() if k != "PYCKPT_BENCH_TREE"}
    envs = {"before": tree_env(tree, after_env), "after": after_env}
    want = {"before": tree / "pyckpt", "after": REPO / "pyckpt"}
    for side, env in envs.items():
        origin = pyckpt_origin(env)
        if not origin.startswith(str(want[side]) + os.sep):
            raise SystemExit(f"{side}: pyckpt is imported from {origin}, not from {want[side]}")
        print(f"{side:<6}: pyckpt from {origin}")
    return envs


def run_once(bench: Bench, argv: list[str], env: dict, out: Path, log: Path,
             timeout: float) -> tuple[Figures | None, float, str | None]:
    """One run of ``bench`` (its figures, wall seconds, error or None); output to ``log``."""
    out.unlink(missing_ok=True)
    t0 = time.perf_counter()
    with open(log, "w") as f:
        try:
            r = subprocess.run([sys.executable, str(HERE / bench.script), *argv, "--json", str(out)],
                               env=env, stdout=f, stderr=subprocess.STDOUT, timeout=timeout,
                               cwd=str(out.parent))
            rc: int | str = r.returncode
        except subprocess.TimeoutExpired:
            rc = f"timeout after {timeout:.0f} s"
    wall = time.perf_counter() - t0
    if rc != 0 or not out.exists():
        tail = log.read_text()[-1500:]
        return None, wall, f"exit {rc}; {log}:\n{tail}"
    figures = bench.figures(json.loads(out.read_text()))
    out.unlink()
    return figures, wall, None


def compare_runs(runs: dict[str, list[Figures]]) -> dict[str, dict]:
    """Per figure: kind, before / after (medians over runs), ratio, per-round pair ratios."""
    names = dict.fromkeys(n for side in ("before", "after") for figs in runs[side] for n in figs)
    rows = {}
    for name in names:
        vals = {side: [figs[name][0] if name in figs else None for figs in runs[side]]
                for side in ("before", "after")}
        pyckpt = any(figs[name][1] for side in runs.values() for figs in side if name in figs)
        b, a = median_of(vals["before"]), median_of(vals["after"])
        pairs = [y / x for x, y in zip(vals["before"], vals["after"])
                 if x is not None and y is not None and x > 0]
        rows[name] = {"kind": "pyckpt" if pyckpt else "peer", "before_s": b, "after_s": a,
                      "ratio": a / b if a is not None and b else None, "pair_ratios": pairs,
                      "pair_ratio_median": statistics.median(pairs) if pairs else None,
                      "before_rounds_s": vals["before"], "after_rounds_s": vals["after"]}
    return rows


def _fmt(x: float | None, spec: str) -> str:
    return "-" if x is None else format(x, spec)


def geomean(xs: list[float]) -> float | None:
    return math.exp(statistics.fmean(math.log(x) for x in xs)) if xs else None


def print_rows(title: str, rows: dict[str, dict]) -> dict:
    """The table of one benchmark, and the geometric means of the ratios per kind."""
    width = max([38] + [len(n) for n in rows])
    print(f"\n{title}")
    hdr = (f"  {'figure':<{width}} {'kind':<6} {'before s':>9} {'after s':>9} {'after/before':>12} "
           f"{'pairs':>6}  per-round pairs")
    print(hdr)
    print("  " + "-" * (len(hdr) - 2))
    for kind in ("pyckpt", "peer"):
        for name, r in rows.items():
            if r["kind"] == kind:
                print(f"  {name:<{width}} {kind:<6} {_fmt(r['before_s'], '9.4f')} "
                      f"{_fmt(r['after_s'], '9.4f')} {_fmt(r['ratio'], '11.2f')}x "
                      f"{_fmt(r['pair_ratio_median'], '5.2f')}x  "
                      + ", ".join(f"{p:.2f}" for p in r["pair_ratios"]))
    means = {}
    for kind in ("pyckpt", "peer"):
        ratios = [r["ratio"] for r in rows.values() if r["kind"] == kind and r["ratio"]]
        means[kind] = geomean(ratios)
        if ratios:
            worst = max((r for r in rows.items() if r[1]["kind"] == kind and r[1]["ratio"]),
                        key=lambda r: r[1]["ratio"])
            print(f"  {kind} figures: geometric mean after/before {means[kind]:.2f}x over "
                  f"{len(ratios)}, highest {worst[1]['ratio']:.2f}x ({worst[0]})"
                  + ("  [peers do not run pyckpt: their spread is the noise]" if kind == "peer"
                     else ""))
    return means


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("benches", nargs="*", metavar="BENCH",
                   help=f"which benchmarks, in order (default all: {' '.join(BENCHES)})")
    p.add_argument("--before", default="804d82e", help="the earlier revision (default 804d82e)")
    p.add_argument("--rounds", type=int, default=3,
                   help="runs of each side per benchmark, alternating (default 3)")
    p.add_argument("--preset", choices=["small", "full"], default="small",
                   help="the benchmarks' options: small (default; about 10 min for all four "
                        "with 3 rounds on 2 cores) or full (larger states, more inner rounds)")
    for name in BENCHES:
        p.add_argument(f"--args-{name}", default=None, metavar="ARGS",
                       help=f"bench_{name}.py's options instead of the preset's (one string)")
    p.add_argument("--dir", default=None,
                   help="scratch directory: the worktree, logs and the benchmarks' own --dir "
                        "(default: a fresh one under /tmp)")
    p.add_argument("--timeout", type=float, default=1200.0, help="seconds per run (default 1200)")
    p.add_argument("--json", default=None, metavar="PATH", help="write every run's figures here")
    p.add_argument("--keep", action="store_true", help="keep the scratch directory (logs)")
    args = p.parse_args(argv)
    if args.rounds < 1:
        p.error("--rounds must be >= 1")
    unknown = [b for b in args.benches if b not in BENCHES]
    if unknown:
        p.error(f"unknown benchmark(s) {', '.join(unknown)}: choose from {', '.join(BENCHES)}")
    args.benches = list(dict.fromkeys(args.benches)) or list(BENCHES)
    return args


def bench_argv(name: str, args: argparse.Namespace, work: Path) -> list[str]:
    """The options of ``name``'s runs: the same for both sides."""
    bench = BENCHES[name]
    own = getattr(args, f"args_{name}")
    argv = shlex.split(own) if own is not None else list(bench.presets[args.preset])
    if bench.takes_dir and "--dir" not in argv:
        (work / "scratch").mkdir(exist_ok=True)
        argv += ["--dir", str(work / "scratch")]
    return argv


def main(argv=None) -> int:
    args = parse_args(argv)
    work = make_workdir(args.dir, prefix="pyckpt-bench-revs-")
    before = _git("rev-parse", "--short", args.before)
    head = _git("rev-parse", "--short", "HEAD")
    changed = _git("status", "--porcelain", "--", "pyckpt").splitlines()
    after_label = f"{head}{f' + {len(changed)} changed path(s) under pyckpt/' if changed else ''}"
    print(f"before: {before} ({args.before}); after: this tree, {after_label}")
    print(f"runs  : {args.rounds} per side per benchmark, alternating (before, after, ...); "
          f"preset {args.preset}; scratch {work}")
    tree = tree_at(before, work / "tree-before")
    doc: dict = {"before": before, "after": after_label, "rounds": args.rounds,
                 "preset": args.preset, "benches": {}}
    t_all = time.perf_counter()
    try:
        envs = sides(tree)
        for name in args.benches:
            bench = BENCHES[name]
            bargv = bench_argv(name, args, work)
            print(f"\n== {bench.script} {shlex.join(bargv)}", flush=True)
            runs: dict[str, list[Figures]] = {"before": [], "after": []}
            errors: list[str] = []
            t0 = time.perf_counter()
            for rnd in range(args.rounds):
                for side in ("before", "after"):
                    figs, wall, err = run_once(bench, bargv, envs[side], work / f"{name}.json",
                                               work / f"{name}-{side}-{rnd}.log", args.timeout)
                    if err is not None:
                        errors.append(f"{side} round {rnd + 1}: {err}")
                        print(f"  ! {side} round {rnd + 1} failed: {err}", flush=True)
                    runs[side].append(figs or {})
                    print(f"  round {rnd + 1}/{args.rounds} {side:<6} {wall:6.1f} s", flush=True)
            rows = compare_runs(runs)
            means = print_rows(f"== {name}: {bench.script}, medians over {args.rounds} run(s) per "
                               f"side (seconds; after/before > 1: this tree slower); "
                               f"{time.perf_counter() - t0:.0f} s", rows)
            doc["benches"][name] = {"script": bench.script, "argv": bargv, "rows": rows,
                                    "geomean": means, "errors": errors}
    finally:
        remove_tree(tree)
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
    print(f"\ntotal {time.perf_counter() - t_all:.0f} s")
    if args.json:
        write_json(args.json, doc)
    return 1 if any(b["errors"] for b in doc["benches"].values()) else 0


if __name__ == "__main__":
    sys.exit(main())
