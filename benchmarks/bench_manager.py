#!/usr/bin/env python3
"""CheckpointManager benchmark: what an async save blocks, costs and buys.

One run (interleaved rounds, rotating order, a ballast touched before every timed
operation; see harness.py) on a model-like state (~1 GiB by default) held as
pyckpt.Variables in a pyckpt.Module inside ``ckpt = pyckpt.Checkpoint(model=...)``,
saved by ``manager = pyckpt.CheckpointManager(ckpt, dir, max_to_keep=2)``, measures:

* BLOCKING TIME of ``manager.save(blocking=False)`` (it returns once the state is
  copied into the staging buffers reused from the previous async save) against a
  plain parallel memcpy of the same bytes into preallocated buffers; target <= 1.2x;
* TOTAL of ``save(blocking=False)`` + ``wait_until_finished()`` against a blocking
  ``save()`` (both commit a durable checkpoint, retention deletes old ones);
  target <= 1.10x;
* OVERLAP: an async save while the main thread does simulated training work (a
  numpy matmul loop sized like a blocking save), against a blocking save followed
  by the same work; reports the time saved (no target).

See benchmarks/README.md for how to read the output.
"""

from __future__ import annotations

import argparse
import os
import sys


def _preparse_work_threads(argv) -> int:
    p = argparse.ArgumentParser(add_help=False)
    p.add_argument("--work-threads", type=int, default=1)
    return max(1, p.parse_known_args(argv)[0].work_threads)


if __name__ == "__main__":
    # BLAS threads of the simulated training work: fixed before numpy loads OpenBLAS.
    for _var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ[_var] = str(_preparse_work_threads(sys.argv[1:]))

import shutil  # noqa: E402
import statistics  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402

from harness import (GiB, Group, ParallelCopy, Results, make_workdir, name_column,  # noqa: E402
                     no_pyckpt, parse, parser, print_errors, print_plan, print_table,
                     print_targets, pyckpt_header, ratio_column, run_interleaved, seconds_columns,
                     solo, state_text, summarize, target_column, targets_of, throughput_columns,
                     touch_ballast, touched_like, write_report, zero_first_round)
from model_state import build_state, describe_state  # noqa: E402
from bench_objects import StateModel, assert_equal, getattr_path, graph_key, pyckpt  # noqa: E402

PHASE_BLOCK = "async save: blocking time"
PHASE_TOTAL = "async save: total"
PHASE_OVERLAP = "overlap with work"

MEMCPY = "memcpy limit (prealloc)"
ASYNC_BLOCK = "save(blocking=False)"
BLOCKING = "save() [blocking]"
ASYNC_TOTAL = "save(blocking=False)+wait"
WORK = "work alone"
BLOCKING_WORK = "save() + work"
ASYNC_WORK = "save(False) + work + wait"

BLOCK_TARGET = 1.2   # async save's blocking time / memcpy time, at most
TOTAL_TARGET = 1.10  # async save + wait time / blocking save time, at most
MAX_TO_KEEP = 2

# ---------------------------------------------------------------------------
# simulated training work
# ---------------------------------------------------------------------------


class Work:
    """A loop of float32 ``n x n`` matmuls (numpy releases the GIL in BLAS)."""

    def __init__(self, n: int = 512, seed: int = 0) -> None:
        rng = np.random.default_rng(seed + 2)
        self.a = rng.standard_normal((n, n), dtype=np.float32)
        self.b = rng.standard_normal((n, n), dtype=np.float32) / np.float32(n)
        self.c = np.empty((n, n), dtype=np.float32)
        self.iters = 1

    def run(self, iters: int | None = None) -> None:
        for _ in range(self.iters if iters is None else iters):
            np.matmul(self.a, self.b, out=self.c)

    def calibrate(self, seconds: float, batch: int = 20) -> dict:
        """Sets ``iters`` so that ``run()`` takes about ``seconds``."""
        self.run(batch)  # warm-up (BLAS thread start, caches)
        per_iter = []
        for _ in range(5):
            t0 = time.perf_counter()
            self.run(batch)
            per_iter.append((time.perf_counter() - t0) / batch)
        it = statistics.median(per_iter)
        self.iters = max(1, round(seconds / it))
        return {"matrix": self.a.shape[0], "seconds_per_iter": it, "iters": self.iters,
                "target_s": seconds, "expected_s": self.iters * it}


