#!/usr/bin/env python3
"""Single-machine save/load benchmark: pyckpt against the raw I/O limit and its peers.

One run measures, on a deterministic model-like state (~1 GiB by default):

* durable SAVE: raw 2-thread pwrite+fsync limit, pyckpt.save, safetensors, torch.save,
  torch DCP (FileSystemWriter, 2 threads), np.savez; every peer is followed by an
  fsync of each file it wrote and of its directory (pyckpt.save syncs by itself);
* LOAD with a warm page cache: raw 2-thread preadv limit into new arrays and into
  preallocated ones, pyckpt.load (plus its mmap and into= variants, reported
  separately), safetensors, torch.load, DCP into preallocated tensors, np.load of the npz;
* LOAD with a cold page cache (only where /proc/sys/vm/drop_caches is writable);
* CPU time (user, system) and page faults of the raw and pyckpt warm loads;
* CRC32C throughput on one core; peak extra memory of pyckpt.save / pyckpt.load(into=).

Contenders are interleaved (every round runs each one once, in a rotating order) and
a ballast buffer the size of the state is touched and freed before every timed
operation, so that first-touch page faults of a VM do not land on one contender
(the measurement harness is in harness.py, the state in model_state.py).
See benchmarks/README.md for how to read the output.
"""

from __future__ import annotations

import dataclasses
import gc
import os
import resource
import shutil
import statistics
import sys
import time
import warnings
import zlib
from pathlib import Path
from typing import Callable

import numpy as np

from harness import (GiB, MiB, RAW_THREADS, Column, Group, PeakMemory, RawFiles, Results, Scratch,
                     can_drop_caches, drop_caches,
                     Step, apply_torch_threads, fsync_path, import_pyckpt, kind_column,
                     machine_header, make_workdir, name_column, optional_import, parse, parser,
                     print_errors, print_plan, print_table, raw_pwrite, run_interleaved,
                     run_threads, state_text, summarize, throughput, throughput_columns, timed,
                     touch_ballast, verify_tree, version_of, write_report,
                     zero_first_round)
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


def _preadv_all(fd: int, view: memoryview, offset: int) -> None:
    while view:
        n = os.preadv(fd, [view], offset)
        if n == 0:
            raise EOFError("short file")
        view, offset = view[n:], offset + n


def raw_save(state, out: Path, ctx) -> RawFiles:
    return raw_pwrite(state, out, RAW_THREADS)  # harness.py: 2 threads pwrite + fsync


def raw_load(h: RawFiles, ctx) -> dict[str, np.ndarray]:
    # Allocate every array up front in the calling thread (as a library would, and so
    # that the arrays do not land in per-thread malloc arenas), then read in parallel.
    out = {key: np.empty(shape, dtype) for plan in h.plans for key, _, shape, dtype in plan}

    def read_part(i: int) -> None:
        fd = os.open(h.files[i], os.O_RDONLY)
        try:
            for key, offset, _, _ in h.plans[i]:
                _preadv_all(fd, memoryview(out[key]).cast("B"), offset)
        finally:
            os.close(fd)

    run_threads(read_part, RAW_THREADS)
    return out


def raw_load_into(h: RawFiles, ctx) -> dict[str, np.ndarray]:
    # The same reads into the preallocated, touched buffers of the into= loads: the limit
    # of pyckpt.load(into=), which allocates nothing and takes no first-touch faults.
    def read_part(i: int) -> None:
        fd = os.open(h.files[i], os.O_RDONLY)
        try:
            for key, offset, _, _ in h.plans[i]:
                _preadv_all(fd, memoryview(ctx.into_numpy[key]).cast("B"), offset)
        finally:
            os.close(fd)

    run_threads(read_part, RAW_THREADS)
    return ctx.into_numpy


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
RAW_LOAD = "raw preadv limit"
RAW_INTO = "raw preadv limit (into)"


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
           [LoadSpec(RAW_LOAD, raw_load, compare_to=PYCKPT_LOAD, cold=True),
            LoadSpec(RAW_INTO, raw_load_into, kind="into", compare_to=PYCKPT_INTO)],
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
    into_numpy: dict[str, np.ndarray]   # preallocated, touched, page-aligned buffers (into=)
    torch_tensors: dict | None = None   # torch.from_numpy views of the state
    into_torch: dict | None = None      # torch views of into_numpy (DCP loads into them)


