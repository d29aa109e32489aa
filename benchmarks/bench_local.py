#!/usr/bin/env python3
"""Single-machine save/load benchmark: pyckpt against the raw I/O limit and its peers.

One run measures, on a deterministic model-like state (~1 GiB by default):

* durable SAVE: raw 2-thread pwrite+fsync limit, pyckpt.save, safetensors, torch.save,
  torch DCP (FileSystemWriter, 2 threads), np.savez; every peer is followed by an
  fsync of each file it wrote and of its directory (pyckpt.save syncs by itself);
* LOAD with a warm page cache: raw 2-thread preadv limit, pyckpt.load (plus its mmap
  and into= variants, reported separately), safetensors, torch.load, DCP into
  preallocated tensors, np.load of the npz;
* LOAD with a cold page cache (only where /proc/sys/vm/drop_caches is writable);
* CRC32C throughput on one core; peak extra memory of pyckpt.save / pyckpt.load(into=).

Contenders are interleaved (every round runs each one once, in a rotating order) and
a ballast buffer the size of the state is touched and freed before every timed
operation, so that first-touch page faults of a VM do not land on one contender
(the measurement harness is in harness.py, the state in model_state.py).
See benchmarks/README.md for how to read the output.
"""

from __future__ import annotations

import argparse
import dataclasses
import gc
import os
import shutil
import statistics
import sys
import tempfile
import time
import warnings
import zlib
from pathlib import Path
from typing import Callable

import numpy as np

from harness import (
    make_workdir, GB, GiB, MiB, Column, PeakMemory, Results, import_pyckpt, machine_info,
                     name_column, optional_import, print_machine, print_pairs, print_table,
                     rotated, run_contender, run_threads, split_balanced, summarize,
                     throughput_columns, timed, touch_ballast, version_of, write_json)
from model_state import build_state, describe_state

pyckpt = import_pyckpt()
safetensors_numpy = optional_import("safetensors.numpy")
torch = optional_import("torch")
dcp = optional_import("torch.distributed.checkpoint") if torch is not None else None
crc32c_pkg = optional_import("crc32c")

MODULES = {
    "pyckpt": pyckpt,
    "safetensors": safetensors_numpy,
    "torch": torch,
    "torch.distributed.checkpoint": dcp,
    "crc32c": crc32c_pkg,
}

# DCP warns that it runs without a process group: that is what we want here.
warnings.filterwarnings("ignore", message=r".*torch\.distributed is disabled.*")


def library_versions() -> dict:
    versions = {
        "pyckpt": version_of(pyckpt),
        "safetensors": version_of(optional_import("safetensors")) if safetensors_numpy else None,
        "torch": version_of(torch),
        "crc32c": version_of(crc32c_pkg),
    }
    if pyckpt is not None:
        versions["pyckpt_crc32c_impl"] = pyckpt._core.crc32c_implementation()
    return versions


# ---------------------------------------------------------------------------
# OS helpers: durability, page cache, CPU pinning
# ---------------------------------------------------------------------------


def fsync_path(path: str | os.PathLike) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_tree(root: str | os.PathLike) -> None:
    """fsync every file under ``root``, then every directory (deepest first)."""
    dirs = []
    for dirpath, _, files in os.walk(root):
        dirs.append(dirpath)
        for name in files:
            fsync_path(os.path.join(dirpath, name))
    for d in reversed(dirs):
        fsync_path(d)


def warm_read(root: str | os.PathLike) -> None:
    """Read every file under ``root`` once so it sits in the page cache."""
    buf = bytearray(16 * MiB)
    for dirpath, _, files in os.walk(root):
        for name in files:
            with open(os.path.join(dirpath, name), "rb", buffering=0) as f:
                while f.readinto(buf):
                    pass


def drop_caches() -> None:
    """``sync`` then drop the page cache of the whole machine (needs root)."""
    os.sync()
    with open("/proc/sys/vm/drop_caches", "w") as f:
        f.write("1")