# ---------------------------------------------------------------------------
# the contenders
# ---------------------------------------------------------------------------


def flatten_nested(tree, prefix: str = "") -> dict:
    """``{"a": {"b": x}}`` -> ``{"a/b": x}`` (how pyckpt.load nests a graph checkpoint)."""
    if isinstance(tree, dict):
        out = {}
        for k, v in tree.items():
            out.update(flatten_nested(v, f"{prefix}/{k}" if prefix else str(k)))
        return out
    return {prefix: tree}


class Bench:
    """The model, its Checkpoint and CheckpointManager, the memcpy buffers and the work."""

    def __init__(self, state: dict[str, np.ndarray], workdir: Path, threads: int, seed: int):
        self.names = list(state)
        self.model = StateModel(state)  # copies the arrays into Variables
        self.ckpt = pyckpt.Checkpoint(model=self.model)
        self.workdir = workdir
        self.manager = pyckpt.CheckpointManager(self.ckpt, str(workdir), max_to_keep=MAX_TO_KEEP)
        self.live = {n: np.asarray(getattr_path(self.model, n)) for n in self.names}
        self.srcs = [self.live[n] for n in self.names]
        self.copy = ParallelCopy(self.srcs, threads)
        self.prealloc = touched_like(self.srcs)  # pages touched now, not inside a timed copy
        self.clear_prealloc = zero_first_round(self.prealloc)  # for round 1's check
        self.work = Work(seed=seed)
        self.nbytes = sum(a.nbytes for a in self.srcs)

    # -- timed calls -----------------------------------------------------------------
    def memcpy(self) -> list[np.ndarray]:
        return self.copy(self.prealloc)

    def save_async(self) -> str:
        return self.manager.save(blocking=False)

    def save_blocking(self) -> str:
        return self.manager.save()

    def save_async_wait(self) -> str:
        path = self.manager.save(blocking=False)
        self.manager.wait_until_finished()
        return path

    def blocking_then_work(self) -> str:
        path = self.manager.save()
        self.work.run()
        return path

    def async_with_work(self) -> str:
        path = self.manager.save(blocking=False)
        self.work.run()
        self.manager.wait_until_finished()
        return path

    # -- untimed -------------------------------------------------------------------------
    def wait(self, rnd: int = 0) -> None:
        self.manager.wait_until_finished()

    def verify(self, path: str, override: dict | None = None) -> None:
        """The committed checkpoint at ``path`` holds the model's values (or ``override``)."""
        flat = flatten_nested(pyckpt.load(path, mmap=True))  # checksums verified
        want_keys = {graph_key("model", n): n for n in self.names}
        missing = set(want_keys) - set(flat)
        if missing:
            raise AssertionError(f"{path}: {len(missing)} values missing, e.g. {sorted(missing)[0]}")
        override = override or {}
        assert_equal([flat[k] for k in want_keys],
                      [override.get(n, self.live[n]) for n in want_keys.values()], path)
        del flat

    def check_async(self, path: str) -> None:
        """Round 1: values changed right after save() returned must not reach the
        checkpoint; the committed checkpoint holds the values of save time."""
        name = self.names[0]
        live = self.live[name]
        before = live.copy()
        live.fill(7.0)  # while the background write may still be running
        try:
            self.manager.wait_until_finished()
            self.verify(path, {name: before})
        finally:
            live[...] = before

    def check_memcpy(self, out) -> None:
        assert_equal(out, self.srcs, MEMCPY)

    def warm_up(self, ballast: int, blocking_saves: int = 3) -> list[float]:
        """Untimed: one async save (allocates the staging buffers the next ones reuse),
        then blocking saves until retention deletes (steady state); their times."""
        touch_ballast(ballast)
        self.save_async_wait()
        times = []
        for _ in range(blocking_saves):
            touch_ballast(ballast)
            t0 = time.perf_counter()
            self.save_blocking()
            times.append(time.perf_counter() - t0)
        return times

    def groups(self) -> list[Group]:
        w = self.wait
        return [
            solo(MEMCPY, PHASE_BLOCK, self.memcpy, prepare=self.clear_prealloc,
                 check=self.check_memcpy, meta={"baseline": True}),
            solo(ASYNC_BLOCK, PHASE_BLOCK, self.save_async, w, check=self.check_async,
                 meta={"compare_to": MEMCPY}),
            solo(BLOCKING, PHASE_TOTAL, self.save_blocking, w, check=self.verify,
                 meta={"baseline": True}),
            solo(ASYNC_TOTAL, PHASE_TOTAL, self.save_async_wait, w, check=self.verify,
                 meta={"compare_to": BLOCKING}),
            solo(WORK, PHASE_OVERLAP, self.work.run, meta={"info": True}),
            solo(BLOCKING_WORK, PHASE_OVERLAP, self.blocking_then_work, w, check=self.verify,
                 meta={"baseline": True}),
            solo(ASYNC_WORK, PHASE_OVERLAP, self.async_with_work, w, check=self.verify,
                 meta={"compare_to": BLOCKING_WORK}),
        ]

    def close(self) -> None:
        self.manager.close()


