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
operation, so that first-touch page faults of a VM do not land on one contender.
See benchmarks/README.md for how to read the output.
"""

from __future__ import annotations

import argparse
import dataclasses
import gc
import importlib
import json
import os
import platform
import shutil
import statistics
import sys
import tempfile
import threading
import time
import warnings
import zlib
from pathlib import Path
from typing import Any, Callable

import numpy as np

GB = 1e9  # throughput unit: 10**9 bytes per second
MiB = 1 << 20
GiB = 1 << 30

# ---------------------------------------------------------------------------
# imports
# ---------------------------------------------------------------------------


def import_pyckpt():
    """pyckpt as installed, else from the repository this script lives in."""
    try:
        return importlib.import_module("pyckpt")
    except ImportError:
        sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
        try:
            return importlib.import_module("pyckpt")
        except ImportError:
            return None


def optional_import(name: str):
    try:
        return importlib.import_module(name)
    except Exception:  # a broken install counts as missing
        return None


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

# ---------------------------------------------------------------------------
# machine description
# ---------------------------------------------------------------------------


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def _mem_total_gib() -> float | None:
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemTotal:"):
                    return int(line.split()[1]) * 1024 / GiB
    except OSError:
        pass
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


def _version(mod) -> str | None:
    if mod is None:
        return None
    return str(getattr(mod, "__version__", "unknown"))


def machine_info(bench_dir: str) -> dict:
    info = {
        "nproc": os.cpu_count(),
        "usable_cpus": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None,
        "cpu_model": _cpu_model(),
        "mem_total_gib": _mem_total_gib(),
        "kernel": platform.release(),
        "bench_dir": bench_dir,
        "filesystem": _filesystem_of(bench_dir),
    }
    versions = {
        "python": platform.python_version(),
        "numpy": np.__version__,
        "pyckpt": _version(pyckpt),
        "safetensors": _version(optional_import("safetensors")) if safetensors_numpy else None,
        "torch": _version(torch),
        "crc32c": _version(crc32c_pkg),
    }
    if pyckpt is not None:
        versions["pyckpt_crc32c_impl"] = pyckpt._core.crc32c_implementation()
    return {"machine": info, "versions": versions}


def print_machine(meta: dict) -> None:
    m, v = meta["machine"], meta["versions"]
    print(f"machine : {m['cpu_model']}, nproc={m['nproc']} (usable {m['usable_cpus']}), "
          f"{m['mem_total_gib']:.1f} GiB RAM, kernel {m['kernel']}")
    print(f"dir     : {m['bench_dir']} ({m['filesystem']})")
    print("versions: " + ", ".join(f"{k}={'MISSING' if val is None else val}" for k, val in v.items()))


# ---------------------------------------------------------------------------
# the state
# ---------------------------------------------------------------------------


def build_state(total_bytes: int, seed: int = 0) -> dict[str, np.ndarray]:
    """A transformer-like float32 state: params + Adam m + Adam v (params ~ 1/3 of bytes).

    Params: an embedding table, 4 large matrices per layer (qkv, out, mlp in/out), and
    8 small vectors per layer (biases, LayerNorm weight/bias) -- a few hundred small
    tensors once m and v are added. Hidden size and vocabulary follow ``total_bytes``.
    """
    n_layers = 12
    param_floats = max(total_bytes // 3 // 4, 1 << 16)
    # ~80% of the params in layer matrices: 12 * d^2 floats per layer.
    d = max(64, int((0.8 * param_floats / (12 * n_layers)) ** 0.5) // 64 * 64)
    shapes: dict[str, tuple[int, ...]] = {}
    for i in range(n_layers):
        p = f"layers.{i}"
        shapes[f"{p}.attn.qkv.weight"] = (d, 3 * d)
        shapes[f"{p}.attn.qkv.bias"] = (3 * d,)
        shapes[f"{p}.attn.out.weight"] = (d, d)
        shapes[f"{p}.attn.out.bias"] = (d,)
        shapes[f"{p}.mlp.fc1.weight"] = (d, 4 * d)
        shapes[f"{p}.mlp.fc1.bias"] = (4 * d,)
        shapes[f"{p}.mlp.fc2.weight"] = (4 * d, d)
        shapes[f"{p}.mlp.fc2.bias"] = (d,)
        for ln in ("ln1", "ln2"):
            shapes[f"{p}.{ln}.weight"] = (d,)
            shapes[f"{p}.{ln}.bias"] = (d,)
    shapes["final_ln.weight"] = (d,)
    shapes["final_ln.bias"] = (d,)
    used = sum(int(np.prod(s)) for s in shapes.values())
    vocab = max(256, (param_floats - used) // d)
    shapes = {"embed.weight": (vocab, d), **shapes}

    rng = np.random.default_rng(seed)
    state: dict[str, np.ndarray] = {}
    for name, shape in shapes.items():
        state[f"params.{name}"] = rng.standard_normal(shape, dtype=np.float32)
    for name, shape in shapes.items():
        state[f"adam.m.{name}"] = rng.standard_normal(shape, dtype=np.float32) * np.float32(1e-3)
    for name, shape in shapes.items():
        v = rng.standard_normal(shape, dtype=np.float32)
        np.square(v, out=v)
        v *= np.float32(1e-6)
        state[f"adam.v.{name}"] = v
    return state


def describe_state(state: dict[str, np.ndarray]) -> dict:
    sizes = sorted((a.nbytes for a in state.values()), reverse=True)
    return {
        "bytes": sum(sizes),
        "tensors": len(sizes),
        "small_tensors_under_64KiB": sum(s < 64 * 1024 for s in sizes),
        "largest_bytes": sizes[0],
        "param_bytes": sum(a.nbytes for k, a in state.items() if k.startswith("params.")),
    }


# ---------------------------------------------------------------------------
# OS helpers: durability, cache control, first-touch ballast, memory sampling
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


def touch_ballast(nbytes: int) -> None:
    """Allocate, touch every page of, and free ``nbytes``: later allocations of the
    same size reuse guest pages the host has already backed (no first-touch faults)."""
    ballast = np.ones(nbytes, dtype=np.uint8)
    del ballast


def warm_read(root: str | os.PathLike) -> None:
    """Read every file under ``root`` once so it sits in the page cache."""
    buf = bytearray(16 * MiB)
    for dirpath, _, files in os.walk(root):
        for name in files:
            with open(os.path.join(dirpath, name), "rb", buffering=0) as f:
                while f.readinto(buf):
                    pass


def drop_caches() -> None:
    os.sync()
    with open("/proc/sys/vm/drop_caches", "w") as f:
        f.write("1")


def can_drop_caches() -> tuple[bool, str]:
    try:
        drop_caches()
        return True, ""
    except OSError as e:
        return False, f"{type(e).__name__}: {e}"


def _proc_status_kib(*fields: str) -> dict[str, int]:
    out = {}
    with open("/proc/self/status") as f:
        for line in f:
            key = line.split(":", 1)[0]
            if key in fields:
                out[key] = int(line.split()[1])
    return out


class PeakMemory:
    """Peak increase of VmRSS / RssAnon over the value at entry.

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


