"""Reusable measurement harness of pyckpt's benchmarks (see benchmarks/README.md, "Method").

* command line: :func:`parser` (the options every script shares), :func:`parse` (``--quick``
  overrides and range checks);
* other revisions: :func:`tree_at` / :func:`remove_tree` (a checkout of a revision with this
  install's compiled core), :data:`TREE_PRELUDE` (code that imports pyckpt from such a tree,
  also under an editable install), :func:`tree_env` (the environment under which every Python
  process, launched workers included, runs the prelude);
* header: :func:`import_pyckpt`, :func:`optional_import`, :func:`dist_version`,
  :func:`machine_info`, :func:`machine_header`, :func:`pyckpt_header`, :func:`no_pyckpt`,
  :func:`state_text`, :func:`print_plan`, :func:`make_workdir`;
* first touch and memory: :func:`touch_ballast`, :func:`touched_like`, :func:`zero_first_round`,
  :class:`PeakMemory`;
* threads and raw I/O: :func:`split_balanced`, :func:`run_threads`, :class:`ParallelCopy` (the
  memcpy limit), :func:`raw_pwrite` (the durable write limit), :func:`fsync_path`;
* rounds: :func:`timed`, :class:`Results`, :func:`run_contender`, :func:`rotated`, and
  :func:`run_interleaved` (groups of steps, the order rotating each round; :func:`solo` for a
  one-step group, :class:`Scratch` for a fresh location per group and round); :func:`verify_tree`;
* summary: :func:`median_of`, :func:`throughput`, :func:`compare` (ratio of medians and
  per-round pairs), :func:`summarize`, :func:`print_table` (:class:`Column`, with
  :func:`throughput_columns`, :func:`seconds_columns`, :func:`ratio_column`,
  :func:`target_column`), :func:`print_pairs`, :func:`targets_of` / :func:`print_targets`,
  :func:`print_errors`, :func:`write_json` / :func:`write_report`.
"""

from __future__ import annotations

import argparse
import dataclasses
import gc
import importlib
import json
import operator
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


#: Code to run first in a subprocess measuring another revision: with the environment
#: variable ``PYCKPT_BENCH_TREE`` set (a ``tree_at`` checkout), pyckpt is imported from
#: there. An editable install's import hook takes precedence over ``PYTHONPATH``: it is
#: removed first, and the import is checked, so that two "revisions" can never quietly
#: be the same code.
TREE_PRELUDE = """
import os as _os, sys as _sys
_tree = _os.environ.get("PYCKPT_BENCH_TREE")
if _tree:
    _sys.meta_path[:] = [f for f in _sys.meta_path
                         if "editable" not in getattr(type(f), "__module__", "").lower()]
    _sys.path.insert(0, _tree)
    import pyckpt as _p
    if not _os.path.abspath(_p.__file__).startswith(_os.path.abspath(_tree) + _os.sep):
        raise SystemExit(f"pyckpt was imported from {_p.__file__}, not from {_tree}")
"""


def tree_at(rev: str, where: Path) -> Path:
    """A checkout (git worktree) of ``rev`` at ``where`` with this install's compiled
    core beside its sources: the C++ core is the same, the Python code is ``rev``'s.
    Run code there with :data:`TREE_PRELUDE` and ``PYCKPT_BENCH_TREE=where``."""
    import shutil
    import subprocess

    import pyckpt._native as native

    root = Path(__file__).resolve().parent.parent
    remove_tree(where)
    subprocess.run(["git", "-C", str(root), "worktree", "add", "--detach", "-f", str(where), rev],
                   check=True, capture_output=True)
    shutil.copy(native.core.__file__, where / "pyckpt")
    return where