# ---------------------------------------------------------------------------
# output
# ---------------------------------------------------------------------------


def overlap_stats(res: Results, summary: dict) -> dict | None:
    """Time saved by the async save under work: medians and per-round differences."""
    block = summary.get(PHASE_OVERLAP, {}).get("contenders", {})
    if BLOCKING_WORK not in block or ASYNC_WORK not in block:
        return None
    rows = res.seconds[PHASE_OVERLAP]
    pairs = [b - a for b, a in zip(rows[BLOCKING_WORK], rows[ASYNC_WORK])
             if a is not None and b is not None]
    saved = block[BLOCKING_WORK]["median_s"] - block[ASYNC_WORK]["median_s"]
    total = summary.get(PHASE_TOTAL, {}).get("contenders", {})
    blocking_save = total.get(BLOCKING, {}).get("median_s")
    work = block.get(WORK, {}).get("median_s")
    out = {"saved_s": saved, "saved_fraction": saved / block[BLOCKING_WORK]["median_s"],
           "pair_saved_s": pairs, "pair_saved_median_s": statistics.median(pairs) if pairs else None,
           "blocking_save_s": blocking_save, "work_s": work,
           "hidden_fraction_of_save": saved / blocking_save if blocking_save else None}
    return out


def print_results(summary: dict, res: Results, nbytes: int, n_arrays: int) -> tuple[list, dict | None]:
    """The tables; returns the target lines and the overlap figures."""
    targets = []
    gib = f"{nbytes / GiB:.3f} GiB in {n_arrays} Variables"
    for phase, goal, title, ref_text in (
            (PHASE_BLOCK, BLOCK_TARGET, "BLOCKING TIME OF AN ASYNC SAVE", "time / memcpy time"),
            (PHASE_TOTAL, TOTAL_TARGET, "TOTAL ASYNC SAVE (durable commit + retention)",
             "time / blocking save time")):
        block = summary.get(phase)
        if not block:
            continue
        cols = [name_column(28), *throughput_columns(), ratio_column("vs ref"),
                target_column("<=", goal)]
        print_table(f"== {title}  ({gib}; GB/s = 1e9 bytes/s; vs ref = {ref_text}; "
                    f"target <= {goal:.2f}x)", block["contenders"], cols, name_width=28,
                    ref_width=28, pairs="per-round pairs (contender time / reference time in the "
                                        "same round; <= target is good):")
        targets += targets_of(block["contenders"], "<=", goal)

    overlap = overlap_stats(res, summary)
    block = summary.get(PHASE_OVERLAP)
    if block:
        cols = [name_column(28), *seconds_columns(), ratio_column("vs ref")]
        print_table(f"== OVERLAP WITH SIMULATED TRAINING WORK  (vs ref = time / "
                    f"'{BLOCKING_WORK}' time; < 1 means the async save hid part of its cost)",
                    block["contenders"], cols, name_width=28, ref_width=28,
                    pairs="per-round pairs (time / reference time in the same round):")
    if overlap:
        pairs = ", ".join(f"{p:.3f}" for p in overlap["pair_saved_s"])
        print(f"  time saved by the async save: {overlap['saved_s']:.3f} s per save+work step "
              f"({overlap['saved_fraction'] * 100:.0f}% of '{BLOCKING_WORK}'), per-round median "
              f"{overlap['pair_saved_median_s']:.3f} s [{pairs}]")
        if overlap["hidden_fraction_of_save"] is not None:
            print(f"  = {overlap['hidden_fraction_of_save'] * 100:.0f}% of a blocking save "
                  f"({overlap['blocking_save_s']:.3f} s) hidden behind {overlap['work_s']:.3f} s "
                  f"of work")

    if targets:
        print_targets(targets)
        if overlap:
            print(f"  {'overlap (no target)':<28} saved {overlap['saved_s']:.3f} s "
                  f"[{overlap['pair_saved_median_s']:.3f} s] of {BLOCKING_WORK!r}")
    return [t.doc() for t in targets], overlap


