"""Reusable measurement harness of pyckpt's benchmarks (see benchmarks/README.md, "Method").

* header: :func:`import_pyckpt`, :func:`optional_import`, :func:`machine_info`, :func:`print_machine`;
* first touch and memory: :func:`touch_ballast`, :class:`PeakMemory`;
* threads: :func:`split_balanced`, :func:`run_threads`;
* rounds: :func:`timed`, :class:`Results`, :func:`run_contender`, :func:`rotated`, and
  :func:`run_interleaved` (groups of steps, the order rotating each round);
* summary: :func:`summarize`, :func:`print_table` (:class:`Column`), :func:`print_pairs`,
  :func:`write_json`.
"""

from __future__ import annotations

import dataclasses
import gc
import importlib
import json
import os
import platform
import statistics
import sys
import threading
import time
from pathlib import Path
from typing import Any, Callable

import numpy as np

GB = 1e9  # throughput unit: 10**9 bytes per second
MiB = 1 << 20
GiB = 1 << 30

# --- environment -----------------------------------------------------------


def import_pyckpt():
    """pyckpt as installed, else from the repository this file lives in; None if neither."""
    try:
        return importlib.import_module("pyckpt")
    except ImportError:
        sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
        try:
            return importlib.import_module("pyckpt")
        except ImportError:
            return None


def optional_import(name: str):
    """The module, or None when it is missing or broken (a broken install counts as missing)."""
    try:
        return importlib.import_module(name)
    except Exception:
        return None


def version_of(mod) -> str | None:
    return None if mod is None else str(getattr(mod, "__version__", "unknown"))


def _proc_field(path: str, prefix: str) -> str | None:
    """The rest of the first line of ``path`` starting with ``prefix`` (None if absent)."""
    try:
        with open(path) as f:
            return next((line[len(prefix):].strip() for line in f if line.startswith(prefix)), None)
    except OSError:
        return None


def _filesystem_of(path: str) -> str:
    """Mount point and type of the filesystem holding ``path`` (from /proc/mounts)."""
    best = ("?", "?")
    try:
        real = os.path.realpath(path)
        with open("/proc/mounts") as f:
            for line in f:
                parts = line.split()
                mnt, fstype = parts[1], parts[2]
                if (real == mnt or real.startswith(mnt.rstrip("/") + "/")) and len(mnt) >= len(best[0]):
                    best = (mnt, fstype)
    except (OSError, IndexError):
        pass
    return f"{best[1]} on {best[0]}"


def usable_cpus() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


def machine_info(bench_dir: str, versions: dict[str, str | None]) -> dict:
    """``{"machine": ..., "versions": ...}``; ``versions`` (name -> version or None for
    missing) follows python and numpy."""
    model, mem = _proc_field("/proc/cpuinfo", "model name"), _proc_field("/proc/meminfo", "MemTotal:")
    info = {"nproc": os.cpu_count(), "usable_cpus": usable_cpus(),
            "cpu_model": (model or ":").split(":", 1)[1].strip() or platform.processor() or "unknown",
            "mem_total_gib": int(mem.split()[0]) * 1024 / GiB if mem else None,
            "kernel": platform.release(), "bench_dir": bench_dir, "filesystem": _filesystem_of(bench_dir)}
    return {"machine": info,
            "versions": {"python": platform.python_version(), "numpy": np.__version__, **versions}}


def make_workdir(dir_arg: str | None) -> Path:
    """A fresh working directory: a temp dir under /tmp, or a new one inside --dir."""
    import tempfile

    if dir_arg is None:
        return Path(tempfile.mkdtemp(prefix="pyckpt-bench-", dir="/tmp"))
    base = Path(dir_arg)
    base.mkdir(parents=True, exist_ok=True)
    return Path(tempfile.mkdtemp(prefix="pyckpt-bench-", dir=base))


