#!/usr/bin/env python3
"""Object-based API benchmark: pyckpt's in-memory copies and object-graph overhead.

One run (interleaved rounds, rotating order, a ballast touched before every timed
operation; see harness.py) measures:

* SNAPSHOT / COPY of a model-like state (~1 GiB by default) held as pyckpt.Variables
  in a pyckpt.Module inside ``pyckpt.Checkpoint(model=...)``: the plain parallel memcpy
  baseline (one Python thread per core doing ``np.copyto``) into fresh and into
  preallocated buffers, against ``ckpt.snapshot()`` (fresh buffers),
  ``ckpt.snapshot(into=previous)`` and ``pyckpt.copy_state(model, other_model)``
  (existing buffers); target: >= 0.9x the matching baseline's throughput;
* OBJECT-GRAPH OVERHEAD with many small variables (100,000 float32[16] by default):
  ``pyckpt.save(flat_dict)`` vs ``ckpt.write()`` and ``pyckpt.load(into=flat_dict)`` vs
  ``ckpt.read()`` of the same arrays held as Variables; target: graph <= 2x flat.

See benchmarks/README.md for how to read the output.
"""

from __future__ import annotations

import shutil
import sys
import time
from pathlib import Path

import numpy as np

from harness import (GiB, Column, Group, ParallelCopy, Results, Scratch, Step, import_pyckpt,
                     kind_column, make_workdir, name_column, no_pyckpt, parse, parser,
                     print_errors, print_plan, print_table, print_targets,
                     pyckpt_header, ratio_column, run_interleaved, seconds_columns, solo,
                     state_text, summarize, target_column, targets_of, throughput_columns,
                     touched_like, write_report, zero_first_round)
from model_state import build_state, describe_state

pyckpt = import_pyckpt()

PHASE_COPY = "snapshot / copy"
PHASE_SAVE = "small vars: save"
PHASE_LOAD = "small vars: load"

BASE_FRESH = "memcpy limit (fresh)"
BASE_INTO = "memcpy limit (prealloc)"
SNAP = "ckpt.snapshot()"
SNAP_INTO = "ckpt.snapshot(into=prev)"
COPY_STATE = "pyckpt.copy_state"
FLAT_SAVE = "pyckpt.save(flat dict)"
GRAPH_WRITE = "ckpt.write"
FLAT_LOAD = "pyckpt.load(into=flat dict)"
GRAPH_READ = "ckpt.read"

COPY_TARGET = 0.9   # contender throughput / matching baseline throughput, at least
GRAPH_TARGET = 2.0  # graph time / flat time, at most
VALUE_SUFFIX = "/.ATTRIBUTES/VARIABLE_VALUE"  # how the object graph names a Variable's value

# ---------------------------------------------------------------------------
# the objects
# ---------------------------------------------------------------------------

if pyckpt is not None:
    class Node(pyckpt.Module):
        """A plain submodule: one per dotted prefix of the state's names."""

    class StateModel(pyckpt.Module):
        """The state as a tree of modules: ``params.layers.3.attn.qkv.weight`` becomes the
        Variable ``model.params.layers.3.attn.qkv.weight`` (a numeric attribute gets the
        same graph key as a list element would)."""

        def __init__(self, state: dict[str, np.ndarray]) -> None:
            for key, array in state.items():
                *path, leaf = key.split(".")
                node = self
                for part in path:
                    child = node.__dict__.get(part)
                    if child is None:
                        child = Node()
                        setattr(node, part, child)
                    node = child
                setattr(node, leaf, pyckpt.Variable(array, name=key))  # copies the array


def graph_key(root: str, dotted: str) -> str:
    return f"{root}/{dotted.replace('.', '/')}{VALUE_SUFFIX}"


def assert_equal(got: list[np.ndarray], want: list[np.ndarray], what: str) -> None:
    if len(got) != len(want):
        raise AssertionError(f"{what}: {len(got)} arrays, expected {len(want)}")
    for i, (a, b) in enumerate(zip(got, want)):
        if a.shape != b.shape or a.dtype != b.dtype or not np.array_equal(a, b):
            raise AssertionError(f"{what}: array {i} differs")


# ---------------------------------------------------------------------------
# (a) snapshot / copy
# ---------------------------------------------------------------------------