def tree_env(where: Path, env: dict | None = None) -> dict:
    """``env`` (default: this process's environment) changed so that every Python process
    started with it, and every process those start (torchrun or mpiexec workers), imports
    pyckpt from the :func:`tree_at` checkout ``where``: ``PYCKPT_BENCH_TREE=where`` and a
    ``sitecustomize.py`` holding :data:`TREE_PRELUDE` (written to ``where/.bench-site``) first
    on ``PYTHONPATH``. A process whose pyckpt would come from elsewhere exits at start-up."""
    site = where / ".bench-site"
    site.mkdir(exist_ok=True)
    guarded = "try:\n" + "".join(f"    {line}\n" for line in TREE_PRELUDE.strip().splitlines())
    (site / "sitecustomize.py").write_text(
        guarded + "except BaseException as _e:  # site.py would swallow an Exception\n"
        "    import os as _o, sys as _s\n"
        "    _s.stderr.write(f'PYCKPT_BENCH_TREE: {type(_e).__name__}: {_e}\\n')\n"
        "    _s.stderr.flush()\n"
        "    _o._exit(3)\n")
    out = dict(os.environ if env is None else env, PYCKPT_BENCH_TREE=str(where))
    out["PYTHONPATH"] = os.pathsep.join([str(site)] + [p for p in [out.get("PYTHONPATH")] if p])
    return out


def remove_tree(where: Path) -> None:
    """Removes a :func:`tree_at` checkout (and its worktree entry), if there is one."""
    import shutil
    import subprocess

    root = Path(__file__).resolve().parent.parent
    subprocess.run(["git", "-C", str(root), "worktree", "remove", "--force", str(where)],
                   capture_output=True)
    shutil.rmtree(where, ignore_errors=True)


def median_best(fn: Callable[[], Any], reps: int) -> tuple[float, float]:
    """(median, best) seconds of ``reps`` calls of ``fn``, after one call not timed."""
    fn()
    ts = []
    for _ in range(reps):
        t = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t)
    return statistics.median(ts), min(ts)


def copy_rows(med: Callable[[Callable[[], Any]], Any], src: Any, dst: Any, a: list, b: list,
              copy_src: Any = None, copy_dst: Any = None) -> tuple[dict, Any]:
    """The in-memory copy timings of bench_copy_cost and bench_walks, each ``med(fn)``:
    ``torch._foreach_copy_`` of tensors ``a`` into ``b`` (the limit), ``copy_state``
    (of ``copy_src`` into ``copy_dst``; default the two Checkpoints), ``snapshot()``,
    ``snapshot(into=)`` and ``restore(snapshot)`` of Checkpoints ``src`` and ``dst``;
    (the rows, the snapshot restored)."""
    import pyckpt
    import torch

    def foreach() -> None:
        with torch.no_grad():
            torch._foreach_copy_(b, a)

    cs, cd = (src, dst) if copy_src is None else (copy_src, copy_dst)
    row = {"foreach": med(foreach), "copy_state": med(lambda: pyckpt.copy_state(cs, cd)),
           "snapshot()": med(lambda: src.snapshot())}
    snap = src.snapshot()
    row["snapshot(into=)"] = med(lambda: src.snapshot(into=snap))
    row["restore(snapshot)"] = med(lambda: dst.restore(snap))
    return row, snap


def against(before: str | None, rounds: int, measure: Callable[[Path | None], dict],
            prefix: str) -> dict[str, list[dict]]:
    """``measure(tree)`` for this tree (None) and, with ``before``, a :func:`tree_at`
    checkout of that revision, ``rounds`` times, the order alternating each round;
    ``{"this tree": [results], before: [results]}``. The checkout is removed after."""
    import tempfile

    work = Path(tempfile.mkdtemp(prefix=prefix))
    trees: dict[str, Path | None] = {"this tree": None}
    if before:
        trees[before] = tree_at(before, work / "before")
    runs: dict[str, list[dict]] = {k: [] for k in trees}
    try:
        for r in range(rounds):
            for label, tree in list(trees.items())[::1 if r % 2 == 0 else -1]:
                runs[label].append(measure(tree))
            print(f"round {r + 1}/{rounds} done", flush=True)
    finally:
        if before:
            remove_tree(work / "before")
    return runs