PAGE = 4096


def page_aligned_like(arrays: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Zeroed buffers shaped like ``arrays``, every page touched now (not inside a timed load),
    each starting at a page boundary: a buffer from plain np.empty often starts 16 bytes past
    one, where the kernel's copy from the page cache is 4K-aliased and several times slower
    on some CPUs (README, "Fresh-array loads"), which would make a poor limit."""
    out = {}
    for k, a in arrays.items():
        raw = np.empty(a.nbytes + PAGE, dtype=np.uint8)
        start = -raw.ctypes.data % PAGE
        b = raw[start:start + a.nbytes].view(a.dtype).reshape(a.shape)
        b.fill(0)
        out[k] = b
    return out


def aliased_fraction(h: RawFiles, arrays: dict[str, np.ndarray]) -> float:
    """Share of the bytes that the raw limit read with a 4K-aliased copy: destination 1-63
    bytes past the file offset, modulo 4 KiB."""
    bad = total = 0
    for plan in h.plans:
        for key, offset, _, _ in plan:
            a = arrays[key]
            total += a.nbytes
            if 0 < (a.ctypes.data - offset) % PAGE < 64:
                bad += a.nbytes
    return bad / total if total else 0.0


def make_context(state: dict[str, np.ndarray]) -> Context:
    into = page_aligned_like(state)
    ctx = Context(state, sum(a.nbytes for a in state.values()), into)
    if torch is not None:
        ctx.torch_tensors = {k: torch.from_numpy(a) for k, a in state.items()}
        ctx.into_torch = {k: torch.from_numpy(a) for k, a in into.items()}
    return ctx


# ---------------------------------------------------------------------------
# measurement
# ---------------------------------------------------------------------------


PHASES = ("save", "load (warm cache)", "load (cold cache)")


def format_group(fmt: Format, ctx: Context, scratch: Scratch, cold: bool) -> Group:
    """One format's save, its warm-cache loads (the first reads the files once before its
    ballast), then its cold-cache loads (page cache dropped after the ballast); the saved
    output is removed after the group. Round 1's warm loads are checked against the state."""
    handles: dict = {}

    def save():
        handles["h"] = fmt.save(ctx.state, scratch[fmt.name], ctx)
        return handles["h"]

    def prepare_for(first: bool, into: bool):
        def prepare(rnd: int) -> None:
            if first:
                warm_read(scratch[fmt.name])
            if into:  # buffers are shared: clear what a peer left before the checked round
                zero_first_round(ctx.into_numpy)(rnd)
        return prepare

    def load(ls: LoadSpec):
        return lambda: ls.fn(handles["h"], ctx)

    meta = {"limit": fmt.is_limit, "pyckpt": fmt.is_pyckpt}
    steps = [Step(fmt.name, "save", save,
                  meta={**meta, "compare_to": None if fmt.is_pyckpt else PYCKPT_SAVE})]
    steps += [Step(ls.name, "load (warm cache)", load(ls),
                   prepare=prepare_for(i == 0, ls.kind == "into"),
                   check=lambda r: verify_tree(r, ctx.state), required=False,
                   meta={**meta, "kind": ls.kind, "compare_to": ls.compare_to})
              for i, ls in enumerate(fmt.loads)]
    if cold:
        steps += [Step(ls.name + " [cold]", "load (cold cache)", load(ls),
                       after_ballast=drop_caches, required=False,
                       meta={**meta, "kind": ls.kind,
                             "compare_to": ls.compare_to and ls.compare_to + " [cold]"})
                  for ls in fmt.loads if ls.cold]
    hooks = scratch.hooks(fmt.name, fmt.name.replace(' ', '_').replace('.', '_'))
    return Group(fmt.name, steps, **hooks)