def print_machine(meta: dict) -> None:
    m, v = meta["machine"], meta["versions"]
    print(f"machine : {m['cpu_model']}, nproc={m['nproc']} (usable {m['usable_cpus']}), "
          f"{m['mem_total_gib']:.1f} GiB RAM, kernel {m['kernel']}")
    print(f"dir     : {m['bench_dir']} ({m['filesystem']})")
    print("versions: " + ", ".join(f"{k}={'MISSING' if val is None else val}" for k, val in v.items()))


# --- first-touch ballast and peak memory ----------------------------------


def touch_ballast(nbytes: int) -> None:
    """Allocate, touch every page of, and free ``nbytes``: later allocations of the
    same size reuse guest pages the host has already backed (no first-touch faults)."""
    ballast = np.ones(nbytes, dtype=np.uint8)
    del ballast


def _proc_status_kib(*fields: str) -> dict[str, int]:
    out = {}
    with open("/proc/self/status") as f:
        for line in f:
            key = line.split(":", 1)[0]
            if key in fields:
                out[key] = int(line.split()[1])
    return out


class PeakMemory:
    """Context manager: peak increase of VmRSS / RssAnon over the value at entry.

    A thread samples /proc/self/status every ``interval`` seconds; in addition the
    kernel's own high-water mark (VmHWM) is reset at entry through
    /proc/self/clear_refs when allowed, so a peak between two samples is not missed.
    """

    def __init__(self, interval: float = 0.002):
        self.interval = interval
        self._stop = threading.Event()
        self.samples = 0

    def __enter__(self):
        gc.collect()
        base = _proc_status_kib("VmRSS", "RssAnon")
        self.base_rss, self.base_anon = base["VmRSS"], base.get("RssAnon", 0)
        self.peak_rss, self.peak_anon = self.base_rss, self.base_anon
        try:
            with open("/proc/self/clear_refs", "w") as f:
                f.write("5")  # reset VmHWM to the current RSS
            self.hwm_reset = True
        except OSError:
            self.hwm_reset = False
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        return self

    def _sample(self):
        s = _proc_status_kib("VmRSS", "RssAnon")
        self.peak_rss = max(self.peak_rss, s["VmRSS"])
        self.peak_anon = max(self.peak_anon, s.get("RssAnon", 0))
        self.samples += 1

    def _run(self):
        while not self._stop.wait(self.interval):
            self._sample()

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()
        self._sample()
        if self.hwm_reset:
            self.peak_rss = max(self.peak_rss, _proc_status_kib("VmHWM")["VmHWM"])
        return False

    def result(self) -> dict:
        return {
            "peak_rss_increase_bytes": (self.peak_rss - self.base_rss) * 1024,
            "peak_anon_increase_bytes": (self.peak_anon - self.base_anon) * 1024,
            "samples": self.samples,
            "kernel_hwm_used": self.hwm_reset,
        }


# --- parallel helpers ------------------------------------------------------


def split_balanced(arrays: dict[str, np.ndarray], parts: int) -> list[list[str]]:
    """Partition keys into ``parts`` lists of about equal bytes (largest first, greedy)."""
    bins: list[list[str]] = [[] for _ in range(parts)]
    load = [0] * parts
    for key in sorted(arrays, key=lambda k: arrays[k].nbytes, reverse=True):
        i = load.index(min(load))
        bins[i].append(key)
        load[i] += arrays[key].nbytes
    return bins