# ---------------------------------------------------------------------------
# main
# ---------------------------------------------------------------------------


def parse_args(argv=None):
    p = parser(__doc__.split("\n\n")[0], threads=True, dir_help=(
        "where the manager writes (default: a fresh temp dir under /tmp); everything written "
        "is deleted at the end"))
    p.add_argument("--work-seconds", type=float, default=None, metavar="S",
                   help="length of the simulated training work (default: the median time of "
                        "the warm-up blocking saves)")
    p.add_argument("--work-threads", type=int, default=1, metavar="N",
                   help="BLAS threads of the simulated work (default 1: the other cores stay "
                        "free, like a host whose training runs on an accelerator)")
    args = parse(p, argv, quick={"size_gb": 0.125, "rounds": 2},
                 at_least_one=("rounds", "threads", "work_threads"))
    if args.work_seconds is not None and args.work_seconds <= 0:
        p.error("--work-seconds must be > 0")
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    if pyckpt is None:
        return no_pyckpt()
    workdir = make_workdir(args.dir)
    blas = os.environ.get("OPENBLAS_NUM_THREADS", "unset")
    meta = pyckpt_header(pyckpt, str(workdir), args.threads, note=(
        f"; simulated work OPENBLAS_NUM_THREADS={blas} (--work-threads)"))

    bench = None
    res = Results((PHASE_BLOCK, PHASE_TOTAL, PHASE_OVERLAP))
    summary: dict = {}
    try:
        t0 = time.perf_counter()
        state = build_state(int(args.size_gb * GiB), args.seed)
        info = describe_state(state)
        bench = Bench(state, workdir, args.threads, args.seed)
        del state  # the model holds its own copies
        print(f"state   : {state_text(info, 'Variables')} in Checkpoint(model=...); "
              f"CheckpointManager(max_to_keep={MAX_TO_KEEP}); built in "
              f"{time.perf_counter() - t0:.1f} s")
        t0 = time.perf_counter()
        warm = bench.warm_up(info["bytes"])
        work_target = args.work_seconds or statistics.median(warm)
        work = bench.work.calibrate(work_target)
        print(f"warm-up : 1 async save + {len(warm)} blocking saves "
              f"({', '.join(f'{t:.2f}' for t in warm)} s) in {time.perf_counter() - t0:.1f} s; "
              f"work = {work['iters']} matmuls of float32[{work['matrix']}x{work['matrix']}] "
              f"(~{work['expected_s']:.2f} s, sized to "
              f"{'--work-seconds' if args.work_seconds else 'the median warm-up blocking save'})")
        groups = bench.groups()
        print_plan(args.rounds, info["bytes"], f"{len(groups)} groups")
        run_interleaved(groups, args.rounds, info["bytes"], res)
        summary = summarize(res, info["bytes"], seconds_range=True)
        targets, overlap = print_results(summary, res, info["bytes"], info["tensors"])
        kept = [Path(p).name for p in bench.manager.checkpoints]
        on_disk = sorted(e for e in os.listdir(workdir) if not e.startswith(".")
                         and e.startswith("ckpt-"))
        print(f"\nretention: manager keeps {kept}; on disk {on_disk} "
              f"(max_to_keep={MAX_TO_KEEP})")
        print_errors(res.errors)
    finally:
        if bench is not None:
            try:
                bench.close()
            except Exception as e:  # report, still delete the files
                print(f"manager.close() failed: {type(e).__name__}: {e}", file=sys.stderr)
        shutil.rmtree(workdir, ignore_errors=True)

    write_report(args.json, meta, args, state=info, warmup_blocking_s=warm, work=work,
                 seconds_per_round=res.seconds, summary=summary, targets=targets, overlap=overlap,
                 errors=res.errors)
    return 0


if __name__ == "__main__":
    sys.exit(main())