def child_json(code: str, argv: list[str], tree: Path | None, env: dict | None = None) -> dict:
    """The JSON of the last line ``code`` prints, run with :data:`TREE_PRELUDE` in a
    new Python process (pyckpt from ``tree``'s checkout where given) in the temporary
    directory; RuntimeError with its stderr when it fails."""
    import subprocess
    import tempfile

    env = dict(os.environ if env is None else env)
    if tree is not None:
        env["PYCKPT_BENCH_TREE"] = str(tree)
    r = subprocess.run([sys.executable, "-c", TREE_PRELUDE + code, *argv], capture_output=True,
                       text=True, env=env, cwd=tempfile.gettempdir(), timeout=1800)
    if r.returncode:
        raise RuntimeError(r.stderr[-3000:])
    return json.loads(r.stdout.strip().splitlines()[-1])


def optional_import(name: str):
    """The module, or None when it is missing or broken (a broken install counts as missing)."""
    try:
        return importlib.import_module(name)
    except Exception:
        return None


def version_of(mod) -> str | None:
    return None if mod is None else str(getattr(mod, "__version__", "unknown"))


def dist_version(name: str) -> str | None:
    """The installed version of the distribution ``name`` (without importing it), or None."""
    try:
        from importlib.metadata import version

        return version(name)
    except Exception:  # noqa: BLE001 - missing or broken counts as missing
        return None


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


def make_workdir(dir_arg: str | None, prefix: str = "pyckpt-bench-") -> Path:
    """A fresh working directory: a temp dir under /tmp, or a new one inside --dir."""
    import tempfile

    if dir_arg is None:
        return Path(tempfile.mkdtemp(prefix=prefix, dir="/tmp"))
    base = Path(dir_arg)
    base.mkdir(parents=True, exist_ok=True)
    return Path(tempfile.mkdtemp(prefix=prefix, dir=base))


def print_machine(meta: dict) -> None:
    m, v = meta["machine"], meta["versions"]
    print(f"machine : {m['cpu_model']}, nproc={m['nproc']} (usable {m['usable_cpus']}), "
          f"{m['mem_total_gib']:.1f} GiB RAM, kernel {m['kernel']}")
    print(f"dir     : {m['bench_dir']} ({m['filesystem']})")
    print("versions: " + ", ".join(f"{k}={'MISSING' if val is None else val}" for k, val in v.items()))


def machine_header(bench_dir: str, versions: dict[str, str | None]) -> dict:
    """:func:`machine_info`, printed (the first lines of every script's output)."""
    meta = machine_info(bench_dir, versions)
    print_machine(meta)
    return meta


def no_pyckpt() -> int:
    """Says that pyckpt is missing (on stderr); the exit status of a script that needs it."""
    print("pyckpt is not importable: nothing to benchmark", file=sys.stderr)
    return 1


def pyckpt_header(pyckpt, bench_dir: str, threads: int, baselines: str = "baseline",
                  note: str = "") -> dict:
    """:func:`machine_header` of a script that needs only pyckpt (its default thread count
    goes to ``machine``), then the thread counts of the memcpy ``baselines`` and of pyckpt."""
    meta = machine_header(bench_dir, {"pyckpt": version_of(pyckpt)})
    meta["machine"]["pyckpt_default_threads"] = pyckpt._core.default_threads()
    print(f"threads : memcpy {baselines} {threads} Python thread(s) (--threads); pyckpt copies "
          f"use {pyckpt._core.default_threads()} (its default; PYCKPT_THREADS overrides){note}")
    return meta


def state_text(info: dict, noun: str = "tensors", extra: str = "") -> str:
    """``model_state.describe_state``'s figures in words: size, count, small ones, largest."""
    return (f"{info['bytes'] / GiB:.3f} GiB in {info['tensors']} float32 {noun} "
            f"({info['small_tensors_under_64KiB']} under 64 KiB, largest "
            f"{info['largest_bytes'] / MiB:.1f} MiB{extra})")


def print_plan(rounds: int, ballast_bytes: int, of: str | None = None) -> None:
    """The line announcing the interleaved rounds (``of``: what each round runs)."""
    print(f"running {rounds} interleaved rounds{f' of {of}' if of else ''} (ballast of "
          f"{ballast_bytes / GiB:.2f} GiB touched before each timed operation)", flush=True)


# --- command line ----------------------------------------------------------