def run_threads(fn: Callable[[int], Any], n: int) -> list:
    """``[fn(0), .., fn(n-1)]`` run in ``n`` threads; re-raises the first exception."""
    results: list = [None] * n
    errors: list = []

    def wrap(i):
        try:
            results[i] = fn(i)
        except BaseException as e:  # re-raised in the caller
            errors.append(e)

    threads = [threading.Thread(target=wrap, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]
    return results


# --- measurement -----------------------------------------------------------


def timed(fn: Callable, *args) -> tuple[float, Any]:
    """``(seconds, fn(*args))``: perf_counter around the call only, gc off during it."""
    gc.collect()
    gc.disable()
    try:
        t0 = time.perf_counter()
        result = fn(*args)
        seconds = time.perf_counter() - t0
    finally:
        gc.enable()
    return seconds, result


def rotated(items: list, rnd: int) -> list:
    """``items`` rotated left by ``rnd`` (round ``rnd``'s order)."""
    k = rnd % len(items) if items else 0
    return items[k:] + items[:k]


class Results:
    """``seconds[phase][contender]`` = per-round times (None where it failed), ``errors``
    (contender -> message) and ``meta`` (contender -> phase, kind, limit, compare_to, ...)."""

    def __init__(self, phases: tuple[str, ...] = ()):
        self.seconds: dict[str, dict[str, list]] = {p: {} for p in phases}
        self.errors: dict[str, str] = {}
        self.meta: dict[str, dict] = {}

    def add(self, phase, name, rnd, seconds):
        row = self.seconds.setdefault(phase, {}).setdefault(name, [])
        row.extend([None] * (rnd + 1 - len(row)))
        row[rnd] = seconds


def run_contender(results: Results, phase: str, name: str, rnd: int, fn: Callable, *args,
                  check: Callable | None = None):
    """Times one call; a failure disables the contender instead of ending the run."""
    if name in results.errors:
        return None
    try:
        seconds, out = timed(fn, *args)
        if check is not None:
            check(out)
    except Exception as e:  # keep going: report the failure at the end
        results.errors[name] = f"{type(e).__name__}: {e}"
        print(f"    ! {name} failed: {results.errors[name]} -- skipped from now on")
        return None
    results.add(phase, name, rnd, seconds)
    return out


@dataclasses.dataclass
class Step:
    """One timed call. ``prepare(rnd)`` runs untimed before the ballast; ``check(result)``
    runs untimed on round 0's result. ``meta`` goes to Results.meta (see summarize)."""
    name: str
    phase: str
    fn: Callable[[], Any]
    prepare: Callable[[int], None] | None = None
    check: Callable[[Any], None] | None = None
    meta: dict = dataclasses.field(default_factory=dict)


@dataclasses.dataclass
class Group:
    """Steps that run together, in order, within a round (e.g. a save, then its load).
    ``setup`` / ``teardown`` (untimed, given the round) run around them."""
    name: str
    steps: list[Step]
    setup: Callable[[int], None] | None = None
    teardown: Callable[[int], None] | None = None


def run_interleaved(groups: list[Group], rounds: int, ballast_bytes: int,
                    results: Results | None = None, verbose: bool = True) -> Results:
    """Every round runs every group once, the order rotating by one each round; a
    ballast of ``ballast_bytes`` is touched before every timed step. A failed step
    disables that contender and skips the rest of its group for the round."""
    res = results if results is not None else Results()
    for g in groups:
        for s in g.steps:
            res.meta[s.name] = {"phase": s.phase, **s.meta}
    for rnd in range(rounds):
        order = rotated(groups, rnd)
        t_round = time.perf_counter()
        for g in order:
            if g.setup is not None:
                g.setup(rnd)
            try:
                for s in g.steps:
                    if s.name in res.errors:
                        break
                    if s.prepare is not None:
                        s.prepare(rnd)
                    touch_ballast(ballast_bytes)
                    out = run_contender(res, s.phase, s.name, rnd, s.fn,
                                        check=s.check if rnd == 0 else None)
                    del out
                    if s.name in res.errors:
                        break
            finally:
                gc.collect()
                if g.teardown is not None:
                    g.teardown(rnd)
        if verbose:
            print(f"  round {rnd + 1}/{rounds} done in {time.perf_counter() - t_round:.1f} s "
                  f"(order: {', '.join(g.name for g in order)})", flush=True)
    return res


# --- summary ---------------------------------------------------------------


def summarize(res: Results, nbytes: int, ratio_key: str = "ratio") -> dict:
    """Per phase: ``{"limit": name, "contenders": {name: stats}}``.

    stats: median_s, median/min/max GB/s (``nbytes`` / time), rounds, the contender's
    meta, ``fraction_of_limit`` (limit's median time / own, against the phase's row with
    meta ``limit``), and, for a contender with meta ``compare_to``, ``stats[ratio_key]``
    with ``pair_ratios`` (per round) and ``pair_ratio_median``. The ratio is own time /
    reference time, or reference / own (a throughput fraction) with meta ``speed_ratio``.
    """
    summary: dict[str, dict] = {}
    for phase, rows in res.seconds.items():
        if not rows:
            continue
        stats = {}
        for name, secs in rows.items():
            v = [x for x in secs if x is not None]
            if not v:
                continue
            stats[name] = {
                "median_s": statistics.median(v),
                "median_gbps": nbytes / statistics.median(v) / GB,
                "min_gbps": nbytes / max(v) / GB,
                "max_gbps": nbytes / min(v) / GB,
                "rounds": len(v),
                **{k: val for k, val in res.meta.get(name, {}).items() if k != "phase"},
            }
        limit = next((n for n in stats if stats[n].get("limit")), None)
        for name, s in stats.items():
            s["fraction_of_limit"] = (stats[limit]["median_s"] / s["median_s"]) if limit else None
            ref = s.get("compare_to")
            if ref and ref in stats:
                speed = bool(s.get("speed_ratio"))
                own, other = s["median_s"], stats[ref]["median_s"]
                s[ratio_key] = other / own if speed else own / other
                pairs = [(q / p if speed else p / q) for p, q in zip(rows[name], rows[ref])
                         if p is not None and q is not None]
                if pairs:
                    s["pair_ratios"] = pairs
                    s["pair_ratio_median"] = statistics.median(pairs)
        summary[phase] = {"limit": limit, "contenders": stats}
    return summary


@dataclasses.dataclass
class Column:
    """A table column: ``cell(name, stats)`` gives the text, padded to ``width``."""
    header: str
    width: int
    cell: Callable[[str, dict], str]
    left: bool = False

    def fmt(self, text: str) -> str:
        return f"{text:<{self.width}}" if self.left else f"{text:>{self.width}}"


def name_column(width: int = 28) -> Column:
    return Column("contender", width, lambda n, s: n, left=True)


def throughput_columns() -> list[Column]:
    """median GB/s, min, max (slowest / fastest round) and median s."""
    return [Column("median GB/s", 11, lambda n, s: f"{s['median_gbps']:.2f}"),
            Column("min", 7, lambda n, s: f"{s['min_gbps']:.2f}"),
            Column("max", 7, lambda n, s: f"{s['max_gbps']:.2f}"),
            Column("median s", 9, lambda n, s: f"{s['median_s']:.3f}")]


def print_table(title: str, stats: dict[str, dict], columns: list[Column]) -> None:
    """A blank line, ``title``, then one row per contender of ``stats`` (indented 2)."""
    print(f"\n{title}")
    hdr = "  " + " ".join(c.fmt(c.header) for c in columns)
    print(hdr)
    print("  " + "-" * (len(hdr) - 2))
    for name, s in stats.items():
        print("  " + " ".join(c.fmt(c.cell(name, s)) for c in columns))


def print_pairs(stats: dict[str, dict], caption: str, name_width: int = 26,
                ref_width: int = 24) -> None:
    """The per-round pair ratios of every contender that has them, under ``caption``."""
    pairs = {n: s for n, s in stats.items() if "pair_ratios" in s}
    if not pairs:
        return
    print(f"  {caption}")
    for name, s in pairs.items():
        rs = ", ".join(f"{r:.2f}" for r in s["pair_ratios"])
        print(f"    {name:<{name_width}} vs {s['compare_to']:<{ref_width}} "
              f"median {s['pair_ratio_median']:.2f}x  [{rs}]")


def write_json(path: str, doc: dict) -> None:
    with open(path, "w") as f:
        json.dump(doc, f, indent=2, default=str)
    print(f"\nJSON written to {path}")