def run_rounds(formats: list[Format], ctx: Context, rounds: int, workdir: Path,
               cold: bool) -> Results:
    scratch = Scratch(lambda rnd, slug: workdir / f"r{rnd}-{slug}",
                      lambda path: shutil.rmtree(path, ignore_errors=True))
    return run_interleaved([format_group(f, ctx, scratch, cold) for f in formats], rounds,
                           ctx.nbytes, Results(PHASES))


# ---------------------------------------------------------------------------
# summary
# ---------------------------------------------------------------------------


def _fmt_fraction(n: str, s: dict) -> str:
    return f"{s['fraction_of_limit']:.2f}" if s.get("fraction_of_limit") else "-"


def _fmt_speedup(n: str, s: dict) -> str:
    return f"{s['pyckpt_speedup']:.2f}x" if "pyckpt_speedup" in s else "-"


TABLE_COLUMNS = [name_column(28), kind_column(6), *throughput_columns(),
                 Column("vs limit", 9, _fmt_fraction), Column("pyckpt x", 9, _fmt_speedup)]


def print_tables(summary: dict, nbytes: int) -> None:
    for phase, block in summary.items():
        print_table(f"== {phase.upper()}  ({nbytes / GiB:.3f} GiB state; GB/s = 1e9 bytes/s; "
                    f"limit = {block['limit'] or 'n/a'})", block["contenders"], TABLE_COLUMNS,
                    pairs="per-round pairs (peer time / pyckpt time in the same round; > 1 = "
                          "pyckpt faster):")


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
            t = throughput(times, nbytes)
            out[name] = {"median_gbps": t["median_gbps"], "max_gbps": t["max_gbps"], "value": value}
    finally:
        restore()
    vals = {v["value"] for k, v in out.items() if not k.startswith("zlib")}
    if len(vals) > 1:
        print("  ! CRC32C implementations disagree:", {k: v["value"] for k, v in out.items()})
    print(f"\n== CRC32C, one core, {nbytes // MiB} MiB buffer, median of {reps}")
    for name, r in out.items():
        print(f"  {name:<40} {r['median_gbps']:7.2f} GB/s  (best {r['max_gbps']:.2f})")
    return out


def _rusage() -> tuple[float, float, int]:
    ru = resource.getrusage(resource.RUSAGE_SELF)  # every thread of this process
    return ru.ru_utime, ru.ru_stime, ru.ru_minflt