def parser(description: str, *, size_gb: float = 1.0, size_help: str = "state size in GiB",
           rounds: int = 5, rounds_help: str = "interleaved rounds",
           quick_help: str = "smoke test: 128 MiB state, 2 rounds",
           dir_help: str | None = "where outputs are written (default: a fresh temp dir under /tmp)",
           json_help: str = "write all results as JSON", threads: bool = False,
           torch_threads_help: str | None = None, seed: bool = True) -> argparse.ArgumentParser:
    """The options the scripts share, each script adding its own after them: ``--size-gb``,
    ``--rounds``, ``--dir`` (unless ``dir_help`` is None), ``--json``, ``--quick``, with
    ``threads`` ``--threads`` (the memcpy baseline's Python threads), with
    ``torch_threads_help`` ``--torch-threads``, and with ``seed`` ``--seed``."""
    p = argparse.ArgumentParser(description=description,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--size-gb", type=float, default=size_gb,
                   help=f"{size_help} (default {size_gb:g})")
    p.add_argument("--rounds", type=int, default=rounds, help=f"{rounds_help} (default {rounds})")
    if dir_help is not None:
        p.add_argument("--dir", default=None, help=dir_help)
    p.add_argument("--json", default=None, metavar="PATH", help=json_help)
    p.add_argument("--quick", action="store_true", help=quick_help)
    if threads:
        p.add_argument("--threads", type=int, default=max(2, usable_cpus()), metavar="N",
                       help="Python threads of the memcpy baseline (default: one per usable "
                            "core, at least 2, which is also pyckpt's default)")
    if torch_threads_help is not None:
        p.add_argument("--torch-threads", type=int, default=1, metavar="N", help=torch_threads_help)
    if seed:
        p.add_argument("--seed", type=int, default=0)
    return p


def _flags(names: tuple[str, ...]) -> str:
    """``("a", "b_c", "d")`` -> ``"--a, --b-c and --d"``."""
    flags = ["--" + n.replace("_", "-") for n in names]
    return flags[0] if len(flags) == 1 else ", ".join(flags[:-1]) + " and " + flags[-1]


def parse(p: argparse.ArgumentParser, argv=None, quick: dict | None = None,
          positive: tuple[str, ...] = ("size_gb",),
          at_least_one: tuple[str, ...] = ("rounds",)) -> argparse.Namespace:
    """Parsed options; with ``--quick``, ``quick``'s values replace the options (a callable
    value gets the options); then the ``positive`` options must be > 0 and the
    ``at_least_one`` options >= 1 (else a usage error)."""
    args = p.parse_args(argv)
    if quick and getattr(args, "quick", False):
        for name, value in quick.items():
            setattr(args, name, value(args) if callable(value) else value)
    if (any(getattr(args, n) <= 0 for n in positive)
            or any(getattr(args, n) < 1 for n in at_least_one)):
        p.error(f"{_flags(positive)} must be > 0" + (" and " if len(at_least_one) == 1 else ", ")
                + f"{_flags(at_least_one)} >= 1")
    return args


def apply_torch_threads(torch, n: int) -> None:
    """``--torch-threads``: ``n`` > 0 sets torch's intra-op threads, 0 keeps torch's default."""
    if torch is not None and n > 0:
        torch.set_num_threads(n)


# --- first-touch ballast and peak memory ----------------------------------


def touch_ballast(nbytes: int) -> None:
    """Allocate, touch every page of, and free ``nbytes``: later allocations of the
    same size reuse guest pages the host has already backed (no first-touch faults)."""
    ballast = np.ones(nbytes, dtype=np.uint8)
    del ballast


def touched_like(arrays):
    """Zeroed buffers shaped like ``arrays`` (a dict or a list), every page touched now,
    not inside a timed operation (the destinations of ``into=`` loads and copies)."""
    items = arrays.items() if isinstance(arrays, dict) else enumerate(arrays)
    out = {}
    for k, a in items:
        b = np.empty_like(a)
        b.fill(0)
        out[k] = b
    return out if isinstance(arrays, dict) else list(out.values())


def zero_first_round(arrays) -> Callable[[int], None]:
    """A Step's ``prepare``: zero ``arrays`` (a dict or a list) before round 0, so that
    round 0's check sees what the timed call wrote, not what an earlier one left."""
    def prepare(rnd: int) -> None:
        if rnd == 0:
            for a in (arrays.values() if isinstance(arrays, dict) else arrays):
                a.fill(0)
    return prepare


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