def can_drop_caches() -> tuple[bool, str]:
    try:
        drop_caches()
        return True, ""
    except OSError as e:
        return False, f"{type(e).__name__}: {e}"


def pin_to_one_cpu() -> Callable[[], None]:
    """Pin every thread of this process to one CPU; returns a function restoring it."""
    if not hasattr(os, "sched_setaffinity"):
        return lambda: None
    before = os.sched_getaffinity(0)
    cpu = {min(before)}
    tids = [int(t) for t in os.listdir("/proc/self/task")]
    for tid in tids:
        try:
            os.sched_setaffinity(tid, cpu)
        except OSError:
            pass

    def restore():
        for tid in tids:
            try:
                os.sched_setaffinity(tid, before)
            except OSError:
                pass

    return restore


# ---------------------------------------------------------------------------
# raw limit: 2 threads, pwrite / preadv, no format at all
# ---------------------------------------------------------------------------

RAW_THREADS = 2


def _bytes_view(a: np.ndarray) -> memoryview:
    return memoryview(a).cast("B")


def _pwrite_all(fd: int, view: memoryview, offset: int) -> None:
    while view:
        n = os.pwrite(fd, view, offset)
        view, offset = view[n:], offset + n


def _preadv_all(fd: int, view: memoryview, offset: int) -> None:
    while view:
        n = os.preadv(fd, [view], offset)
        if n == 0:
            raise EOFError("short file")
        view, offset = view[n:], offset + n


@dataclasses.dataclass
class RawHandle:
    root: Path
    files: list[Path]
    plans: list[list[tuple[str, int, tuple, np.dtype]]]  # per file: key, offset, shape, dtype