def copy_groups(state: dict[str, np.ndarray], threads: int) -> tuple[list[Group], dict]:
    """The contenders of the SNAPSHOT / COPY phase (and a description of the objects)."""
    names = list(state)
    model = StateModel(state)
    other = StateModel(state)  # same structure, for copy_state
    ckpt = pyckpt.Checkpoint(model=model)
    live = {n: np.asarray(getattr_path(model, n)) for n in names}  # the model's own arrays
    srcs = [live[n] for n in names]
    dst_other = [np.asarray(getattr_path(other, n)) for n in names]
    memcpy = ParallelCopy(srcs, threads)
    prealloc = touched_like(srcs)  # pages touched now, not inside a timed copy

    def memcpy_fresh():
        # allocated in the calling thread, as take_snapshot does, then filled in parallel
        return memcpy([np.empty(a.shape, a.dtype) for a in srcs])

    held: dict = {"prev": ckpt.snapshot()}  # the snapshot that snapshot(into=) reuses
    expected_keys = {graph_key("model", n): n for n in names}

    def snapshot_into():
        held["prev"] = ckpt.snapshot(into=held["prev"])
        return held["prev"]

    def check_snapshot(snap, reused=None):
        if set(snap.keys()) != set(expected_keys):
            raise AssertionError(f"snapshot keys differ, e.g. {sorted(snap.keys())[:2]}")
        assert_equal([snap[k] for k in expected_keys], [live[n] for n in expected_keys.values()],
                     "snapshot")
        if reused is not None and any(snap[k] is not reused[k] for k in reused):
            raise AssertionError("snapshot(into=) did not reuse the buffers of the previous one")

    def clear_prev(rnd):
        if rnd == 0:  # so that the round-0 check sees data copied in this call
            held["before"] = dict(held["prev"].arrays)
            for a in held["prev"].arrays.values():
                a.flags.writeable = True
                a.fill(0)

    fresh = {"kind": "fresh", "compare_to": BASE_FRESH, "speed_ratio": True}
    into = {"kind": "into", "compare_to": BASE_INTO, "speed_ratio": True}
    groups = [
        solo(BASE_FRESH, PHASE_COPY, memcpy_fresh,
             check=lambda r: assert_equal(r, srcs, BASE_FRESH),
             meta={"kind": "fresh", "baseline": True}),
        solo(BASE_INTO, PHASE_COPY, lambda: memcpy(prealloc), prepare=zero_first_round(prealloc),
             check=lambda r: assert_equal(r, srcs, BASE_INTO),
             meta={"kind": "into", "baseline": True}),
        solo(SNAP, PHASE_COPY, ckpt.snapshot, check=check_snapshot, meta=fresh),
        solo(SNAP_INTO, PHASE_COPY, snapshot_into, prepare=clear_prev,
             check=lambda s: check_snapshot(s, held.pop("before")), meta=into),
        solo(COPY_STATE, PHASE_COPY, lambda: pyckpt.copy_state(model, other),
             prepare=zero_first_round(dst_other),
             check=lambda r: assert_equal(dst_other, srcs, COPY_STATE), meta=into),
    ]
    desc = {"variables": len(model.variables), "modules": len(model.submodules) + 1}
    return groups, desc


def getattr_path(obj, dotted: str):
    for part in dotted.split("."):
        obj = getattr(obj, part)
    return obj


# ---------------------------------------------------------------------------
# (b) many small variables: flat dict vs object graph
# ---------------------------------------------------------------------------


def small_var_groups(num_vars: int, workdir: Path, seed: int) -> tuple[list[Group], dict]:
    rng = np.random.default_rng(seed + 1)
    arrays = [rng.standard_normal(16, dtype=np.float32) for _ in range(num_vars)]
    expected = [a.copy() for a in arrays]
    flat = {f"vars/{i}": a for i, a in enumerate(arrays)}
    ckpt = pyckpt.Checkpoint()
    ckpt.vars = [pyckpt.Variable(a) for a in arrays]  # copies: the two sides share nothing
    var_arrays = [np.asarray(v) for v in ckpt.vars]
    paths = Scratch(lambda rnd, label: workdir / f"r{rnd}-{label}",  # a fresh directory every round
                    lambda path: shutil.rmtree(path, ignore_errors=True))

    def check_read(status):
        status.assert_consumed()
        assert_equal(var_arrays, expected, GRAPH_READ)

    groups = [
        Group("flat save+load", [
            Step(FLAT_SAVE, PHASE_SAVE, lambda: pyckpt.save(flat, str(paths["flat"]))),
            Step(FLAT_LOAD, PHASE_LOAD, lambda: pyckpt.load(str(paths["flat"]), into=flat),
                 prepare=zero_first_round(arrays),
                 check=lambda r: assert_equal(arrays, expected, FLAT_LOAD)),
        ], **paths.hooks("flat")),
        Group("graph write+read", [
            Step(GRAPH_WRITE, PHASE_SAVE, lambda: ckpt.write(str(paths["graph"])),
                 meta={"compare_to": FLAT_SAVE}),
            Step(GRAPH_READ, PHASE_LOAD, lambda: ckpt.read(str(paths["graph"])),
                 prepare=zero_first_round(var_arrays), check=check_read,
                 meta={"compare_to": FLAT_LOAD}),
        ], **paths.hooks("graph")),
    ]
    return groups, {"variables": num_vars, "floats_each": 16, "bytes": num_vars * 64}