class ParallelCopy:
    """The memcpy limit: ``copy(dsts)`` has ``threads`` Python threads ``np.copyto`` their
    share of ``srcs`` (split by bytes; numpy releases the GIL) into ``dsts``."""

    def __init__(self, srcs: list[np.ndarray], threads: int) -> None:
        self.srcs, self.threads = srcs, threads
        self.bins = split_balanced(dict(enumerate(srcs)), threads)

    def __call__(self, dsts: list[np.ndarray]) -> list[np.ndarray]:
        def part(i: int) -> None:
            for j in self.bins[i]:
                np.copyto(dsts[j], self.srcs[j])  # releases the GIL
        run_threads(part, self.threads)
        return dsts


# --- raw durable write limit -------------------------------------------------

RAW_THREADS = 2        # threads of the raw limits (bench_local.py, bench_dist.py)
WRITEBACK_PIECE = 8 * MiB  # pyckpt's default piece_size: early writeback after each


def drop_caches() -> None:
    """``sync`` then drop the page cache of the whole machine (needs root)."""
    os.sync()
    with open("/proc/sys/vm/drop_caches", "w") as f:
        f.write("1")


def can_drop_caches() -> tuple[bool, str]:
    """Whether ``drop_caches`` works here, and why not."""
    try:
        drop_caches()
        return True, ""
    except OSError as e:
        return False, f"{type(e).__name__}: {e}"


def fsync_path(path: str | os.PathLike) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def pwrite_all(fd: int, view: memoryview, offset: int) -> None:
    while view:
        n = os.pwrite(fd, view, offset)
        view, offset = view[n:], offset + n


@dataclasses.dataclass
class RawFiles:
    """What :func:`raw_pwrite` wrote: its files, per file ``(key, offset, shape, dtype)``
    of every array, and the seconds until the last thread's pwrites ended."""
    files: list[Path]
    plans: list[list[tuple[str, int, tuple, np.dtype]]]
    pwrite_s: float