def raw_save(state, out: Path, ctx) -> RawHandle:
    out.mkdir()
    bins = split_balanced(state, RAW_THREADS)
    files = [out / f"part{i}.bin" for i in range(RAW_THREADS)]
    plans: list[list] = [[] for _ in range(RAW_THREADS)]

    def write_part(i: int) -> None:
        fd = os.open(files[i], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            offset = 0
            for key in bins[i]:
                a = state[key]
                _pwrite_all(fd, _bytes_view(a), offset)
                plans[i].append((key, offset, a.shape, a.dtype))
                offset += a.nbytes
            os.fsync(fd)
        finally:
            os.close(fd)

    run_threads(write_part, RAW_THREADS)
    fsync_path(out)
    return RawHandle(out, files, plans)


def raw_load(h: RawHandle, ctx) -> dict[str, np.ndarray]:
    # Allocate every array up front in the calling thread (as a library would, and so
    # that the arrays do not land in per-thread malloc arenas), then read in parallel.
    out = {key: np.empty(shape, dtype) for plan in h.plans for key, _, shape, dtype in plan}

    def read_part(i: int) -> None:
        fd = os.open(h.files[i], os.O_RDONLY)
        try:
            for key, offset, _, _ in h.plans[i]:
                _preadv_all(fd, _bytes_view(out[key]), offset)
        finally:
            os.close(fd)

    run_threads(read_part, RAW_THREADS)
    return out


# ---------------------------------------------------------------------------
# pyckpt
# ---------------------------------------------------------------------------


def pyckpt_save(state, out: Path, ctx) -> Path:
    pyckpt.save(state, str(out))  # durable on return (data + index fsynced)
    return out


def pyckpt_load(h: Path, ctx):
    return pyckpt.load(str(h))


def pyckpt_load_mmap(h: Path, ctx):
    return pyckpt.load(str(h), mmap=True)


def pyckpt_load_into(h: Path, ctx):
    pyckpt.load(str(h), into=ctx.into_numpy)
    return ctx.into_numpy


# ---------------------------------------------------------------------------
# peers (every save is followed by an fsync of what it wrote)
# ---------------------------------------------------------------------------


def safetensors_save(state, out: Path, ctx) -> Path:
    out.mkdir()
    f = out / "model.safetensors"
    safetensors_numpy.save_file(state, str(f))
    fsync_tree(out)
    return f


def safetensors_load(h: Path, ctx):
    return safetensors_numpy.load_file(str(h))


def torch_save(state, out: Path, ctx) -> Path:
    out.mkdir()
    f = out / "model.pt"
    torch.save(ctx.torch_tensors, str(f))
    fsync_tree(out)
    return f


def torch_load(h: Path, ctx):
    return torch.load(str(h), weights_only=True, mmap=False)


def dcp_save(state, out: Path, ctx) -> Path:
    from torch.distributed.checkpoint import FileSystemWriter

    dcp.save(ctx.torch_tensors, storage_writer=FileSystemWriter(str(out), thread_count=2))
    fsync_tree(out)
    return out


def dcp_load_into(h: Path, ctx):
    from torch.distributed.checkpoint import FileSystemReader

    dcp.load(ctx.into_torch, storage_reader=FileSystemReader(str(h)))
    return ctx.into_torch


def npz_save(state, out: Path, ctx) -> Path:
    out.mkdir()
    f = out / "state.npz"
    np.savez(str(f), **state)
    fsync_tree(out)
    return f


def npz_load(h: Path, ctx):
    with np.load(str(h)) as z:
        return {k: z[k] for k in z.files}


# ---------------------------------------------------------------------------
# registry
# ---------------------------------------------------------------------------

PYCKPT_SAVE = "pyckpt.save"
PYCKPT_LOAD = "pyckpt.load"
PYCKPT_INTO = "pyckpt.load(into=)"


@dataclasses.dataclass
class LoadSpec:
    name: str
    fn: Callable
    kind: str = "fresh"          # fresh: allocates its arrays; into: fills preallocated; mmap
    compare_to: str | None = None  # the pyckpt contender it is paired with in ratios
    cold: bool = False           # also measured with a dropped page cache


@dataclasses.dataclass
class Format:
    name: str                    # the save contender's name
    save: Callable
    loads: list[LoadSpec]
    requires: tuple[str, ...] = ()
    is_limit: bool = False
    is_pyckpt: bool = False


FORMATS = [
    Format("raw pwrite limit", raw_save,
           [LoadSpec("raw preadv limit", raw_load, compare_to=PYCKPT_LOAD, cold=True)],
           is_limit=True),
    Format(PYCKPT_SAVE, pyckpt_save,
           [LoadSpec(PYCKPT_LOAD, pyckpt_load, cold=True),
            LoadSpec("pyckpt.load(mmap=True)", pyckpt_load_mmap, kind="mmap"),
            LoadSpec(PYCKPT_INTO, pyckpt_load_into, kind="into")],
           requires=("pyckpt",), is_pyckpt=True),
    Format("safetensors.save_file", safetensors_save,
           [LoadSpec("safetensors.load_file", safetensors_load, compare_to=PYCKPT_LOAD, cold=True)],
           requires=("safetensors",)),
    Format("torch.save", torch_save,
           [LoadSpec("torch.load", torch_load, compare_to=PYCKPT_LOAD)],
           requires=("torch",)),
    Format("torch DCP save", dcp_save,
           [LoadSpec("torch DCP load(into)", dcp_load_into, kind="into", compare_to=PYCKPT_INTO)],
           requires=("torch", "torch.distributed.checkpoint")),
    Format("np.savez", npz_save,
           [LoadSpec("np.load(npz)", npz_load, compare_to=PYCKPT_LOAD)]),
]


@dataclasses.dataclass
class Context:
    """Inputs prepared once, outside any timing."""
    state: dict[str, np.ndarray]
    nbytes: int
    into_numpy: dict[str, np.ndarray]   # preallocated, touched buffers for into= loads
    torch_tensors: dict | None = None   # torch.from_numpy views of the state
    into_torch: dict | None = None      # torch views of into_numpy (DCP loads into them)


def make_context(state: dict[str, np.ndarray]) -> Context:
    into = {}
    for k, a in state.items():
        b = np.empty_like(a)
        b.fill(0)  # touch the pages now, not inside a timed load
        into[k] = b
    ctx = Context(state, sum(a.nbytes for a in state.values()), into)
    if torch is not None:
        ctx.torch_tensors = {k: torch.from_numpy(a) for k, a in state.items()}
        ctx.into_torch = {k: torch.from_numpy(a) for k, a in into.items()}
    return ctx


# ---------------------------------------------------------------------------
# measurement
# ---------------------------------------------------------------------------


def verify(result, state: dict[str, np.ndarray]) -> None:
    """The loaded tree must hold exactly the saved arrays (checked in round 0 only)."""
    if set(result) != set(state):
        missing = set(state) - set(result)
        extra = set(result) - set(state)
        raise AssertionError(f"keys differ: missing {sorted(missing)[:3]}, extra {sorted(extra)[:3]}")
    for k, a in state.items():
        b = result[k]
        if torch is not None and isinstance(b, torch.Tensor):
            b = b.numpy()
        b = np.asarray(b)
        if b.shape != a.shape or b.dtype != a.dtype or not np.array_equal(a, b):
            raise AssertionError(f"tensor {k!r} differs after load")


PHASES = ("save", "load (warm cache)", "load (cold cache)")


def run_rounds(formats: list[Format], ctx: Context, rounds: int, workdir: Path,
               cold: bool, verbose: bool = True) -> Results:
    res = Results(PHASES)
    for fmt in formats:
        res.meta[fmt.name] = {"phase": "save", "limit": fmt.is_limit, "pyckpt": fmt.is_pyckpt,
                              "compare_to": None if fmt.is_pyckpt else PYCKPT_SAVE}
        for ls in fmt.loads:
            res.meta[ls.name] = {"phase": "load", "limit": fmt.is_limit, "pyckpt": fmt.is_pyckpt,
                                 "kind": ls.kind, "compare_to": ls.compare_to}
            if ls.cold and cold:
                res.meta[ls.name + " [cold]"] = {
                    "phase": "load_cold", "limit": fmt.is_limit, "pyckpt": fmt.is_pyckpt,
                    "kind": ls.kind,
                    "compare_to": ls.compare_to and ls.compare_to + " [cold]"}

    for rnd in range(rounds):
        order = rotated(formats, rnd)
        t_round = time.perf_counter()
        for fmt in order:
            out = workdir / f"r{rnd}-{fmt.name.replace(' ', '_').replace('.', '_')}"
            shutil.rmtree(out, ignore_errors=True)
            touch_ballast(ctx.nbytes)
            handle = run_contender(res, "save", fmt.name, rnd, fmt.save, ctx.state, out, ctx)
            if handle is not None:
                warm_read(out)
                for ls in fmt.loads:
                    check = None
                    if rnd == 0:  # verify the first load of each contender
                        check = lambda r: verify(r, ctx.state)  # noqa: E731
                        if ls.kind == "into":  # buffers are shared: clear what a peer left
                            for b in ctx.into_numpy.values():
                                b.fill(0)
                    touch_ballast(ctx.nbytes)
                    loaded = run_contender(res, "load (warm cache)", ls.name, rnd, ls.fn, handle, ctx,
                                           check=check)
                    del loaded
                if cold:
                    for ls in fmt.loads:
                        if not ls.cold:
                            continue
                        touch_ballast(ctx.nbytes)
                        drop_caches()
                        loaded = run_contender(res, "load (cold cache)", ls.name + " [cold]", rnd,
                                               ls.fn, handle, ctx)
                        del loaded
            gc.collect()
            shutil.rmtree(out, ignore_errors=True)
        if verbose:
            print(f"  round {rnd + 1}/{rounds} done in {time.perf_counter() - t_round:.1f} s "
                  f"(order: {', '.join(f.name for f in order)})", flush=True)
    return res


# ---------------------------------------------------------------------------
# summary
# ---------------------------------------------------------------------------


def _fmt_fraction(n: str, s: dict) -> str:
    return f"{s['fraction_of_limit']:.2f}" if s.get("fraction_of_limit") else "-"


def _fmt_speedup(n: str, s: dict) -> str:
    return f"{s['pyckpt_speedup']:.2f}x" if "pyckpt_speedup" in s else "-"


TABLE_COLUMNS = [name_column(28), Column("kind", 6, lambda n, s: s.get("kind", "-"), left=True),
                 *throughput_columns(), Column("vs limit", 9, _fmt_fraction),
                 Column("pyckpt x", 9, _fmt_speedup)]


def print_tables(summary: dict, nbytes: int) -> None:
    for phase, block in summary.items():
        print_table(f"== {phase.upper()}  ({nbytes / GiB:.3f} GiB state; GB/s = 1e9 bytes/s; "
                    f"limit = {block['limit'] or 'n/a'})", block["contenders"], TABLE_COLUMNS)
        print_pairs(block["contenders"], "per-round pairs (peer time / pyckpt time in the same "
                    "round; > 1 = pyckpt faster):")


# ---------------------------------------------------------------------------
# extra measurements: CRC32C and peak memory
# ---------------------------------------------------------------------------


def bench_crc(nbytes: int = 256 * MiB, reps: int = 3) -> dict:
    buf = np.random.default_rng(1).integers(0, 256, nbytes, dtype=np.uint8)
    view = memoryview(buf)
    impls: dict[str, Callable] = {}
    if pyckpt is not None:
        impls[f"pyckpt._core.crc32c ({pyckpt._core.crc32c_implementation()})"] = \
            lambda: pyckpt._core.crc32c(view)
    else:
        print("  note: pyckpt missing, its CRC32C is skipped")
    if crc32c_pkg is not None:
        impls["crc32c.crc32c (PyPI)"] = lambda: crc32c_pkg.crc32c(view)
    else:
        print("  note: crc32c package missing, skipped")
    impls["zlib.crc32 (CRC32, not C)"] = lambda: zlib.crc32(view)

    restore = pin_to_one_cpu()
    out = {}
    try:
        for name, fn in impls.items():
            times, value = [], None
            for _ in range(reps):
                t, value = timed(fn)
                times.append(t)
            out[name] = {"median_gbps": nbytes / statistics.median(times) / GB,
                         "max_gbps": nbytes / min(times) / GB, "value": value}
    finally:
        restore()
    vals = {v["value"] for k, v in out.items() if not k.startswith("zlib")}
    if len(vals) > 1:
        print("  ! CRC32C implementations disagree:", {k: v["value"] for k, v in out.items()})
    print(f"\n== CRC32C, one core, {nbytes // MiB} MiB buffer, median of {reps}")
    for name, r in out.items():
        print(f"  {name:<40} {r['median_gbps']:7.2f} GB/s  (best {r['max_gbps']:.2f})")
    return out


def bench_memory(ctx: Context, workdir: Path) -> dict:
    """Peak extra memory of pyckpt.save and pyckpt.load(into=), against the target."""
    if pyckpt is None:
        print("\n  note: pyckpt missing, memory measurement skipped")
        return {}
    target = 64 * MiB + ctx.nbytes // 100
    out = workdir / "mem-pyckpt"
    shutil.rmtree(out, ignore_errors=True)
    results = {}
    ops = [(PYCKPT_SAVE, lambda: pyckpt.save(ctx.state, str(out))),
           (PYCKPT_INTO, lambda: pyckpt.load(str(out), into=ctx.into_numpy))]
    for name, op in ops:
        touch_ballast(ctx.nbytes)
        try:
            with PeakMemory() as pm:
                op()
        except Exception as e:
            print(f"  ! {name} failed during the memory measurement: {e}")
            continue
        results[name] = {**pm.result(), "target_bytes": target}
    shutil.rmtree(out, ignore_errors=True)

    print(f"\n== PEAK EXTRA MEMORY (over RSS before the call; target 64 MiB + 1% of state "
          f"= {target / MiB:.1f} MiB)")
    for name, r in results.items():
        rss, anon = r["peak_rss_increase_bytes"], r["peak_anon_increase_bytes"]
        verdict = "within target" if rss <= target else "OVER target"
        print(f"  {name:<22} VmRSS +{rss / MiB:8.1f} MiB   RssAnon +{anon / MiB:8.1f} MiB   "
              f"-> {verdict} ({r['samples']} samples"
              f"{', kernel HWM' if r['kernel_hwm_used'] else ''})")
    return results


# ---------------------------------------------------------------------------
# main
# ---------------------------------------------------------------------------


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--size-gb", type=float, default=1.0, help="state size in GiB (default 1)")
    p.add_argument("--rounds", type=int, default=5, help="interleaved rounds (default 5)")
    p.add_argument("--dir", default=None,
                   help="where outputs are written (default: a fresh temp dir under /tmp)")
    p.add_argument("--json", default=None, metavar="PATH", help="write all results as JSON")
    p.add_argument("--quick", action="store_true", help="smoke test: 128 MiB state, 2 rounds")
    p.add_argument("--no-cold", action="store_true", help="skip cold-cache loads")
    p.add_argument("--torch-threads", type=int, default=1, metavar="N",
                   help="torch intra-op threads for the torch peers (default 1; 0 = torch's "
                        "default). torch's OpenMP pool can spin for ~1 s inside DCP's copy_ "
                        "when it has to share few cores; its copies gain nothing from it")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    if args.quick:
        args.size_gb, args.rounds = 0.125, 2
    if args.size_gb <= 0 or args.rounds < 1:
        p.error("--size-gb must be > 0 and --rounds >= 1")
    return args


def select_formats() -> list[Format]:
    chosen = []
    for fmt in FORMATS:
        missing = [r for r in fmt.requires if MODULES.get(r) is None]
        if missing:
            print(f"note: {fmt.name} and its loads skipped: {', '.join(missing)} not importable")
            continue
        chosen.append(fmt)
    return chosen


def main(argv=None) -> int:
    args = parse_args(argv)
    workdir = make_workdir(args.dir)

    meta = machine_info(str(workdir), library_versions())
    print_machine(meta)
    formats = select_formats()
    if torch is not None:
        if args.torch_threads > 0:
            torch.set_num_threads(args.torch_threads)
        meta["machine"]["torch_intra_op_threads"] = torch.get_num_threads()
        print(f"torch   : {torch.get_num_threads()} intra-op thread(s) (--torch-threads)")

    cold = False
    if args.no_cold:
        print("cold-cache loads: skipped (--no-cold)")
    else:
        cold, why = can_drop_caches()
        print("cold-cache loads: enabled (drop_caches works)" if cold
              else f"cold-cache loads: skipped, cannot drop caches ({why})")

    t0 = time.perf_counter()
    state = build_state(int(args.size_gb * GiB), args.seed)
    info = describe_state(state)
    ctx = make_context(state)
    print(f"state   : {info['bytes'] / GiB:.3f} GiB in {info['tensors']} float32 tensors "
          f"({info['small_tensors_under_64KiB']} under 64 KiB, largest {info['largest_bytes'] / MiB:.1f} MiB, "
          f"params {info['param_bytes'] / info['bytes']:.0%} of bytes); built in "
          f"{time.perf_counter() - t0:.1f} s")
    print(f"running {args.rounds} interleaved rounds of {len(formats)} formats "
          f"(ballast of {ctx.nbytes / GiB:.2f} GiB touched before each timed operation)", flush=True)

    try:
        res = run_rounds(formats, ctx, args.rounds, workdir, cold)
        summary = summarize(res, ctx.nbytes, ratio_key="pyckpt_speedup")
        print_tables(summary, ctx.nbytes)
        if res.errors:
            print("\nfailed contenders:")
            for name, err in res.errors.items():
                print(f"  {name}: {err}")
        crc = bench_crc()
        memory = bench_memory(ctx, workdir)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)

    if args.json:
        doc = {
            **meta,
            "args": vars(args),
            "state": info,
            "cold_cache": cold,
            "seconds_per_round": res.seconds,
            "summary": summary,
            "errors": res.errors,
            "crc32c": crc,
            "memory": memory,
        }
        write_json(args.json, doc)
    return 0


if __name__ == "__main__":
    sys.exit(main())