# ---------------------------------------------------------------------------
# raw limit: 2 threads, pwrite / preadv, no format at all
# ---------------------------------------------------------------------------

RAW_THREADS = 2


def _split_balanced(state: dict[str, np.ndarray], parts: int) -> list[list[str]]:
    """Partition keys into ``parts`` lists of about equal bytes (largest first, greedy)."""
    bins: list[list[str]] = [[] for _ in range(parts)]
    load = [0] * parts
    for key in sorted(state, key=lambda k: state[k].nbytes, reverse=True):
        i = load.index(min(load))
        bins[i].append(key)
        load[i] += state[key].nbytes
    return bins


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


def _run_threads(fn: Callable[[int], Any], n: int) -> list:
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


@dataclasses.dataclass
class RawHandle:
    root: Path
    files: list[Path]
    plans: list[list[tuple[str, int, tuple, np.dtype]]]  # per file: key, offset, shape, dtype


def raw_save(state, out: Path, ctx) -> RawHandle:
    out.mkdir()
    bins = _split_balanced(state, RAW_THREADS)
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

    _run_threads(write_part, RAW_THREADS)
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

    _run_threads(read_part, RAW_THREADS)
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


def timed(fn: Callable, *args) -> tuple[float, Any]:
    gc.collect()
    gc.disable()
    try:
        t0 = time.perf_counter()
        result = fn(*args)
        seconds = time.perf_counter() - t0
    finally:
        gc.enable()
    return seconds, result


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