def raw_pwrite(state: dict[str, np.ndarray], out: Path, threads: int = RAW_THREADS,
               writeback: Callable[[int, int, int], Any] | None = None) -> RawFiles:
    """The raw durable write limit: ``threads`` threads, each ``os.pwrite``s its share of
    the arrays (balanced by bytes) into its own file ``out/part<i>.bin``, then fsyncs it;
    then the directory. No format, no checksum. With ``writeback`` (``f(fd, offset,
    nbytes)``, e.g. sync_file_range), each thread also starts the writeback of every
    :data:`WRITEBACK_PIECE` right after writing it, so the disk flushes while the rest
    is written."""
    out.mkdir()
    bins = split_balanced(state, threads)
    files = [out / f"part{i}.bin" for i in range(threads)]
    plans: list[list] = [[] for _ in range(threads)]
    t0 = time.perf_counter()
    written = [0.0] * threads

    def write_part(i: int) -> None:
        fd = os.open(files[i], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            offset = 0
            for key in bins[i]:
                a = state[key]
                view = memoryview(a).cast("B")
                plans[i].append((key, offset, a.shape, a.dtype))
                if writeback is None:
                    pwrite_all(fd, view, offset)
                    offset += len(view)
                    continue
                for p in range(0, len(view), WRITEBACK_PIECE):
                    piece = view[p:p + WRITEBACK_PIECE]
                    pwrite_all(fd, piece, offset)
                    writeback(fd, offset, len(piece))
                    offset += len(piece)
            written[i] = time.perf_counter() - t0
            os.fsync(fd)
        finally:
            os.close(fd)

    run_threads(write_part, threads)
    fsync_path(out)
    return RawFiles(files, plans, max(written))


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
    """One timed call. ``prepare(rnd)`` runs untimed before the ballast, ``after_ballast()``
    untimed between the ballast and the call (e.g. dropping the page cache); ``check(result)``
    runs untimed on round 0's result. ``meta`` goes to Results.meta (see summarize). A
    failed ``required`` step skips the rest of its group (e.g. the loads of a failed save);
    any failed step is skipped from then on."""
    name: str
    phase: str
    fn: Callable[[], Any]
    prepare: Callable[[int], None] | None = None
    check: Callable[[Any], None] | None = None
    meta: dict = dataclasses.field(default_factory=dict)
    after_ballast: Callable[[], None] | None = None
    required: bool = True


@dataclasses.dataclass
class Group:
    """Steps that run together, in order, within a round (e.g. a save, then its load).
    ``setup`` / ``teardown`` (untimed, given the round) run around them."""
    name: str
    steps: list[Step]
    setup: Callable[[int], None] | None = None
    teardown: Callable[[int], None] | None = None


def solo(name: str, phase: str, fn: Callable[[], Any],
         teardown: Callable[[int], None] | None = None, **step) -> Group:
    """A group of one :class:`Step` (``step``: its other fields), both named ``name``."""
    return Group(name, [Step(name, phase, fn, **step)], teardown=teardown)


class Scratch:
    """A fresh location per group and round: ``hooks(key, name)`` gives a Group's
    ``setup`` / ``teardown`` that make ``self[key]`` = ``make(rnd, name)`` (removing what an
    earlier run may have left there) and remove it after the group (``remove(location)``)."""

    def __init__(self, make: Callable[[int, str], Any], remove: Callable[[Any], None]) -> None:
        self.make, self.remove = make, remove
        self.current: dict[str, Any] = {}

    def __getitem__(self, key: str):
        return self.current[key]

    def hooks(self, key: str, name: str | None = None) -> dict:
        def setup(rnd: int) -> None:
            self.current[key] = self.make(rnd, key if name is None else name)
            self.remove(self.current[key])

        def teardown(rnd: int) -> None:
            self.remove(self.current.pop(key))

        return {"setup": setup, "teardown": teardown}


def run_interleaved(groups: list[Group], rounds: int, ballast_bytes: int,
                    results: Results | None = None, verbose: bool = True) -> Results:
    """Every round runs every group once, the order rotating by one each round; a
    ballast of ``ballast_bytes`` is touched before every timed step. A failed step
    disables that contender and, if ``required``, skips the rest of its group."""
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
                        if s.required:
                            break
                        continue
                    if s.prepare is not None:
                        s.prepare(rnd)
                    touch_ballast(ballast_bytes)
                    if s.after_ballast is not None:
                        s.after_ballast()
                    out = run_contender(res, s.phase, s.name, rnd, s.fn,
                                        check=s.check if rnd == 0 else None)
                    del out
                    if s.name in res.errors and s.required:
                        break
            finally:
                gc.collect()
                if g.teardown is not None:
                    g.teardown(rnd)
        if verbose:
            print(f"  round {rnd + 1}/{rounds} done in {time.perf_counter() - t_round:.1f} s "
                  f"(order: {', '.join(g.name for g in order)})", flush=True)
    return res


def verify_tree(result, state: dict[str, np.ndarray]) -> None:
    """A loaded tree must hold exactly the saved arrays (torch tensors are compared as
    numpy); raises AssertionError naming the first difference."""
    if set(result) != set(state):
        missing = set(state) - set(result)
        extra = set(result) - set(state)
        raise AssertionError(f"keys differ: missing {sorted(missing)[:3]}, extra {sorted(extra)[:3]}")
    for k, a in state.items():
        b = result[k]
        if not isinstance(b, np.ndarray) and hasattr(b, "numpy"):  # a torch.Tensor
            b = b.numpy()
        b = np.asarray(b)
        if b.shape != a.shape or b.dtype != a.dtype or not np.array_equal(a, b):
            raise AssertionError(f"tensor {k!r} differs after load")


# --- summary ---------------------------------------------------------------


def median_of(xs) -> float | None:
    """Median of the values that are not None (failed rounds), None if there are none."""
    v = [x for x in xs if x is not None]
    return statistics.median(v) if v else None


def throughput(seconds: list, nbytes: int) -> dict:
    """median_s and median / min / max GB/s (``nbytes`` / time) of per-round times
    (None where a round failed; at least one must be a time)."""
    v = [x for x in seconds if x is not None]
    med = statistics.median(v)
    return {"median_s": med, "median_gbps": nbytes / med / GB,
            "min_gbps": nbytes / max(v) / GB, "max_gbps": nbytes / min(v) / GB}


def compare(own: list, ref: list, speed: bool = False) -> dict | None:
    """``own`` against ``ref`` (per-round times, None where a round failed): ``ratio`` of
    the medians and ``pair_ratios``, the same ratio within each round where both ran,
    with their median (None without pairs). The ratio is own time / reference time, or
    with ``speed`` reference / own (own throughput as a fraction of the reference's).
    None when either has no time."""
    mo, mr = median_of(own), median_of(ref)
    if mo is None or mr is None:
        return None
    pairs = [(q / p if speed else p / q) for p, q in zip(own, ref) if p is not None and q is not None]
    return {"ratio": mr / mo if speed else mo / mr, "pair_ratios": pairs,
            "pair_ratio_median": statistics.median(pairs) if pairs else None}


def summarize(res: Results, nbytes: int, ratio_key: str = "ratio",
              seconds_range: bool = False) -> dict:
    """Per phase: ``{"limit": name, "contenders": {name: stats}}``.

    stats: median_s, median/min/max GB/s (``nbytes`` / time), with ``seconds_range``
    also min_s / max_s, rounds, the contender's meta, ``fraction_of_limit`` (limit's
    median time / own, against the phase's row with meta ``limit``), and, for a contender
    with meta ``compare_to``, ``stats[ratio_key]`` with ``pair_ratios`` (per round) and
    ``pair_ratio_median`` (see :func:`compare`; meta ``speed_ratio`` makes it reference
    time / own, a throughput fraction).
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
                **throughput(v, nbytes),
                **({"min_s": min(v), "max_s": max(v)} if seconds_range else {}),
                "rounds": len(v),
                **{k: val for k, val in res.meta.get(name, {}).items() if k != "phase"},
            }
        limit = next((n for n in stats if stats[n].get("limit")), None)
        for name, s in stats.items():
            s["fraction_of_limit"] = (stats[limit]["median_s"] / s["median_s"]) if limit else None
            ref = s.get("compare_to")
            if ref and ref in stats:
                c = compare(rows[name], rows[ref], speed=bool(s.get("speed_ratio")))
                s[ratio_key] = c["ratio"]
                if c["pair_ratios"]:
                    s["pair_ratios"] = c["pair_ratios"]
                    s["pair_ratio_median"] = c["pair_ratio_median"]
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


def name_column(width: int = 28, header: str = "contender") -> Column:
    return Column(header, width, lambda n, s: n, left=True)


def kind_column(width: int = 6) -> Column:
    return Column("kind", width, lambda n, s: s.get("kind", "-"), left=True)


def throughput_columns(width: int = 7) -> list[Column]:
    """median GB/s, min, max (slowest / fastest round; ``width`` wide) and median s."""
    return [Column("median GB/s", 11, lambda n, s: f"{s['median_gbps']:.2f}"),
            Column("min", width, lambda n, s: f"{s['min_gbps']:.2f}"),
            Column("max", width, lambda n, s: f"{s['max_gbps']:.2f}"),
            Column("median s", 9, lambda n, s: f"{s['median_s']:.3f}")]


def seconds_columns() -> list[Column]:
    """median s, min s, max s (needs ``summarize(..., seconds_range=True)``)."""
    return [Column("median s", 9, lambda n, s: f"{s['median_s']:.3f}"),
            Column("min s", 8, lambda n, s: f"{s['min_s']:.3f}"),
            Column("max s", 8, lambda n, s: f"{s['max_s']:.3f}")]


def ratio_column(header: str, width: int = 9) -> Column:
    """The contender's ``ratio`` (``baseline`` on a row with meta ``baseline``)."""
    return Column(header, width, lambda n, s: f"{s['ratio']:.2f}x" if "ratio" in s
                  else ("baseline" if s.get("baseline") else "-"))


OPS = {">=": operator.ge, "<=": operator.le}


def target_column(op: str, goal: float, width: int = 7) -> Column:
    """``ok`` / ``MISSED``: the contender's ``ratio`` against the target ``op goal``."""
    return Column("target", width, lambda n, s: ("ok" if OPS[op](s["ratio"], goal) else "MISSED")
                  if "ratio" in s else "-")


def print_table(title: str | None, stats: dict[str, dict], columns: list[Column],
                pairs: str | None = None, **pair_widths) -> None:
    """A blank line and ``title`` (none if None), then one row per entry of ``stats``
    (indented 2); with ``pairs`` (a caption), then :func:`print_pairs`."""
    if title is not None:
        print(f"\n{title}")
    hdr = "  " + " ".join(c.fmt(c.header) for c in columns)
    print(hdr)
    print("  " + "-" * (len(hdr) - 2))
    for name, s in stats.items():
        print("  " + " ".join(c.fmt(c.cell(name, s)) for c in columns))
    if pairs is not None:
        print_pairs(stats, pairs, **pair_widths)


def pair_line(name: str, ref: str, r: dict, name_width: int = 26, ref_width: int = 24,
              note: str = "") -> str:
    """One line of per-round pairs: ``r`` has pair_ratios and pair_ratio_median."""
    rs = ", ".join(f"{x:.2f}" for x in r["pair_ratios"])
    return (f"    {name:<{name_width}} vs {ref:<{ref_width}} "
            f"median {r['pair_ratio_median']:.2f}x  [{rs}]{note}")


def print_pairs(stats: dict[str, dict], caption: str, name_width: int = 26,
                ref_width: int = 24) -> None:
    """The per-round pair ratios of every contender that has them, under ``caption``."""
    pairs = {n: s for n, s in stats.items() if "pair_ratios" in s}
    if not pairs:
        return
    print(f"  {caption}")
    for name, s in pairs.items():
        print(pair_line(name, s["compare_to"], s, name_width, ref_width))


@dataclasses.dataclass
class Target:
    """A contender's ratio against its reference and the target ``op goal``."""
    contender: str
    ratio: float
    compare_to: str
    op: str
    goal: float
    pair_ratio_median: float | None

    @property
    def met(self) -> bool:
        return OPS[self.op](self.ratio, self.goal)

    def doc(self) -> dict:
        return {"contender": self.contender, "ratio": self.ratio, "compare_to": self.compare_to,
                "op": self.op, "target": self.goal, "met": self.met}


def targets_of(stats: dict[str, dict], op: str, goal: float) -> list[Target]:
    """A :class:`Target` for every contender of ``stats`` that has a ``ratio``."""
    return [Target(n, s["ratio"], s["compare_to"], op, goal, s.get("pair_ratio_median"))
            for n, s in stats.items() if "ratio" in s]


def print_targets(targets: list[Target]) -> None:
    """The TARGETS block: ratio, per-round pair median, target and met / MISSED."""
    print("\n== TARGETS (median ratio; per-round pair median in brackets)")
    for t in targets:
        pm = float("nan") if t.pair_ratio_median is None else t.pair_ratio_median
        print(f"  {t.contender:<28} {t.ratio:5.2f}x vs {t.compare_to:<28} [{pm:.2f}x]  "
              f"target {t.op} {t.goal:.2f}x  {'met' if t.met else 'MISSED'}")


def print_errors(errors: dict[str, str], title: str = "failed contenders",
                 limit: int | None = None) -> None:
    """``title`` and every failure (its message cut to ``limit`` characters), if any."""
    if errors:
        print(f"\n{title}:")
        for name, err in errors.items():
            print(f"  {name}: {err if limit is None else err[:limit]}")


def write_json(path: str, doc: dict) -> None:
    with open(path, "w") as f:
        json.dump(doc, f, indent=2, default=str)
    print(f"\nJSON written to {path}")


def write_report(path: str | None, meta: dict, args, **sections) -> None:
    """With ``--json PATH``: ``machine`` and ``versions`` (``meta``), ``args`` (the options, a
    Namespace or a dict), then ``sections`` in order."""
    if path:
        write_json(path, {**meta, "args": args if isinstance(args, dict) else vars(args),
                          **sections})
