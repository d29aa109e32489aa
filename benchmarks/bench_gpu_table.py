#!/usr/bin/env python3
"""Every row of issue 40's table (GPU training state at the hardware limit), each with
its limit or peer measured in the same run, then one summary table: row, measured,
limit / peer, ratio, target, met / missed.

One process measures, section by section (each guarded: a failure is a row's note,
the next section runs), on a GPT-like state of CUDA tensors (bench_gpu.py's
``build_state``: params + Adam m and v; 4.25 GB in 1,162 tensors by default):

1. ``save``: blocking ``pyckpt.save`` from the GPU, to durable, against N-thread
   pwrite+fsync of the same bytes (N = the usable cores);
2. ``load``: ``load(into=)`` of CUDA tensors, warm page cache, against safetensors
   ``load_file(device=)``, the N-thread preadv of the same bytes and one pinned
   host-to-device copy of the state (target: >= 0.8x the slower of the two); also
   two deeper settings of the load pipeline (PYCKPT_LOAD_*), for information;
3. ``async``: the caller's blocked time (call until its stream may run again) of
   background saves: a CheckpointManager (1st save, 2nd and later), plain
   ``save(blocking=False)`` with a device snapshot (``max_device_snapshot_bytes``
   large enough) and without (``max_device_snapshot_bytes=0``: the pinned ring /
   pool), against one pinned device-to-host copy of the state;
4. ``budget``: ``max_pinned_bytes=512 MiB`` on a 2 GiB state over 10 saves (RSS
   growth from the 2nd save to the last, blocked time against the D2H copy of that
   state; the full pool's blocked time for information);
5. ``copies``: ``copy_state`` / ``snapshot()`` / ``restore(snapshot)`` against
   ``torch._foreach_copy_``, for the state and for the 32 tensors of a 1 GB
   ``nn.Sequential`` of 16 ``Linear`` layers;
6. ``cold``: ``load(into=)`` with the page cache dropped before each read, against
   the N-thread preadv and safetensors, equally cold (needs root; else skipped).

The JAX rows come from benchmarks/bench_jax_restore.py's JSON (``--jax-json``), run
by benchmarks/gpu_session.sh. Each measured row is printed and appended to
``--rows`` (JSON lines) as soon as it is known, so ``--summarize ROWS`` prints the
table from whatever a killed run left. Without CUDA (``--dry-run``, automatic on a
machine without CUDA) every section runs on host tensors with tiny sizes, rows that
need CUDA say "skipped: no CUDA", and the page cache is not dropped.

    python benchmarks/bench_gpu_table.py --size-gb 4 --rounds 3 --rows out/rows.jsonl
    python benchmarks/bench_gpu_table.py --summarize out/rows.jsonl --jax-json out/jax.json
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import os
import shutil
import statistics
import sys
import time
import traceback
from pathlib import Path
from typing import Any, Callable

HERE = Path(__file__).resolve().parent
MiB, GiB = 1 << 20, 1 << 30
NO_CUDA = "skipped: no CUDA"


# ---------------------------------------------------------------------------------------
# the table: one spec per row (the targets live here only)
# ---------------------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class Spec:
    id: str
    label: str
    op: str = ""          # ">=" / "<=": ratio against goal; "": for information
    goal: float | None = None
    ratio: str = ""       # what the ratio is


SPECS = [
    Spec("save", "blocking save from the GPU, to durable", ">=", 0.9, "limit / own"),
    Spec("load_peer", "load(into=) CUDA, warm: vs safetensors", ">=", 2.0, "peer / own"),
    Spec("load_limit", "load(into=) CUDA, warm: vs min(read, H2D) rate", ">=", 0.8,
         "slower limit / own"),
    Spec("load_deep1", "  load(into=) warm, PYCKPT_LOAD 128 MiB x 4 buffers", "", None,
         "slower limit / own"),
    Spec("load_deep2", "  load(into=) warm, PYCKPT_LOAD 64 MiB x 8 buffers, 4 readers", "",
         None, "slower limit / own"),
    Spec("async_later", "async save (manager), blocked, 2nd and later", "<=", 1.1, "own / D2H"),
    Spec("async_first", "async save (manager), blocked, 1st", "<=", 2.0, "own / later"),
    Spec("snap_later", "device-snapshot route, blocked, 2nd and later", "<=", 0.25, "own / D2H"),
    Spec("snap_first", "device-snapshot route, blocked, 1st", "<=", 2.0, "own / later"),
    Spec("ring_later", "no device snapshot (=0): pinned, blocked, 2nd+", "<=", 1.25, "own / D2H"),
    Spec("budget_rss", "max_pinned_bytes=512 MiB, 2 GiB, 10 saves: RSS growth", "<=", 1.0,
         "growth / 64 MiB"),
    Spec("budget_blocked", "max_pinned_bytes=512 MiB: blocked, 2nd and later", "<=", 1.25,
         "own / D2H"),
    Spec("copy_state", "copy_state, state tensors", "<=", 1.25, "own / foreach"),
    Spec("snapshot", "snapshot(), state tensors", "<=", 1.25, "own / foreach"),
    Spec("restore", "restore(snapshot), state tensors", "<=", 1.25, "own / foreach"),
    Spec("seq_copy_state", "copy_state, 1 GB nn.Sequential (32)", "<=", 1.25, "own / foreach"),
    Spec("seq_snapshot", "snapshot(), 1 GB nn.Sequential (32)", "<=", 1.25, "own / foreach"),
    Spec("seq_restore", "restore(snapshot), 1 GB nn.Sequential (32)", "<=", 1.25,
         "own / foreach"),
    Spec("jax_restore", "JAX restore, first / later round", "<=", 1.2, "first / later"),
    Spec("load_cold", "load(into=) CUDA, cold page cache", ">=", 0.8, "raw / own"),
    Spec("load_cold_peer", "  load(into=) cold vs safetensors cold", "", None, "peer / own"),
]
SPEC = {s.id: s for s in SPECS}


class Rows:
    """Rows as they are measured: printed, and appended to a JSON-lines file."""

    def __init__(self, path: str | None) -> None:
        self.path = path
        self.rows: dict[str, dict] = {}

    def add(self, id: str, *, measured: str = "", ref: str = "", ratio: float | None = None,
            note: str = "", **extra: Any) -> None:
        if id not in SPEC:
            raise KeyError(f"no row {id!r} in SPECS")
        row = {"id": id, "measured": measured, "ref": ref, "ratio": ratio, "note": note, **extra}
        self.rows[id] = row
        print(f"ROW {SPEC[id].label.strip()}: {measured or '-'} | {ref or '-'} | "
              f"{'-' if ratio is None else f'{ratio:.2f}x'}{' | ' + note if note else ''}",
              flush=True)
        if self.path:
            with open(self.path, "a") as f:
                f.write(json.dumps(row) + "\n")

    def note_all(self, ids: list[str], note: str) -> None:
        for i in ids:
            if i not in self.rows:
                self.add(i, note=note)


def load_rows(path: str | None) -> dict[str, dict]:
    rows: dict[str, dict] = {}
    if path and os.path.exists(path):
        with open(path) as f:
            for line in f:
                line = line.strip()
                if line:
                    try:
                        r = json.loads(line)
                    except ValueError:
                        continue  # a line cut by a killed run
                    rows[r["id"]] = r
    return rows


def jax_rows(path: str | None) -> dict[str, dict]:
    """The JAX row from bench_jax_restore.py's JSON (``rows``: "restore @ this tree"
    and, when measured, "orbax @ this tree", each with first_s, later_s and
    first_over_later)."""
    if not path or not os.path.exists(path):
        return {}
    try:
        with open(path) as f:
            doc = json.load(f)
        rows = doc.get("rows", {})
        own = rows.get("restore @ this tree")
        if not own:
            return {"jax_restore": {"id": "jax_restore", "note": "no restore row in its JSON"}}
        ref = rows.get("orbax @ this tree")
        mb = doc.get("state", {}).get("bytes", 0) / 1e9
        return {"jax_restore": {
            "id": "jax_restore", "ratio": own["first_over_later"],
            "measured": f"{own['first_s']:.3f} / {own['later_s']:.3f} s ({mb:.2f} GB, "
                        f"{doc.get('state', {}).get('platform', '?')})",
            "ref": ("Orbax " + f"{ref['first_s']:.3f} / {ref['later_s']:.3f} s" if ref
                    else "Orbax not measured")}}
    except (OSError, ValueError, KeyError, TypeError) as e:
        return {"jax_restore": {"id": "jax_restore", "note": f"unreadable JSON: {e}"}}


def summary_lines(rows: dict[str, dict], extra_notes: dict[str, str] | None = None) -> list[str]:
    """The final table: every row of SPECS, measured or with the reason it is not."""
    out = [f"{'row':<58} {'measured':<30} {'limit / peer':<44} {'ratio':>7} {'target':>8}  "
           "status", "-" * 162]
    for s in SPECS:
        r = rows.get(s.id) or {}
        note = r.get("note") or (extra_notes or {}).get(s.id) or ""
        ratio = r.get("ratio")
        target = f"{s.op} {s.goal:g}x" if s.op else "info"
        if ratio is None:
            status = note or "not measured (its section failed or ran out of time)"
        elif not s.op:
            status = "info" + (f" ({note})" if note else "")
        else:
            met = ratio >= s.goal if s.op == ">=" else ratio <= s.goal
            status = ("met" if met else "MISSED") + (f" ({note})" if note else "")
        rt = "-" if ratio is None else f"{ratio:.2f}x"
        out.append(f"{s.label:<58} {str(r.get('measured', ''))[:30]:<30} "
                   f"{str(r.get('ref', ''))[:44]:<44} {rt:>7} {target:>8}  {status}")
    return out


def print_summary(rows: dict[str, dict], header: str = "") -> None:
    print("\n== ISSUE 40 TABLE" + (f" ({header})" if header else "") + "  [ratio: see the "
          "target's direction; limits and peers measured in this run]")
    for line in summary_lines(rows):
        print(line)


# ---------------------------------------------------------------------------------------
# measuring
# ---------------------------------------------------------------------------------------

def steady(xs: list[float]) -> float:
    """The median of rounds 2 and later (the 1st pays for one-time setup), or round 1."""
    return statistics.median(xs[1:]) if len(xs) > 1 else xs[0]


def secs(x: float) -> str:
    return f"{x:.3f} s" if x >= 0.01 else f"{x * 1e3:.2f} ms"


def rss_bytes() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    return 0


class Bench:
    """What every section shares: torch, pyckpt, the state, its host copy, the work dir."""

    def __init__(self, args: argparse.Namespace, rows: Rows) -> None:
        sys.path.insert(0, str(HERE))
        import numpy as np
        import torch

        import bench_gpu
        import harness

        self.np, self.torch, self.bg, self.h = np, torch, bench_gpu, harness
        import pyckpt
        self.pyckpt = pyckpt
        self.st = harness.optional_import("safetensors.torch")
        self.args, self.rows = args, rows
        self.cuda = torch.cuda.is_available() and not args.dry_run
        self.dev = torch.device("cuda", torch.cuda.current_device()) if self.cuda \
            else torch.device("cpu")
        self.threads = args.threads or harness.usable_cpus()
        self.work = harness.make_workdir(args.dir, prefix="pyckpt-bench-table-")
        t0 = time.perf_counter()
        self.state = bench_gpu.build_state(int(args.size_gb * GiB), args.layers, self.dev, 0)
        self.host = {k: (t.cpu() if self.cuda else t).numpy() for k, t in self.state.items()}
        self.nbytes = sum(a.nbytes for a in self.host.values())
        self.pinned = None
        if self.cuda:
            self.pinned = {k: torch.empty(t.shape, dtype=t.dtype, pin_memory=True)
                           for k, t in self.state.items()}
        self.sync()
        print(f"state: {len(self.state)} tensors, {self.nbytes / 1e9:.2f} GB on {self.dev}; "
              f"built in {time.perf_counter() - t0:.1f} s; {self.threads} threads for the "
              f"limits; work dir {self.work}", flush=True)
        self.ckpt: Path | None = None     # the blocking save's checkpoint (loads read it)
        self.raw: Any = None              # the raw pwrite's files (preadv reads them)
        self.st_file: Path | None = None  # the safetensors file
        self.d2h_s: float | None = None   # one pinned D2H copy of the state

    def sync(self) -> None:
        if self.cuda:
            self.torch.cuda.synchronize(self.dev)

    def stream_sync(self) -> None:
        if self.cuda:
            self.torch.cuda.current_stream(self.dev).synchronize()

    def timed(self, fn: Callable[[], Any]) -> float:
        self.sync()
        t0 = time.perf_counter()
        fn()
        self.sync()
        return time.perf_counter() - t0

    def d2h(self, state: dict, pinned: dict) -> None:
        for k, t in state.items():
            pinned[k].copy_(t, non_blocking=True)

    def d2h_time(self) -> float | None:
        """One pinned device-to-host copy of the state (median of 3, after one)."""
        if self.d2h_s is None and self.cuda:
            ts = [self.timed(lambda: self.d2h(self.state, self.pinned)) for _ in range(4)]
            self.d2h_s = statistics.median(ts[1:])
            print(f"pinned D2H of the state: {secs(self.d2h_s)}", flush=True)
        return self.d2h_s

    def same(self, got: dict, what: str) -> None:
        for k, t in self.state.items():
            if not self.torch.equal(got[k], t):
                raise AssertionError(f"{what}: {k!r} differs from the state")

    # -- 1. save ---------------------------------------------------------------------------
    def section_save(self) -> None:
        own, lim = [], []
        for r in range(self.args.save_rounds):
            path = self.work / f"save-{r}"
            own.append(self.timed(lambda: self.pyckpt.save(self.state, str(path))))
            if self.ckpt is not None:
                shutil.rmtree(self.ckpt, ignore_errors=True)
            self.ckpt = path
            raw_dir = self.work / f"raw-{r}"
            t0 = time.perf_counter()
            raw = self.h.raw_pwrite(self.host, raw_dir, self.threads)
            lim.append(time.perf_counter() - t0)
            if self.raw is not None:
                shutil.rmtree(self.raw.files[0].parent, ignore_errors=True)
            self.raw = raw
        o, li = steady(own), steady(lim)
        self.rows.add("save", measured=f"{secs(o)} ({self.nbytes / o / 1e9:.2f} GB/s)",
                      ref=f"pwrite+fsync x{self.threads} {secs(li)}", ratio=li / o,
                      seconds=own, limit_seconds=lim)

    # -- 2. warm loads ---------------------------------------------------------------------
    def section_load(self) -> None:
        if self.ckpt is None or self.raw is None:
            raise RuntimeError("needs the save section's checkpoint and raw files")
        torch = self.torch
        into = {k: torch.zeros_like(t) for k, t in self.state.items()}
        read_into = self.h.touched_like(self.host)
        if self.st is not None:
            self.st_file = self.work / "state.safetensors"
            self.st.save_file(self.state, str(self.st_file))
            self.bg.fsync_tree(self.work)
        ckpt = str(self.ckpt)
        variants = {"load_deep1": {"PYCKPT_LOAD_BATCH_MB": "128", "PYCKPT_LOAD_BUFFERS": "4"},
                    "load_deep2": {"PYCKPT_LOAD_BATCH_MB": "64", "PYCKPT_LOAD_BUFFERS": "8",
                                   "PYCKPT_LOAD_READERS": "4"}}
        t: dict[str, list[float]] = {k: [] for k in ("own", "st", "read", "h2d", *variants)}
        for r in range(self.args.rounds):
            t["own"].append(self.timed(lambda: self.pyckpt.load(ckpt, into=into)))
            if r == 0:
                self.same(into, "load(into=)")
            if self.st is not None:
                t["st"].append(self.timed(lambda: self.st.load_file(str(self.st_file),
                                                                    device=str(self.dev))))
            t["read"].append(self.timed(lambda: self.bg.raw_read_into(self.raw, read_into,
                                                                      self.threads)))
            if self.cuda:
                t["h2d"].append(self.timed(lambda: [into[k].copy_(self.pinned[k],
                                                                  non_blocking=True)
                                                    for k in into]))
        for name, env in variants.items():  # each after one untimed load of its own
            with patched_env(env):
                for _ in range(self.args.rounds + 1):
                    t[name].append(self.timed(lambda: self.pyckpt.load(ckpt, into=into)))
        own = steady(t["own"])
        gbs = f"{secs(own)} ({self.nbytes / own / 1e9:.1f} GB/s)"
        if t["st"]:
            st = steady(t["st"])
            self.rows.add("load_peer", measured=gbs, ref=f"safetensors {secs(st)}",
                          ratio=st / own, seconds=t["own"], peer_seconds=t["st"],
                          note="" if self.cuda else "host tensors: load_file maps the file")
        else:
            self.rows.add("load_peer", measured=gbs, note="safetensors not installed")
        read = steady(t["read"])
        if not self.cuda:
            self.rows.add("load_limit", measured=gbs, ref=f"read {secs(read)}, H2D -",
                          note=NO_CUDA)
            self.rows.note_all(list(variants), NO_CUDA)
            return
        h2d = steady(t["h2d"])
        slower = max(read, h2d)
        self.rows.add("load_limit", measured=gbs, ref=f"read {secs(read)}, H2D {secs(h2d)}",
                      ratio=slower / own, read_seconds=t["read"], h2d_seconds=t["h2d"])
        for name in variants:
            v = steady(t[name])
            self.rows.add(name, measured=f"{secs(v)} ({self.nbytes / v / 1e9:.1f} GB/s)",
                          ref=f"slower limit {secs(slower)}", ratio=slower / v, seconds=t[name])

    # -- 3. background saves ---------------------------------------------------------------
    def blocked_saves(self, n: int, save: Callable[[int], Any],
                      wait: Callable[[Any], None]) -> tuple[list[float], list]:
        """``n`` background saves (each ``save(i)``, then ``wait(what it returned)``
        before the next): the caller's blocked time of each (call until its stream
        may run again) and what each returned."""
        out, handles = [], []
        for i in range(n):
            self.sync()
            t0 = time.perf_counter()
            h = save(i)
            self.stream_sync()
            out.append(time.perf_counter() - t0)
            handles.append(h)
            wait(h)
        return out, handles

    def section_async(self) -> None:
        pk = self.pyckpt
        d2h = self.d2h_time()
        n = max(3, self.args.async_saves)
        release = pk.device.release_staging_memory
        # a manager (its default options)
        release()
        mdir = self.work / "manager"
        mgr = pk.CheckpointManager(pk.Checkpoint(state=self.state), str(mdir), max_to_keep=1)
        try:
            blocked, _ = self.blocked_saves(n, lambda i: mgr.save(blocking=False),
                                            lambda _: mgr.wait_until_finished())
        finally:
            mgr.close()
            shutil.rmtree(mdir, ignore_errors=True)
        later = statistics.median(blocked[1:])
        self.vs_d2h("async_later", later, d2h, blocked)
        self.rows.add("async_first", measured=secs(blocked[0]), ref=f"later {secs(later)}",
                      ratio=blocked[0] / later,
                      note="" if d2h is None else f"{blocked[0] / d2h:.1f}x D2H")
        # plain saves, with and without a device snapshot
        for key, budget in (("snap", 2 * self.nbytes), ("ring", 0)):
            release()
            sdir = self.work / f"plain-{key}"
            sdir.mkdir()

            def psave(i: int, budget: int = budget, sdir: Path = sdir) -> Any:
                path = sdir / f"c{i}"
                return pk.save(self.state, str(path), blocking=False,
                               max_device_snapshot_bytes=budget)
            try:
                blocked, handles = self.blocked_saves(n, psave, lambda h: h.wait())
            except TypeError as e:
                if "max_device_snapshot_bytes" not in str(e):
                    raise
                ids = ["snap_later", "snap_first"] if key == "snap" else ["ring_later"]
                self.rows.note_all(ids, "not measured: this pyckpt's save() takes no "
                                        "max_device_snapshot_bytes")
                continue
            finally:
                shutil.rmtree(sdir, ignore_errors=True)
            later = statistics.median(blocked[1:])
            route = describe_staging(handles[-1])
            self.vs_d2h(f"{key}_later", later, d2h, blocked, route)
            if key == "snap":
                self.rows.add("snap_first", measured=secs(blocked[0]), ref=f"later {secs(later)}",
                              ratio=blocked[0] / later, note=describe_staging(handles[0]))
        release()

    def vs_d2h(self, id: str, own: float, d2h: float | None, seconds: list,
               note: str = "") -> None:
        if d2h is None:
            self.rows.add(id, measured=secs(own), note=NO_CUDA + (f"; {note}" if note else ""),
                          seconds=seconds)
            return
        self.rows.add(id, measured=secs(own), ref=f"pinned D2H {secs(d2h)}", ratio=own / d2h,
                      note=note, seconds=seconds)

    # -- 4. pinned budget ------------------------------------------------------------------
    def section_budget(self) -> None:
        pk, torch = self.pyckpt, self.torch
        state = self.bg.build_state(int(self.args.budget_state_gb * GiB), self.args.layers,
                                    self.dev, 1)
        nbytes = sum(t.numel() * t.element_size() for t in state.values())
        budget = int(self.args.budget_mb * MiB)
        d2h = None
        if self.cuda:
            pinned = {k: torch.empty(t.shape, dtype=t.dtype, pin_memory=True)
                      for k, t in state.items()}
            ts = [self.timed(lambda: self.d2h(state, pinned)) for _ in range(4)]
            d2h = statistics.median(ts[1:])
            del pinned
        bdir = self.work / "budget"
        bdir.mkdir()

        def step() -> None:
            with torch.no_grad():
                for t in state.values():
                    t.add_(1.0)

        def saves(n: int, limit: int | None) -> tuple[list[float], list[int]]:
            blocked, rss = [], []
            pk.device.release_staging_memory()
            for i in range(n):
                self.sync()
                t0 = time.perf_counter()
                h = pk.save(state, str(bdir / f"c{i % 2}"), blocking=False, max_pinned_bytes=limit)
                self.stream_sync()
                blocked.append(time.perf_counter() - t0)
                step()  # the training goes on while the save drains
                h.wait()
                rss.append(rss_bytes())
                shutil.rmtree(bdir / f"c{(i + 1) % 2}", ignore_errors=True)
            return blocked, rss

        try:
            blocked, rss = saves(self.args.budget_saves, budget)
            full, _ = saves(3, None)
        finally:
            shutil.rmtree(bdir, ignore_errors=True)
            pk.device.release_staging_memory()
        growth = rss[-1] - rss[1] if len(rss) > 1 else 0
        self.rows.add("budget_rss", measured=f"{growth / MiB:+.1f} MiB (saves 2..{len(rss)})",
                      ref=f"64 MiB; state {nbytes / GiB:.2f} GiB, budget {budget / MiB:.0f} MiB",
                      ratio=max(growth, 0) / (64 * MiB), rss=rss)
        later = statistics.median(blocked[1:])
        full_later = statistics.median(full[1:])
        if d2h is None:
            self.rows.add("budget_blocked", measured=secs(later),
                          ref=f"full pool {secs(full_later)}", note=NO_CUDA, seconds=blocked)
        else:
            self.rows.add("budget_blocked", measured=secs(later),
                          ref=f"D2H {secs(d2h)}; full pool {secs(full_later)}",
                          ratio=later / d2h, seconds=blocked, full_seconds=full)

    # -- 5. in-memory copies ---------------------------------------------------------------
    def copy_rows(self, prefix: str, src_tree: Any, dst_tree: Any, srcs: list, dsts: list,
                  ck_src: Any, ck_dst: Any) -> None:
        torch, pk = self.torch, self.pyckpt
        reps = self.args.copy_reps
        snap = ck_src.snapshot()

        def foreach() -> None:
            with torch.no_grad():
                torch._foreach_copy_(dsts, srcs)

        def take() -> None:
            nonlocal snap
            snap = None  # the old snapshot's memory is given back first
            snap = ck_src.snapshot()

        fns = {"foreach": foreach, "copy_state": lambda: pk.copy_state(src_tree, dst_tree),
               "snapshot": take, "restore": lambda: ck_dst.restore(snap)}
        t: dict[str, list[float]] = {k: [] for k in fns}
        for _ in range(reps):
            for k, fn in fns.items():
                t[k].append(self.timed(fn))
        for d, s in zip(dsts, srcs):
            if not torch.equal(d, s):
                raise AssertionError(f"{prefix}: a destination differs from its source")
        ref = steady(t["foreach"])
        for k in ("copy_state", "snapshot", "restore"):
            own = steady(t[k])
            self.rows.add(prefix + k, measured=secs(own), ref=f"_foreach_copy_ {secs(ref)}",
                          ratio=own / ref, seconds=t[k], ref_seconds=t["foreach"])

    def section_copies(self) -> None:
        torch, pk = self.torch, self.pyckpt
        dst = {k: torch.zeros_like(t) for k, t in self.state.items()}
        keys = list(self.state)
        self.copy_rows("", self.state, dst, [self.state[k] for k in keys], [dst[k] for k in keys],
                       pk.Checkpoint(state=self.state), pk.Checkpoint(state=dst))
        del dst
        d = max(64, int((self.args.seq_mb * MiB / 4 / 16) ** 0.5) // 64 * 64)
        torch.manual_seed(3)

        def seq() -> Any:
            return torch.nn.Sequential(*[torch.nn.Linear(d, d) for _ in range(16)]).to(self.dev)

        a, b = seq(), seq()
        pa, pb = list(a.parameters()), list(b.parameters())
        self.copy_rows("seq_", a, b, [p.detach() for p in pa], [p.detach() for p in pb],
                       pk.Checkpoint(model=a), pk.Checkpoint(model=b))

    # -- 6. cold loads ---------------------------------------------------------------------
    def section_cold(self) -> None:
        ids = ["load_cold", "load_cold_peer"]
        if self.ckpt is None or self.raw is None:
            raise RuntimeError("needs the save section's checkpoint and raw files")
        note = ""
        if self.args.dry_run:
            drop = lambda: None  # noqa: E731 - never drop a shared machine's cache
            note = "dry run: page cache NOT dropped"
        else:
            ok, why = self.h.can_drop_caches()
            if not ok:
                self.rows.note_all(ids, f"skipped: cannot drop the page cache ({why})")
                return
            drop = self.h.drop_caches
        torch = self.torch
        into = {k: torch.zeros_like(t) for k, t in self.state.items()}
        read_into = self.h.touched_like(self.host)
        ckpt = str(self.ckpt)
        t: dict[str, list[float]] = {"own": [], "raw": [], "st": []}
        for r in range(self.args.cold_rounds):
            drop()
            t["own"].append(self.timed(lambda: self.pyckpt.load(ckpt, into=into)))
            if r == 0:
                self.same(into, "cold load(into=)")
            drop()
            t["raw"].append(self.timed(lambda: self.bg.raw_read_into(self.raw, read_into,
                                                                     self.threads)))
            if self.st_file is not None:
                drop()
                t["st"].append(self.timed(lambda: self.st.load_file(str(self.st_file),
                                                                    device=str(self.dev))))
        own, raw = statistics.median(t["own"]), statistics.median(t["raw"])
        gbs = f"{secs(own)} ({self.nbytes / own / 1e9:.2f} GB/s)"
        self.rows.add("load_cold", measured=gbs, ref=f"preadv x{self.threads} cold {secs(raw)}",
                      ratio=raw / own, note=note, seconds=t["own"], raw_seconds=t["raw"])
        if t["st"]:
            st = statistics.median(t["st"])
            self.rows.add("load_cold_peer", measured=gbs, ref=f"safetensors cold {secs(st)}",
                          ratio=st / own, note=note, peer_seconds=t["st"])
        else:
            self.rows.add("load_cold_peer", note="safetensors not installed")

    def close(self) -> None:
        shutil.rmtree(self.work, ignore_errors=True)


@contextlib.contextmanager
def patched_env(env: dict[str, str]):
    old = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        yield
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def describe_staging(handle: Any) -> str:
    """What a background save used, as its handle reports it (``staging``), if it does."""
    rep = getattr(handle, "staging", None)
    if rep is None:
        return ""
    if dataclasses.is_dataclass(rep) and not isinstance(rep, type):
        parts = []
        for k, v in dataclasses.asdict(rep).items():
            if k.endswith("_bytes") and isinstance(v, int):
                if v:
                    parts.append(f"{k[:-6]} {v / MiB:.0f} MiB")
            elif not k.endswith("seconds"):
                parts.append(f"{k}={v}")
        return "staging: " + ", ".join(parts)
    return f"staging: {rep}"[:80]


SECTIONS = {  # in the order they run by default (the quick ones first)
    "save": ("section_save", ["save"]),
    "load": ("section_load", ["load_peer", "load_limit", "load_deep1", "load_deep2"]),
    "copies": ("section_copies", ["copy_state", "snapshot", "restore", "seq_copy_state",
                                  "seq_snapshot", "seq_restore"]),
    "async": ("section_async", ["async_later", "async_first", "snap_later", "snap_first",
                                "ring_later"]),
    "budget": ("section_budget", ["budget_rss", "budget_blocked"]),
    "cold": ("section_cold", ["load_cold", "load_cold_peer"]),
}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--size-gb", type=float, default=None, help="state GiB (default 3.96: "
                   "4.25 GB in 1,162 tensors; 0.02 with --dry-run)")
    p.add_argument("--layers", type=int, default=None, help="layers (default 32; 4 dry)")
    p.add_argument("--rounds", type=int, default=3, help="rounds of the warm loads (3)")
    p.add_argument("--save-rounds", type=int, default=3, help="blocking saves (3)")
    p.add_argument("--async-saves", type=int, default=4, help="saves per background mode (4)")
    p.add_argument("--budget-state-gb", type=float, default=None, help="GiB (2; dry 0.01)")
    p.add_argument("--budget-mb", type=float, default=None, help="max_pinned_bytes MiB (512)")
    p.add_argument("--budget-saves", type=int, default=10, help="saves under the budget (10)")
    p.add_argument("--copy-reps", type=int, default=10, help="repetitions of each copy (10)")
    p.add_argument("--seq-mb", type=float, default=None, help="nn.Sequential MiB (1024)")
    p.add_argument("--cold-rounds", type=int, default=2, help="rounds of the cold loads (2)")
    p.add_argument("--threads", type=int, default=0, help="threads of the raw limits "
                   "(default: the usable cores)")
    p.add_argument("--sections", default=",".join(SECTIONS),
                   help=f"comma-separated, in order (default {','.join(SECTIONS)})")
    p.add_argument("--dir", default=None, help="work directory (default: under /tmp)")
    p.add_argument("--rows", default=None, help="JSON-lines file the rows are appended to")
    p.add_argument("--jax-json", default=None, help="bench_jax_restore.py's JSON")
    p.add_argument("--deadline", type=float, default=None, metavar="S",
                   help="start no section later than S seconds after the start")
    p.add_argument("--dry-run", action="store_true",
                   help="host tensors, tiny sizes, no cache drop (checks the script)")
    p.add_argument("--summarize", default=None, metavar="ROWS",
                   help="only print the table of a rows file (no torch needed)")
    p.add_argument("--note", action="append", default=[], metavar="ID=TEXT",
                   help="--summarize: why row ID has no figure (when it has none)")
    a = p.parse_args(argv)
    dry = a.dry_run
    a.size_gb = a.size_gb if a.size_gb is not None else (0.02 if dry else 3.96)
    a.layers = a.layers if a.layers is not None else (4 if dry else 32)
    a.budget_state_gb = a.budget_state_gb if a.budget_state_gb is not None else \
        (0.01 if dry else 2.0)
    a.budget_mb = a.budget_mb if a.budget_mb is not None else (1 if dry else 512)
    a.seq_mb = a.seq_mb if a.seq_mb is not None else (4 if dry else 1024)
    if dry:
        a.rounds, a.save_rounds, a.async_saves = min(a.rounds, 2), min(a.save_rounds, 2), 3
        a.budget_saves, a.copy_reps, a.cold_rounds = min(a.budget_saves, 3), 2, 1
    return a


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.summarize:
        rows = load_rows(args.summarize)
        rows.update(jax_rows(args.jax_json))
        for note in args.note:
            id, _, text = note.partition("=")
            if id not in SPEC:
                raise SystemExit(f"--note: no row {id!r}")
            rows.setdefault(id, {"id": id, "note": text})
        print_summary(rows)
        return 0
    try:
        import torch
    except ImportError:
        print("torch is not importable: nothing to measure", file=sys.stderr)
        return 1
    if not torch.cuda.is_available() and not args.dry_run:
        print("no CUDA: running the dry run (host tensors, tiny sizes)", flush=True)
        args = parse_args((argv if argv is not None else sys.argv[1:]) + ["--dry-run"])
    if args.rows:
        Path(args.rows).parent.mkdir(parents=True, exist_ok=True)
        Path(args.rows).write_text("")
    rows = Rows(args.rows)
    t_start = time.perf_counter()
    bench = Bench(args, rows)
    failed = 0
    try:
        for name in [s.strip() for s in args.sections.split(",") if s.strip()]:
            if name not in SECTIONS:
                raise SystemExit(f"--sections: no section {name!r} ({', '.join(SECTIONS)})")
            method, ids = SECTIONS[name]
            t0 = time.perf_counter()
            if args.deadline is not None and t0 - t_start > args.deadline:
                rows.note_all(ids, f"skipped: past --deadline {args.deadline:g} s")
                continue
            print(f"== {name} ({t0 - t_start:.0f} s in)", flush=True)
            try:
                getattr(bench, method)()
            except Exception as e:  # noqa: BLE001 - the row says it; the next section runs
                failed += 1
                traceback.print_exc()
                rows.note_all(ids, f"error: {type(e).__name__}: {str(e)[:80]}")
            print(f"   {name}: {time.perf_counter() - t0:.1f} s", flush=True)
    finally:
        bench.close()
    all_rows = dict(rows.rows)
    all_rows.update(jax_rows(args.jax_json))
    if "jax_restore" not in all_rows:
        all_rows["jax_restore"] = {"note": "not here: gpu_session.sh runs bench_jax_restore.py"}
    print_summary(all_rows, "dry run: host tensors, tiny sizes" if args.dry_run else
                  f"{torch.cuda.get_device_name(bench.dev)}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