# ---------------------------------------------------------------------------
# output
# ---------------------------------------------------------------------------


COPY_COLUMNS = [name_column(28), kind_column(6), *throughput_columns(), ratio_column("vs base"),
                target_column(">=", COPY_TARGET)]
SMALL_COLUMNS = [name_column(28), *seconds_columns(),
                 Column("us/var", 8, lambda n, s: f"{s['us_per_var']:.2f}"),
                 ratio_column("vs flat"), target_column("<=", GRAPH_TARGET)]


def print_results(summary: dict, nbytes: int, n_arrays: int, num_vars: int) -> list:
    """The tables; returns the target lines (also printed at the end)."""
    targets = []
    block = summary.get(PHASE_COPY)
    if block:
        print_table(f"== SNAPSHOT / COPY  ({nbytes / GiB:.3f} GiB in {n_arrays} arrays; GB/s = "
                    f"1e9 bytes/s; vs base = throughput / the matching baseline's; target >= "
                    f"{COPY_TARGET:.2f}x)", block["contenders"], COPY_COLUMNS, ref_width=28,
                    pairs="per-round pairs (baseline time / contender time in the same round; "
                          ">= target is good):")
        targets += targets_of(block["contenders"], ">=", COPY_TARGET)
    for phase in (PHASE_SAVE, PHASE_LOAD):
        block = summary.get(phase)
        if not block:
            continue
        for s in block["contenders"].values():
            s["us_per_var"] = s["median_s"] / num_vars * 1e6
        print_table(f"== {num_vars} SMALL VARIABLES: {phase.split(': ')[1].upper()}  (float32[16] "
                    f"each, {num_vars * 64 / 1e6:.1f} MB; vs flat = graph time / flat time; "
                    f"target <= {GRAPH_TARGET:.2f}x)", block["contenders"], SMALL_COLUMNS,
                    ref_width=28, pairs="per-round pairs (graph time / flat time in the same "
                                        "round; <= target is good):")
        targets += targets_of(block["contenders"], "<=", GRAPH_TARGET)
    if targets:
        print_targets(targets)
    return [t.doc() for t in targets]


# ---------------------------------------------------------------------------
# main
# ---------------------------------------------------------------------------


def parse_args(argv=None):
    p = parser(__doc__.split("\n\n")[0], size_help="state size in GiB for snapshot / copy",
               quick_help="smoke test: 128 MiB state, 10000 variables, 2 rounds", threads=True)
    p.add_argument("--num-vars", type=int, default=100_000,
                   help="small variables (float32[16]) for the graph overhead (default 100000)")
    return parse(p, argv, quick={"size_gb": 0.125, "num_vars": 10_000, "rounds": 2},
                 at_least_one=("rounds", "num_vars", "threads"))


def main(argv=None) -> int:
    args = parse_args(argv)
    if pyckpt is None:
        return no_pyckpt()
    workdir = make_workdir(args.dir)
    meta = pyckpt_header(pyckpt, str(workdir), args.threads, "baselines")

    try:
        t0 = time.perf_counter()
        state = build_state(int(args.size_gb * GiB), args.seed)
        info = describe_state(state)
        copy, objects = copy_groups(state, args.threads)
        n_arrays = len(state)
        del state  # the models hold their own copies
        small, small_info = small_var_groups(args.num_vars, workdir, args.seed)
        print(f"state   : {state_text(info, 'Variables')} in {objects['modules']} Modules; "
              f"Checkpoint(model=...) and a second model for copy_state")
        print(f"small   : {args.num_vars} Variables of float32[16] ({small_info['bytes'] / 1e6:.1f} "
              f"MB) in ckpt.vars, and a flat dict of the same arrays; built in "
              f"{time.perf_counter() - t0:.1f} s")
        groups = copy + small
        print_plan(args.rounds, info["bytes"], f"{len(groups)} groups")
        res = run_interleaved(groups, args.rounds, info["bytes"],
                              Results((PHASE_COPY, PHASE_SAVE, PHASE_LOAD)))
        summary = summarize(res, info["bytes"])
        small_summary = summarize(res, small_info["bytes"],  # GB/s from their own few MB
                                  seconds_range=True)
        summary.update({p: small_summary[p] for p in (PHASE_SAVE, PHASE_LOAD) if p in small_summary})
        targets = print_results(summary, info["bytes"], n_arrays, args.num_vars)
        print_errors(res.errors)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)

    write_report(args.json, meta, args, state={**info, **objects}, small_vars=small_info,
                 seconds_per_round=res.seconds, summary=summary, targets=targets, errors=res.errors)
    return 0


if __name__ == "__main__":
    sys.exit(main())