class Results:
    """seconds[phase][contender] = list of per-round times (None where it failed)."""

    PHASES = ("save", "load (warm cache)", "load (cold cache)")

    def __init__(self):
        self.seconds: dict[str, dict[str, list]] = {p: {} for p in self.PHASES}
        self.errors: dict[str, str] = {}
        self.meta: dict[str, dict] = {}  # contender -> kind / compare_to / limit flags

    def add(self, phase, name, rnd, seconds):
        row = self.seconds[phase].setdefault(name, [])
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


def run_rounds(formats: list[Format], ctx: Context, rounds: int, workdir: Path,
               cold: bool, verbose: bool = True) -> Results:
    res = Results()
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

    n = len(formats)
    for rnd in range(rounds):
        order = formats[rnd % n:] + formats[:rnd % n]
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


def _valid(xs):
    return [x for x in xs if x is not None]


def summarize(res: Results, nbytes: int) -> dict:
    """Per-phase stats, ratios to the limit, pyckpt speedups, per-round pair ratios."""
    summary: dict[str, dict] = {}
    for phase, rows in res.seconds.items():
        if not rows:
            continue
        stats = {}
        for name, secs in rows.items():
            v = _valid(secs)
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
                # > 1: pyckpt is faster than this contender (ratio of median times)
                s["pyckpt_speedup"] = s["median_s"] / stats[ref]["median_s"]
                pairs = [p / q for p, q in zip(rows[name], rows[ref])
                         if p is not None and q is not None]
                if pairs:
                    s["pair_ratios"] = pairs
                    s["pair_ratio_median"] = statistics.median(pairs)
        summary[phase] = {"limit": limit, "contenders": stats}
    return summary


def print_tables(summary: dict, nbytes: int) -> None:
    for phase, block in summary.items():
        stats = block["contenders"]
        print(f"\n== {phase.upper()}  ({nbytes / GiB:.3f} GiB state; GB/s = 1e9 bytes/s; "
              f"limit = {block['limit'] or 'n/a'})")
        hdr = (f"  {'contender':<28} {'kind':<6} {'median GB/s':>11} {'min':>7} {'max':>7} "
               f"{'median s':>9} {'vs limit':>9} {'pyckpt x':>9}")
        print(hdr)
        print("  " + "-" * (len(hdr) - 2))
        for name, s in stats.items():
            frac = f"{s['fraction_of_limit']:.2f}" if s.get("fraction_of_limit") else "-"
            spd = f"{s['pyckpt_speedup']:.2f}x" if "pyckpt_speedup" in s else "-"
            print(f"  {name:<28} {s.get('kind', '-'):<6} {s['median_gbps']:>11.2f} "
                  f"{s['min_gbps']:>7.2f} {s['max_gbps']:>7.2f} {s['median_s']:>9.3f} "
                  f"{frac:>9} {spd:>9}")
        pairs = {n: s for n, s in stats.items() if "pair_ratios" in s}
        if pairs:
            print("  per-round pairs (peer time / pyckpt time in the same round; > 1 = pyckpt faster):")
            for name, s in pairs.items():
                rs = ", ".join(f"{r:.2f}" for r in s["pair_ratios"])
                print(f"    {name:<26} vs {s['compare_to']:<24} median {s['pair_ratio_median']:.2f}x"
                      f"  [{rs}]")


# ---------------------------------------------------------------------------
# extra measurements: CRC32C and peak memory
# ---------------------------------------------------------------------------


def _pin_to_one_cpu():
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

    restore = _pin_to_one_cpu()
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
    own_dir = args.dir is None
    base = Path(tempfile.mkdtemp(prefix="pyckpt-bench-", dir="/tmp") if own_dir else args.dir)
    base.mkdir(parents=True, exist_ok=True)
    workdir = base if own_dir else Path(tempfile.mkdtemp(prefix="pyckpt-bench-", dir=base))

    meta = machine_info(str(workdir))
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
        summary = summarize(res, ctx.nbytes)
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
        with open(args.json, "w") as f:
            json.dump(doc, f, indent=2, default=str)
        print(f"\nJSON written to {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