def bench_load_cpu(ctx: Context, workdir: Path, reps: int) -> dict:
    """Where the warm loads spend their time: wall, CPU (user and system, all threads) and
    minor page faults of the raw limits and of pyckpt's loads, medians of ``reps``
    interleaved rounds (ballast before each). The raw limits verify nothing: pyckpt's extra
    user time is its CRC-32C check; faults (and the system time they cost) come from first
    touches of new arrays, which the fresh loads take and the into= loads do not."""
    if pyckpt is None:
        print("\n  note: pyckpt missing, CPU-time breakdown skipped")
        return {}
    raw_dir, ck_dir = workdir / "cpu-raw", workdir / "cpu-pyckpt"
    for d in (raw_dir, ck_dir):
        shutil.rmtree(d, ignore_errors=True)
    try:
        raw = raw_save(ctx.state, raw_dir, ctx)
        pyckpt.save(ctx.state, str(ck_dir))
        warm_read(workdir)
        ops = {RAW_LOAD: lambda: raw_load(raw, ctx), PYCKPT_LOAD: lambda: pyckpt_load(ck_dir, ctx),
               RAW_INTO: lambda: raw_load_into(raw, ctx),
               PYCKPT_INTO: lambda: pyckpt_load_into(ck_dir, ctx)}
        rows: dict[str, list[tuple[float, float, float, int]]] = {n: [] for n in ops}
        aliased: dict[str, list[float]] = {RAW_LOAD: [], RAW_INTO: []}
        for rnd in range(reps):
            for name in list(ops)[rnd % len(ops):] + list(ops)[:rnd % len(ops)]:
                touch_ballast(ctx.nbytes)
                gc.collect()
                gc.disable()
                try:
                    u0, s0, f0 = _rusage()
                    t0 = time.perf_counter()
                    out = ops[name]()
                    t = time.perf_counter() - t0
                    u1, s1, f1 = _rusage()
                finally:
                    gc.enable()
                if name in aliased:
                    aliased[name].append(aliased_fraction(raw, out))
                del out
                rows[name].append((t, u1 - u0, s1 - s0, f1 - f0))
    finally:
        for d in (raw_dir, ck_dir):
            shutil.rmtree(d, ignore_errors=True)
    out = {}
    for name, v in rows.items():
        wall, user, sys_, faults = (statistics.median(x[i] for x in v) for i in range(4))
        out[name] = {"median_s": wall, "user_s": user, "sys_s": sys_, "cpu_s": user + sys_,
                     "minor_faults": faults, "rounds": v}
        if name in aliased:
            out[name]["aliased_fraction"] = statistics.median(aliased[name])
    print(f"\n== WARM LOAD CPU TIME (every thread of the process; medians of {reps} rounds; the "
          "raw limits verify nothing, pyckpt checks every CRC-32C)")
    print(f"  {'contender':<28} {'wall s':>8} {'user s':>8} {'sys s':>8} {'cpu s':>8} "
          f"{'faults':>8} {'aliased':>8}")
    for name, r in out.items():
        al = f"{r['aliased_fraction']:.0%}" if "aliased_fraction" in r else "-"
        print(f"  {name:<28} {r['median_s']:8.3f} {r['user_s']:8.3f} {r['sys_s']:8.3f} "
              f"{r['cpu_s']:8.3f} {r['minor_faults']:8.0f} {al:>8}")
    print("  aliased: share of the raw limit's bytes copied 4K-aliased (slow on some CPUs; pyckpt "
          "reads such destinations through scratch memory)")
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
    p = parser(__doc__.split("\n\n")[0], torch_threads_help=(
        "torch intra-op threads for the torch peers (default 1; 0 = torch's default). torch's "
        "OpenMP pool can spin for ~1 s inside DCP's copy_ when it has to share few cores; its "
        "copies gain nothing from it"))
    p.add_argument("--no-cold", action="store_true", help="skip cold-cache loads")
    return parse(p, argv, quick={"size_gb": 0.125, "rounds": 2})


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

    meta = machine_header(str(workdir), library_versions())
    formats = select_formats()
    if torch is not None:
        apply_torch_threads(torch, args.torch_threads)
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
    params = f", params {info['param_bytes'] / info['bytes']:.0%} of bytes"
    print(f"state   : {state_text(info, extra=params)}; built in {time.perf_counter() - t0:.1f} s")
    print_plan(args.rounds, ctx.nbytes, f"{len(formats)} formats")

    try:
        res = run_rounds(formats, ctx, args.rounds, workdir, cold)
        summary = summarize(res, ctx.nbytes, ratio_key="pyckpt_speedup")
        print_tables(summary, ctx.nbytes)
        print_errors(res.errors)
        load_cpu = bench_load_cpu(ctx, workdir, max(args.rounds, 5))
        crc = bench_crc()
        memory = bench_memory(ctx, workdir)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)

    write_report(args.json, meta, args, state=info, cold_cache=cold, seconds_per_round=res.seconds,
                 summary=summary, errors=res.errors, load_cpu=load_cpu, crc32c=crc,
                 memory=memory)
    return 0


if __name__ == "__main__":
    sys.exit(main())
