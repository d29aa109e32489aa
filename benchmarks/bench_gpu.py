#!/usr/bin/env python3
"""GPU-resident state: pyckpt against the device and disk limits and its peers (issue 12).

One run (interleaved rounds, rotating order, a ballast touched before every timed
operation; see harness.py) on a GPT-like state held as CUDA tensors (params + Adam m
and v + the step; ~4 GiB in 1,162 tensors by default) measures:

* LIMITS: pinned device-to-host and host-to-device copies of every tensor into / from
  preallocated pinned buffers; N-thread pwrite+fsync of host copies and warm N-thread
  preadv into preallocated host arrays (for each N of --limit-threads; the best N is
  the limit);
* SAVE (durable): pyckpt.save, pyckpt.save(blocking=False) 1st / 2nd / 3rd call of a
  round (call to durable), torch.save, safetensors save_file, DCP save, DCP async_save
  (default stager, and a pinned, cached DefaultStager reused by the 3 saves of a round);
* SAVE, time the caller is blocked: the async saves from their call until the caller's
  stream may run again;
* LOAD onto the device: pyckpt.load(into=CUDA tensors), pyckpt.load(device=),
  torch.load(map_location=), safetensors load_file(device=), DCP load into CUDA tensors,
  fastsafetensors (if installed);
* DEVICE COPIES: pyckpt.copy_state, Checkpoint.snapshot(), snapshot(into=),
  Checkpoint.restore(snapshot) against torch._foreach_copy_;
* MEMORY (one more, untimed run of everything): peak RSS increase, pinned host memory in
  use, device memory, per method;

then checks the issue's targets. Without CUDA (``--device cpu``, automatic) it runs what
can run on host tensors (disk limits, pyckpt, torch, safetensors, DCP, copies) and marks
the GPU-only rows "not measured (no CUDA)". See benchmarks/README.md.
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import statistics
import sys
import time
import warnings
from pathlib import Path
from typing import Any, Callable

import numpy as np

from harness import (GiB, MiB, PeakMemory, Results, Step, Group, apply_torch_threads, compare,
                     fsync_path, import_pyckpt, machine_header, make_workdir, median_of,
                     no_pyckpt, optional_import, parse, parser, print_errors, print_plan,
                     raw_pwrite, run_interleaved, run_threads, state_text, usable_cpus,
                     version_of, write_report, RawFiles)
from model_state import describe_state

pyckpt = import_pyckpt()
torch = optional_import("torch")
dcp = optional_import("torch.distributed.checkpoint") if torch is not None else None
dcp_staging = optional_import("torch.distributed.checkpoint.staging") if dcp is not None else None
safetensors_torch = optional_import("safetensors.torch") if torch is not None else None
fastsafetensors = optional_import("fastsafetensors") if torch is not None else None
pyckpt_device = optional_import("pyckpt.device") if pyckpt is not None else None
staging_buffers = optional_import("pyckpt.device.buffers") if pyckpt is not None else None

# DCP warns that it runs without a process group: that is what we want here.
warnings.filterwarnings("ignore", message=r".*torch\.distributed is disabled.*")
warnings.filterwarnings("ignore", message=r".*process group.*", category=UserWarning)

# phases
LIMITS = "limits"
SAVE = "save (durable)"
BLOCKED = "save: caller blocked"
LOAD = "load onto the device"
COPIES = "device copies"
PHASES = (LIMITS, SAVE, BLOCKED, LOAD, COPIES)

# rows
D2H = "pinned D2H (all tensors)"
H2D = "pinned H2D (all tensors)"
PY_SAVE = "pyckpt.save"
PY_INTO = "pyckpt.load(into=)"
PY_DEVICE = "pyckpt.load(device=)"
TORCH_SAVE = "torch.save"
TORCH_LOAD = "torch.load(map_location=)"
ST_SAVE = "safetensors save_file"
ST_LOAD = "safetensors load_file(device=)"
FST_LOAD = "fastsafetensors (into)"
DCP_SAVE = "DCP save"
DCP_LOAD = "DCP load(into)"
DCP_ASYNC = "DCP async_save"
FOREACH = "torch._foreach_copy_"
COPY_STATE = "pyckpt.copy_state"
SNAP = "Checkpoint.snapshot()"
SNAP_INTO = "snapshot(into=)"
RESTORE = "restore(snapshot)"
ASYNC_SAVES = 3  # async saves per round: the 1st pays for pinning, the next ones reuse


def py_async(i: int) -> str:
    return f"pyckpt async #{i}"


def dcp_pinned(i: int) -> str:
    return f"DCP async_save pinned #{i}"


def pwrite_row(n: int) -> str:
    return f"pwrite+fsync x{n}"


def preadv_row(n: int) -> str:
    return f"preadv warm x{n}"


LIMIT_SAVE = "pwrite+fsync limit (best N)"
LIMIT_READ = "host read limit (best N)"
LIMIT_LOAD = "min(host read, pinned H2D)"
NO_CUDA = "not measured (no CUDA)"
SLACK = 64 * MiB

# ---------------------------------------------------------------------------
# the state: a GPT-like model with Adam m and v, as tensors on the device
# ---------------------------------------------------------------------------


def gpt_shapes(total_bytes: int, n_layers: int) -> dict[str, tuple[int, ...]]:
    """model_state.state_shapes's transformer with ``n_layers`` layers: params are ~1/3 of
    ``total_bytes``; an embedding table, 4 matrices and 8 vectors per layer, a final norm."""
    param_floats = max(total_bytes // 3 // 4, 1 << 16)
    d = max(64, int((0.8 * param_floats / (12 * n_layers)) ** 0.5) // 64 * 64)
    shapes: dict[str, tuple[int, ...]] = {}
    for i in range(n_layers):
        p = f"layers.{i}"
        shapes.update({f"{p}.attn.qkv.weight": (d, 3 * d), f"{p}.attn.qkv.bias": (3 * d,),
                       f"{p}.attn.out.weight": (d, d), f"{p}.attn.out.bias": (d,),
                       f"{p}.mlp.fc1.weight": (d, 4 * d), f"{p}.mlp.fc1.bias": (4 * d,),
                       f"{p}.mlp.fc2.weight": (4 * d, d), f"{p}.mlp.fc2.bias": (d,)})
        for ln in ("ln1", "ln2"):
            shapes[f"{p}.{ln}.weight"] = (d,)
            shapes[f"{p}.{ln}.bias"] = (d,)
    shapes["final_ln.weight"] = (d,)
    shapes["final_ln.bias"] = (d,)
    used = sum(int(np.prod(s)) for s in shapes.values())
    vocab = max(256, (param_floats - used) // d)
    return {"embed.weight": (vocab, d), **shapes}


def build_state(total_bytes: int, n_layers: int, dev: Any, seed: int) -> dict:
    """``params.*``, ``adam.m.*``, ``adam.v.*`` (float32, made on ``dev`` from a seeded
    generator) and ``adam.step`` (0-d): 3 x (12 x layers + 3) + 1 tensors."""
    shapes = gpt_shapes(total_bytes, n_layers)
    g = torch.Generator(device=dev)
    g.manual_seed(seed)
    state: dict = {}
    with torch.no_grad():
        for name, shape in shapes.items():
            state[f"params.{name}"] = torch.randn(shape, generator=g, device=dev)
        for name, shape in shapes.items():
            state[f"adam.m.{name}"] = torch.randn(shape, generator=g, device=dev).mul_(1e-3)
        for name, shape in shapes.items():
            v = torch.randn(shape, generator=g, device=dev)
            state[f"adam.v.{name}"] = v.square_().mul_(1e-6)
        state["adam.step"] = torch.tensor(1000.0, device=dev)
    return state


# ---------------------------------------------------------------------------
# context: everything prepared once, outside any timing
# ---------------------------------------------------------------------------


@dataclasses.dataclass
class Context:
    dev: Any                        # torch.device
    cuda: bool
    state: dict                     # key -> tensor on dev
    host: dict[str, np.ndarray]     # host copies (views of the state on cpu)
    nbytes: int
    into: dict                      # zeroed tensors on dev: targets of the into= loads, H2D
    copy_dst: dict                  # tensors on dev: targets of copy_state / restore
    read_into: dict[str, np.ndarray]  # touched host arrays: targets of the preadv limit
    pinned: dict | None             # pinned host tensors (D2H / H2D limits), CUDA only
    dcp_threads: int
    rec: Results | None = None      # where steps record their extra rows (None: nowhere)
    rnd: int = 0
    notes: dict[str, str] = dataclasses.field(default_factory=dict)   # row -> why no figure
    returned: dict[str, list] = dataclasses.field(default_factory=dict)  # async: call returned
    into_ptrs: dict = dataclasses.field(default_factory=dict)
    dst_ptrs: dict = dataclasses.field(default_factory=dict)
    ckpt_src: Any = None
    ckpt_dst: Any = None
    snap: Any = None
    stager: Any = None

    def sync(self) -> None:
        """Waits for all queued device work (CUDA); part of every timed device step."""
        if self.cuda:
            torch.cuda.synchronize(self.dev)

    def stream_sync(self) -> None:
        """Waits until the caller's current stream is idle: the point from which a kernel
        queued after the call would run."""
        if self.cuda:
            torch.cuda.current_stream(self.dev).synchronize()

    def record(self, phase: str, name: str, seconds: float) -> None:
        if self.rec is not None:
            self.rec.add(phase, name, self.rnd, seconds)


def make_context(state: dict, dev: Any, dcp_threads: int) -> Context:
    cuda = dev.type == "cuda"
    host = {k: (t.cpu().numpy() if cuda else t.numpy()) for k, t in state.items()}
    into = {k: torch.zeros_like(t) for k, t in state.items()}
    copy_dst = {k: torch.zeros_like(t) for k, t in state.items()}
    read_into = {}
    for k, a in host.items():
        b = np.empty_like(a)
        b.fill(0)
        read_into[k] = b
    pinned = None
    if cuda:
        pinned = {k: torch.empty(t.shape, dtype=t.dtype, pin_memory=True) for k, t in state.items()}
        for k, t in state.items():
            pinned[k].copy_(t)
    ctx = Context(dev, cuda, state, host, sum(a.nbytes for a in host.values()), into, copy_dst,
                  read_into, pinned, dcp_threads)
    ctx.into_ptrs = {k: t.data_ptr() for k, t in into.items()}
    ctx.dst_ptrs = {k: t.data_ptr() for k, t in copy_dst.items()}
    if cuda:
        torch.cuda.synchronize(dev)
    return ctx


# ---------------------------------------------------------------------------
# checks (untimed, round 1 only)
# ---------------------------------------------------------------------------


def check_tensors(result: Any, ctx: Context, ptrs: dict | None = None) -> None:
    """``result`` (a dict of tensors) holds the state's keys, values, dtypes, on its device;
    with ``ptrs``, every tensor is still the one at the same address (filled in place)."""
    if not isinstance(result, dict) or set(result) != set(ctx.state):
        got = sorted(result)[:3] if isinstance(result, dict) else type(result).__name__
        raise AssertionError(f"loaded keys differ from the state's: {got}")
    for k, ref in ctx.state.items():
        t = result[k]
        if not isinstance(t, torch.Tensor):
            raise AssertionError(f"{k!r}: a {type(t).__name__}, not a torch.Tensor")
        if t.device != ref.device:
            raise AssertionError(f"{k!r} is on {t.device}, not {ref.device}")
        if t.dtype != ref.dtype or tuple(t.shape) != tuple(ref.shape) or not torch.equal(t, ref):
            raise AssertionError(f"{k!r} differs from the state")
        if ptrs is not None and t.data_ptr() != ptrs[k]:
            raise AssertionError(f"{k!r} was replaced, not filled in place")


def check_saved(path: Any, ctx: Context) -> None:
    """A pyckpt checkpoint at ``path`` holds the state (read back to host memory)."""
    loaded = pyckpt.load(str(path))
    for k, a in ctx.host.items():
        b = np.asarray(loaded[k])
        if b.shape != a.shape or b.dtype != a.dtype or not np.array_equal(a, b):
            raise AssertionError(f"saved {k!r} differs from the state")


def zero(tensors: dict) -> None:
    with torch.no_grad():
        for t in tensors.values():
            t.zero_()


# ---------------------------------------------------------------------------
# helpers: durability, raw reads
# ---------------------------------------------------------------------------


def fsync_tree(root: Any) -> None:
    """fsync every file under ``root``, then every directory (deepest first)."""
    dirs = []
    for dirpath, _, files in os.walk(root):
        dirs.append(dirpath)
        for name in files:
            fsync_path(os.path.join(dirpath, name))
    for d in reversed(dirs):
        fsync_path(d)


def _preadv_all(fd: int, view: memoryview, offset: int) -> None:
    while view:
        n = os.preadv(fd, [view], offset)
        if n == 0:
            raise EOFError("short file")
        view, offset = view[n:], offset + n


def raw_read_into(h: RawFiles, out: dict[str, np.ndarray], threads: int) -> None:
    """Each of ``threads`` threads preadv's its file of ``h`` into the preallocated arrays."""
    def part(i: int) -> None:
        fd = os.open(h.files[i], os.O_RDONLY)
        try:
            for key, offset, _, _ in h.plans[i]:
                _preadv_all(fd, memoryview(out[key]).cast("B"), offset)
        finally:
            os.close(fd)

    run_threads(part, threads)


# ---------------------------------------------------------------------------
# groups: each runs its steps in order within a round; outputs removed after
# ---------------------------------------------------------------------------


class Dirs:
    """A fresh directory per group and round under ``workdir`` (removed after the group)."""

    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir
        self.current: dict[str, Path] = {}

    def hooks(self, ctx: Context, key: str, setup: Callable[[int], None] | None = None,
              teardown: Callable[[int], None] | None = None) -> dict:
        slug = "".join(c if c.isalnum() else "_" for c in key)

        def _setup(rnd: int) -> None:
            ctx.rnd = rnd
            path = self.workdir / f"r{rnd}-{slug}"
            shutil.rmtree(path, ignore_errors=True)
            path.mkdir(parents=True)
            self.current[key] = path
            if setup is not None:
                setup(rnd)

        def _teardown(rnd: int) -> None:
            try:
                if teardown is not None:
                    teardown(rnd)
            finally:
                shutil.rmtree(self.current.pop(key), ignore_errors=True)

        return {"setup": _setup, "teardown": _teardown}

    def __getitem__(self, key: str) -> Path:
        return self.current[key]


def synced(ctx: Context, prepare: Callable[[int], None] | None = None) -> Callable[[int], None]:
    """A Step's prepare: ``prepare`` (if any), then wait for the device to be idle."""
    def run(rnd: int) -> None:
        if prepare is not None:
            prepare(rnd)
        ctx.sync()
    return run


def zero_on_first(ctx: Context, tensors: dict) -> Callable[[int], None]:
    return synced(ctx, lambda rnd: zero(tensors) if rnd == 0 else None)


def limit_groups(ctx: Context, dirs: Dirs, threads: list[int]) -> list[Group]:
    groups = []
    if ctx.cuda:
        def d2h():
            for k, t in ctx.state.items():
                ctx.pinned[k].copy_(t, non_blocking=True)
            ctx.sync()
            return ctx.pinned

        def h2d():
            for k, t in ctx.into.items():
                t.copy_(ctx.pinned[k], non_blocking=True)
            ctx.sync()
            return ctx.into

        groups.append(Group(D2H, [Step(D2H, LIMITS, d2h, prepare=synced(ctx),
                                       check=lambda r: check_tensors(
                                           {k: v.to(ctx.dev) for k, v in r.items()}, ctx))],
                            setup=lambda rnd: setattr(ctx, "rnd", rnd)))
        groups.append(Group(H2D, [Step(H2D, LIMITS, h2d, prepare=zero_on_first(ctx, ctx.into),
                                       check=lambda r: check_tensors(r, ctx, ctx.into_ptrs))],
                            setup=lambda rnd: setattr(ctx, "rnd", rnd)))
    else:
        ctx.notes[D2H] = ctx.notes[H2D] = NO_CUDA
    for n in threads:
        key = f"raw x{n}"
        handle: dict = {}

        def write(n=n, key=key, handle=handle):
            handle["h"] = raw_pwrite(ctx.host, dirs[key] / "raw", n)
            return handle["h"]

        def read(n=n, handle=handle):
            raw_read_into(handle["h"], ctx.read_into, n)
            return ctx.read_into

        def check_read(r):
            for k, a in ctx.host.items():
                if not np.array_equal(a, r[k]):
                    raise AssertionError(f"preadv limit read {k!r} wrong")

        def clear_read(rnd):
            if rnd == 0:
                for a in ctx.read_into.values():
                    a.fill(0)

        groups.append(Group(key, [Step(pwrite_row(n), LIMITS, write),
                                  Step(preadv_row(n), LIMITS, read, prepare=clear_read,
                                       check=check_read)],
                            **dirs.hooks(ctx, key)))
    return groups


def pyckpt_groups(ctx: Context, dirs: Dirs) -> list[Group]:
    dev = str(ctx.dev)

    def save():
        path = dirs["pyckpt"] / "ckpt"
        pyckpt.save(ctx.state, str(path))  # durable on return
        return path

    def load_into():
        pyckpt.load(str(dirs["pyckpt"] / "ckpt"), into=ctx.into)
        ctx.sync()
        return ctx.into

    def load_device():
        out = pyckpt.load(str(dirs["pyckpt"] / "ckpt"), device=dev)
        ctx.sync()
        return out

    blocking = Group("pyckpt", [
        Step(PY_SAVE, SAVE, save, prepare=synced(ctx), check=lambda p: check_saved(p, ctx)),
        Step(PY_INTO, LOAD, load_into, prepare=zero_on_first(ctx, ctx.into), required=False,
             check=lambda r: check_tensors(r, ctx, ctx.into_ptrs), meta={"kind": "into"}),
        Step(PY_DEVICE, LOAD, load_device, prepare=synced(ctx), required=False,
             check=lambda r: check_tensors(r, ctx), meta={"kind": "fresh"}),
    ], **dirs.hooks(ctx, "pyckpt"))

    def async_save(i: int):
        def run():
            path = dirs["pyckpt async"] / f"ckpt-{i}"
            t0 = time.perf_counter()
            pending = pyckpt.save(ctx.state, str(path), blocking=False)
            t1 = time.perf_counter()
            ctx.stream_sync()
            t2 = time.perf_counter()
            if not hasattr(pending, "wait"):
                raise TypeError(f"save(blocking=False) returned {type(pending).__name__}, "
                                "not a PendingSave")
            pending.wait()
            ctx.record(BLOCKED, py_async(i), t2 - t0)
            if ctx.rec is not None:
                ctx.returned.setdefault(py_async(i), []).append(t1 - t0)
            return path
        return run

    def release(rnd: int) -> None:
        release_staging()  # the 1st save of every round allocates (and pins) them again

    steps = [Step(py_async(i), SAVE, async_save(i), prepare=synced(ctx),
                  check=lambda p: check_saved(p, ctx), meta={"kind": "async"})
             for i in range(1, ASYNC_SAVES + 1)]
    return [blocking, Group("pyckpt async", steps, **dirs.hooks(ctx, "pyckpt async", release))]


def peer_groups(ctx: Context, dirs: Dirs) -> list[Group]:
    groups = []
    dev = str(ctx.dev)
    if torch is not None:
        def t_save():
            f = dirs["torch"] / "model.pt"
            torch.save(ctx.state, str(f))
            fsync_tree(dirs["torch"])
            return f

        def t_load():
            out = torch.load(str(dirs["torch"] / "model.pt"), map_location=dev, weights_only=True)
            ctx.sync()
            return out

        groups.append(Group("torch", [
            Step(TORCH_SAVE, SAVE, t_save, prepare=synced(ctx)),
            Step(TORCH_LOAD, LOAD, t_load, prepare=synced(ctx), required=False,
                 check=lambda r: check_tensors(r, ctx), meta={"kind": "fresh"})],
            **dirs.hooks(ctx, "torch")))

    if safetensors_torch is not None:
        def s_save():
            f = dirs["safetensors"] / "model.safetensors"
            safetensors_torch.save_file(ctx.state, str(f))
            fsync_tree(dirs["safetensors"])
            return f

        def s_load():
            out = safetensors_torch.load_file(str(dirs["safetensors"] / "model.safetensors"),
                                              device=dev)
            ctx.sync()
            return out

        steps = [Step(ST_SAVE, SAVE, s_save, prepare=synced(ctx)),
                 Step(ST_LOAD, LOAD, s_load, prepare=synced(ctx), required=False,
                      check=lambda r: check_tensors(r, ctx), meta={"kind": "fresh"})]
        if fastsafetensors is not None and ctx.cuda:
            def fst_load():
                f = dirs["safetensors"] / "model.safetensors"
                loader = fastsafetensors.SafeTensorsFileLoader(
                    fastsafetensors.SingleGroup(), ctx.dev, nogds=True)
                try:
                    loader.add_filenames({0: [str(f)]})
                    fb = loader.copy_files_to_device()
                    try:
                        for k, t in ctx.into.items():
                            t.copy_(fb.get_tensor(k))
                        ctx.sync()
                    finally:
                        fb.close()
                finally:
                    loader.close()
                return ctx.into

            steps.append(Step(FST_LOAD, LOAD, fst_load, prepare=zero_on_first(ctx, ctx.into),
                              required=False, meta={"kind": "into"},
                              check=lambda r: check_tensors(r, ctx, ctx.into_ptrs)))
        else:
            ctx.notes[FST_LOAD] = ("not installed" if fastsafetensors is None else NO_CUDA)
        groups.append(Group("safetensors", steps, **dirs.hooks(ctx, "safetensors")))
    else:
        ctx.notes[ST_SAVE] = ctx.notes[ST_LOAD] = "safetensors not installed"
        ctx.notes[FST_LOAD] = "not installed" if fastsafetensors is None else "needs safetensors"

    if dcp is None:
        for n in [DCP_SAVE, DCP_LOAD, DCP_ASYNC, *map(dcp_pinned, range(1, ASYNC_SAVES + 1))]:
            ctx.notes[n] = "torch.distributed.checkpoint not importable"
        return groups
    from torch.distributed.checkpoint import FileSystemReader, FileSystemWriter

    def writer(path: Path):
        return FileSystemWriter(str(path), thread_count=ctx.dcp_threads, sync_files=True)

    def d_save():
        dcp.save(ctx.state, storage_writer=writer(dirs["DCP"] / "ckpt"))
        fsync_tree(dirs["DCP"])
        return dirs["DCP"]

    def d_load():
        dcp.load(ctx.into, storage_reader=FileSystemReader(str(dirs["DCP"] / "ckpt")))
        ctx.sync()
        return ctx.into

    groups.append(Group("DCP", [
        Step(DCP_SAVE, SAVE, d_save, prepare=synced(ctx)),
        Step(DCP_LOAD, LOAD, d_load, prepare=zero_on_first(ctx, ctx.into), required=False,
             check=lambda r: check_tensors(r, ctx, ctx.into_ptrs), meta={"kind": "into"})],
        **dirs.hooks(ctx, "DCP")))

    def d_async(name: str, stager: bool, i: int = 0):
        def run():
            path = dirs[name] / f"ckpt-{i}"
            kw = {"async_stager": ctx.stager} if stager else {}
            t0 = time.perf_counter()
            resp = dcp.async_save(ctx.state, storage_writer=writer(path), **kw)
            staged = getattr(resp, "staging_completion", None)
            if staged is not None:
                staged.result()  # the caller may change the state only after this
            t1 = time.perf_counter()
            ctx.stream_sync()
            t2 = time.perf_counter()
            upload = getattr(resp, "upload_completion", resp)
            upload.result()
            fsync_tree(path)
            row = dcp_pinned(i) if stager else DCP_ASYNC
            ctx.record(BLOCKED, row, t2 - t0)
            if ctx.rec is not None:
                ctx.returned.setdefault(row, []).append(t1 - t0)
            return path
        return run

    groups.append(Group(DCP_ASYNC, [Step(DCP_ASYNC, SAVE, d_async(DCP_ASYNC, False),
                                         prepare=synced(ctx), meta={"kind": "async"})],
                        **dirs.hooks(ctx, DCP_ASYNC)))

    why = pinned_stager_unavailable(ctx)
    if why:
        for i in range(1, ASYNC_SAVES + 1):
            ctx.notes[dcp_pinned(i)] = why
        return groups
    key = "DCP async pinned"

    def new_stager(rnd: int) -> None:
        # a fresh stager per round: its 1st save pins, the next ones reuse its cache
        close_stager(ctx)
        st = dcp_staging
        ctx.stager = st.DefaultStager(st.StagingOptions(use_pinned_memory=True,
                                                        use_shared_memory=False,
                                                        use_async_staging=True,
                                                        use_non_blocking_copy=True))

    # torch 2.11 closes a DefaultStager at the end of each staging (pytorch#183413):
    # reused, it fails with KeyError; each save then gets a new stager, and pins again
    fresh = stager_not_reusable()
    if fresh:
        print(f"note    : {fresh}")
        ctx.notes["DCP async pinned (all saves)"] = fresh  # kept in the JSON report

    def per_save(i: int) -> Callable[[int], None]:
        return synced(ctx, new_stager if fresh and i > 1 else None)

    steps = [Step(dcp_pinned(i), SAVE, d_async(key, True, i), prepare=per_save(i),
                  meta={"kind": "async"}) for i in range(1, ASYNC_SAVES + 1)]
    groups.append(Group(key, steps, **dirs.hooks(ctx, key, new_stager,
                                                 lambda rnd: close_stager(ctx))))
    return groups


def stager_not_reusable() -> str | None:
    """Why DCP's DefaultStager cannot be reused across saves with this torch (None when
    it can): torch 2.11's DefaultStager closes its StateDictStager after every staging,
    dropping its cache of pinned buffers (pytorch/pytorch#183413)."""
    v = version_of(torch) or ""
    if v.startswith("2.11."):
        return ("torch 2.11 cannot reuse a DefaultStager (pytorch#183413): a new stager per "
                "save, pinned again (no cached DCP configuration exists on this torch)")
    return None


def pinned_stager_unavailable(ctx: Context) -> str | None:
    if dcp_staging is None or not all(hasattr(dcp_staging, n)
                                      for n in ("DefaultStager", "StagingOptions")):
        return (f"unavailable: torch {version_of(torch)} has no "
                "torch.distributed.checkpoint.staging.DefaultStager / StagingOptions")
    if not ctx.cuda:
        return "unavailable: pinned staging needs CUDA"
    try:
        import inspect
        params = inspect.signature(dcp.async_save).parameters
    except (TypeError, ValueError):
        params = {}
    if params and "async_stager" not in params:
        return f"unavailable: torch {version_of(torch)} async_save takes no async_stager"
    return None


def close_stager(ctx: Context) -> None:
    if ctx.stager is not None:
        try:
            ctx.stager.close()
        finally:
            ctx.stager = None


def copy_groups(ctx: Context) -> list[Group]:
    src_list = list(ctx.state.values())
    dst_list = [ctx.copy_dst[k] for k in ctx.state]

    def foreach():
        with torch.no_grad():
            torch._foreach_copy_(dst_list, src_list)
        ctx.sync()
        return ctx.copy_dst

    def copy_state():
        pyckpt.copy_state(ctx.state, ctx.copy_dst)
        ctx.sync()
        return ctx.copy_dst

    def snapshot():
        snap = ctx.ckpt_src.snapshot()
        ctx.sync()
        return snap

    def snapshot_into():
        ctx.snap = ctx.ckpt_src.snapshot(into=ctx.snap)
        ctx.sync()
        return ctx.snap

    def restore():
        ctx.ckpt_dst.restore(ctx.snap)
        ctx.sync()
        return ctx.copy_dst

    def check_snap(s):
        if len(s) != len(ctx.state) or s.nbytes != ctx.nbytes:
            raise AssertionError(f"snapshot holds {len(s)} values, {s.nbytes} bytes; the "
                                 f"state {len(ctx.state)}, {ctx.nbytes}")

    def setup(rnd: int) -> None:
        ctx.rnd = rnd
        if ctx.snap is None:  # the snapshot that snapshot(into=) refills and restore reads
            ctx.snap = ctx.ckpt_src.snapshot()
            ctx.sync()

    check_dst = lambda r: check_tensors(r, ctx, ctx.dst_ptrs)  # noqa: E731
    return [
        Group(FOREACH, [Step(FOREACH, COPIES, foreach, prepare=zero_on_first(ctx, ctx.copy_dst),
                             check=check_dst)], setup=setup),
        Group(COPY_STATE, [Step(COPY_STATE, COPIES, copy_state,
                                prepare=zero_on_first(ctx, ctx.copy_dst), check=check_dst)],
              setup=setup),
        Group("snapshots", [
            Step(SNAP, COPIES, snapshot, prepare=synced(ctx), check=check_snap, required=False),
            Step(SNAP_INTO, COPIES, snapshot_into, prepare=synced(ctx), check=check_snap,
                 required=False),
            Step(RESTORE, COPIES, restore, prepare=zero_on_first(ctx, ctx.copy_dst),
                 check=check_dst, required=False)], setup=setup),
    ]


# ---------------------------------------------------------------------------
# memory: one untimed run of every step, peak RSS / pinned / device memory
# ---------------------------------------------------------------------------


def _host_stats() -> dict:
    try:
        return torch.cuda.host_memory_stats()
    except Exception:  # noqa: BLE001 - older torch, or no CUDA
        return {}


def _pyckpt_pinned() -> int | None:
    """pyckpt's pinned host memory kept between calls (staging and bounce buffers)."""
    kept = getattr(pyckpt_device, "pinned_memory_kept", None) if pyckpt_device else None
    if kept is not None:
        return kept()
    shared = getattr(staging_buffers, "_SHARED", None) if staging_buffers is not None else None
    return getattr(shared, "pinned_bytes", None)


def _trim_heap() -> None:
    """Returns the C heap's free pages to the system (glibc), so that the RSS increase of
    the next step counts its own allocations, not only what earlier steps left unmapped."""
    try:
        import ctypes
        ctypes.CDLL(None).malloc_trim(0)
    except (OSError, AttributeError):
        pass


def release_staging() -> None:
    """Frees the staging buffers that plain pyckpt.save calls keep for the next save."""
    release = getattr(pyckpt_device, "release_staging_memory", None)
    if release is not None:
        release()


MEMORY_RUN = 99  # the "round" number of the memory run (its directories' names)


def pinned_share(ctx: Context) -> dict:
    """How much of a new pinned buffer shows in VmRSS and in RssAnon on this system
    (0..1 each): pinned memory is subtracted from the RSS figures by that much."""
    if not ctx.cuda:
        return {"rss": 0.0, "anon": 0.0}
    n = 64 * MiB
    _trim_heap()
    with PeakMemory() as pm:
        t = torch.empty(n, dtype=torch.uint8, pin_memory=True)
        t.fill_(1)
    del t
    m = pm.result()
    clip = lambda x: min(1.0, max(0.0, x / n))  # noqa: E731
    return {"rss": clip(m["peak_rss_increase_bytes"]), "anon": clip(m["peak_anon_increase_bytes"])}


def measure_step(s: Step, ctx: Context, base_active: int, share: dict) -> dict:
    """One untimed call of ``s`` (module doc of measure_memory)."""
    if s.prepare is not None:
        s.prepare(1)
    _trim_heap()
    hs0, py0 = _host_stats(), _pyckpt_pinned() or 0
    if ctx.cuda:
        try:
            torch.cuda.reset_peak_host_memory_stats()
        except Exception:  # noqa: BLE001 - older torch: peaks since the start
            pass
        torch.cuda.reset_peak_memory_stats(ctx.dev)
        dev0 = torch.cuda.memory_allocated(ctx.dev)
    try:
        with PeakMemory() as pm:
            r = s.fn()
            del r
    except Exception as e:  # noqa: BLE001 - reported, the run goes on
        return {"error": f"{type(e).__name__}: {e}"}
    hs1, py1 = _host_stats(), _pyckpt_pinned() or 0
    m = pm.result()
    torch_new = max(hs1.get("allocated_bytes.peak", 0) - hs0.get("allocated_bytes.current", 0), 0)
    # pyckpt pins plain anonymous memory (cudaHostRegister): all of it shows in RssAnon;
    # what it pinned through torch's allocator (its fallback) is in torch_new already
    py_new = max(py1 - py0 - torch_new, 0)
    new_pinned = max(torch_new, py1 - py0, 0)
    rec = {**m, "pinned_in_use_bytes": max(hs1.get("active_bytes.peak", 0) - base_active,
                                           py1, py0, 0),
           "new_pinned_bytes": new_pinned, "pyckpt_staging_pinned_bytes": py1,
           "pageable_increase_bytes": int(max(0, m["peak_anon_increase_bytes"]
                                               - share["anon"] * torch_new - py_new))}
    if ctx.cuda:
        rec["device_peak_increase_bytes"] = torch.cuda.max_memory_allocated(ctx.dev) - dev0
    return rec


def measure_memory(groups: list[Group], ctx: Context, errors: dict[str, str]) -> dict:
    """Every step once more, untimed, each group starting with pyckpt's shared staging
    buffers released and the C heap trimmed before each step: peak increase of VmRSS and
    RssAnon; pinned host memory in use (torch's pinned allocator ``active_bytes`` over the
    group's start, or pyckpt's staging buffers, whichever is larger); new pinned memory
    (allocated during the call); device memory; and ``pageable`` = RssAnon increase - the
    part of the new pinned memory that shows in RssAnon (``pinned_share``)."""
    share = pinned_share(ctx)
    out: dict[str, dict] = {"_pinned_share": share}
    for g in groups:
        if all(s.name in errors for s in g.steps):
            continue
        release_staging()
        if g.setup is not None:
            g.setup(MEMORY_RUN)
        try:
            base_active = _host_stats().get("active_bytes.current", 0)
            for s in g.steps:
                if s.name in (PY_INTO, PY_DEVICE):
                    release_staging()  # a load's pinned figure is its own, not the saves'
                if s.name not in errors:
                    out[s.name] = measure_step(s, ctx, base_active, share)
        finally:
            if g.teardown is not None:
                g.teardown(MEMORY_RUN)
    return out


# ---------------------------------------------------------------------------
# summary
# ---------------------------------------------------------------------------


@dataclasses.dataclass
class Row:
    name: str
    kind: str = "-"
    pyckpt: bool = False
    peer: bool = False


def phase_rows(threads: list[int]) -> dict[str, list[Row]]:
    asyncs = [Row(py_async(i), "async", pyckpt=True) for i in range(1, ASYNC_SAVES + 1)]
    pinned = [Row(dcp_pinned(i), "async", peer=True) for i in range(1, ASYNC_SAVES + 1)]
    return {
        LIMITS: [Row(D2H), Row(H2D)] + [Row(pwrite_row(n)) for n in threads]
                + [Row(preadv_row(n)) for n in threads],
        SAVE: [Row(PY_SAVE, "block", pyckpt=True), *asyncs, Row(TORCH_SAVE, "block", peer=True),
               Row(ST_SAVE, "block", peer=True), Row(DCP_SAVE, "block", peer=True),
               Row(DCP_ASYNC, "async", peer=True), *pinned],
        BLOCKED: [*[dataclasses.replace(r) for r in asyncs], Row(DCP_ASYNC, "async", peer=True),
                  *[dataclasses.replace(r) for r in pinned]],
        LOAD: [Row(PY_INTO, "into", pyckpt=True), Row(PY_DEVICE, "fresh", pyckpt=True),
               Row(TORCH_LOAD, "fresh", peer=True), Row(ST_LOAD, "fresh", peer=True),
               Row(DCP_LOAD, "into", peer=True), Row(FST_LOAD, "into", peer=True)],
        COPIES: [Row(FOREACH, "ref"), Row(COPY_STATE, "into", pyckpt=True),
                 Row(SNAP, "fresh", pyckpt=True), Row(SNAP_INTO, "into", pyckpt=True),
                 Row(RESTORE, "into", pyckpt=True)],
    }


def best_of(rows: dict[str, list], names: list[str]) -> tuple[str | None, list | None]:
    """The name and per-round times of the row with the lowest median among ``names``."""
    have = [(median_of(rows[n]), n) for n in names if n in rows and median_of(rows[n]) is not None]
    if not have:
        return None, None
    _, n = min(have)
    return n, rows[n]


def references(res: Results, threads: list[int], cuda: bool) -> dict[str, tuple[str, list]]:
    """Synthesized reference rows: ``name -> (what it is, per-round times)``."""
    lim = res.seconds.get(LIMITS, {})
    refs: dict[str, tuple[str, list]] = {}
    n, v = best_of(lim, [pwrite_row(t) for t in threads])
    if v is not None:
        refs[LIMIT_SAVE] = (n, v)
    n, r = best_of(lim, [preadv_row(t) for t in threads])
    if r is not None:
        refs[LIMIT_READ] = (n, r)
        if H2D in lim:
            both = [max(a, b) if a is not None and b is not None else None
                    for a, b in zip(r, lim[H2D])]
            if median_of(both) is not None:
                refs[LIMIT_LOAD] = (f"slower of {n} and {H2D}, per round", both)
    for name in (D2H, H2D):
        if name in lim:
            refs[name] = (name, lim[name])
    blocked = res.seconds.get(BLOCKED, {})
    n, v = best_of(blocked, [DCP_ASYNC] + [dcp_pinned(i) for i in range(1, ASYNC_SAVES + 1)])
    if v is not None:
        refs["DCP best async (blocked)"] = (n, v)
    copies = res.seconds.get(COPIES, {})
    if FOREACH in copies:
        refs[FOREACH] = (FOREACH, copies[FOREACH])
    return refs


PHASE_LIMIT = {SAVE: LIMIT_SAVE, BLOCKED: D2H, LOAD: LIMIT_LOAD, COPIES: FOREACH}


def summarize_rows(res: Results, ctx: Context, threads: list[int], refs: dict) -> dict:
    """Per phase and row: median / min / max s, GB/s, vs limit (limit time / own), vs best
    peer (for pyckpt rows: best peer time / own), or the note why there is no figure."""
    out: dict[str, dict] = {}
    for phase, rows in phase_rows(threads).items():
        secs = res.seconds.get(phase, {})
        limit = refs.get(PHASE_LIMIT.get(phase, ""))
        limit_med = median_of(limit[1]) if limit else None
        peer_name, peer_v = best_of(secs, [r.name for r in rows if r.peer])
        peer_med = median_of(peer_v) if peer_v else None
        block: dict[str, dict] = {}
        for r in rows:
            v = secs.get(r.name)
            med = median_of(v) if v else None
            if med is None:
                why = (res.errors.get(r.name) and f"error: {res.errors[r.name]}") \
                    or ctx.notes.get(r.name) or "not run"
                block[r.name] = {"kind": r.kind, "note": why}
                continue
            vals = [x for x in v if x is not None]
            s = {"kind": r.kind, "median_s": med, "min_s": min(vals), "max_s": max(vals),
                 "rounds": len(vals), "median_gbps": ctx.nbytes / med / 1e9,
                 "seconds": v, "pyckpt": r.pyckpt, "peer": r.peer}
            if limit_med:
                s["vs_limit"] = limit_med / med
            if r.pyckpt and peer_med:
                s["vs_best_peer"] = peer_med / med
                s["best_peer"] = peer_name
            if r.name in ctx.returned:
                s["call_returned_median_s"] = statistics.median(ctx.returned[r.name])
            block[r.name] = s
        out[phase] = {"limit": limit[0] if limit else None, "best_peer": peer_name, "rows": block}
    return out


TITLES = {
    LIMITS: "LIMITS (no format, no checksum)",
    SAVE: "SAVE, call to durable (peers followed by an fsync of what they wrote)",
    BLOCKED: "SAVE, time the caller is blocked (call until its stream may run again)",
    LOAD: "LOAD onto the device (warm page cache)",
    COPIES: "DEVICE COPIES (each followed by a device synchronize)",
}


def print_summary(summary: dict, ctx: Context) -> None:
    for phase, block in summary.items():
        lim = block["limit"] or "n/a"
        print(f"\n== {TITLES[phase]}  [vs limit: {PHASE_LIMIT.get(phase, '-')} = {lim}; "
              f"best peer: {block['best_peer'] or 'n/a'}]")
        print(f"  {'contender':<30} {'kind':<6} {'median s':>9} {'min s':>8} {'max s':>8} "
              f"{'GB/s':>7} {'vs limit':>9} {'vs peer':>8}")
        print("  " + "-" * 91)
        for name, s in block["rows"].items():
            if "note" in s:
                print(f"  {name:<30} {s['kind']:<6} {s['note'][:110]}")
                continue
            vl = f"{s['vs_limit']:.2f}" if "vs_limit" in s else "-"
            vp = f"{s['vs_best_peer']:.2f}x" if "vs_best_peer" in s else "-"
            extra = (f"  (call returned {s['call_returned_median_s']:.3f} s)"
                     if "call_returned_median_s" in s else "")
            print(f"  {name:<30} {s['kind']:<6} {s['median_s']:9.3f} {s['min_s']:8.3f} "
                  f"{s['max_s']:8.3f} {s['median_gbps']:7.2f} {vl:>9} {vp:>8}{extra}")
    print("  (GB/s = state bytes / median time; vs limit = limit time / own time, 1.00 = at "
          "the limit; vs peer = best peer time / pyckpt time, > 1 = pyckpt faster)")


# ---------------------------------------------------------------------------
# targets (issue 12)
# ---------------------------------------------------------------------------


@dataclasses.dataclass
class Goal:
    label: str
    own: str          # a row name
    own_phase: str
    ref: str          # a reference (refs) or a row of ref_phase
    op: str           # "<=": own time / ref time at most goal; ">=": ref time / own time at least
    goal: float
    ref_phase: str | None = None
    gpu_only: bool = False


def issue_goals() -> list[Goal]:
    goals = []
    for i in range(2, ASYNC_SAVES + 1):
        goals.append(Goal(f"async #{i} blocked <= 1.25x pinned D2H", py_async(i), BLOCKED, D2H,
                          "<=", 1.25, gpu_only=True))
        goals.append(Goal(f"async #{i} blocked <= DCP's best", py_async(i), BLOCKED,
                          "DCP best async (blocked)", "<=", 1.0))
    goals.append(Goal("async #1 blocked <= 3x pinned D2H", py_async(1), BLOCKED, D2H, "<=", 3.0,
                      gpu_only=True))
    for i in range(1, ASYNC_SAVES + 1):
        goals.append(Goal(f"async #{i} call-to-durable <= 1.1x blocking", py_async(i), SAVE,
                          PY_SAVE, "<=", 1.1, ref_phase=SAVE))
    goals.append(Goal("blocking save >= 0.9x pwrite+fsync limit", PY_SAVE, SAVE, LIMIT_SAVE,
                      ">=", 0.9))
    for row in (PY_INTO, PY_DEVICE):
        # gpu_only: on the host, load_file returns tensors mapped from the file (no copy)
        goals.append(Goal(f"{row} >= 2x safetensors load_file(device=)", row, LOAD, ST_LOAD,
                          ">=", 2.0, ref_phase=LOAD, gpu_only=True))
        goals.append(Goal(f"{row} >= 0.5x min(host read, pinned H2D)", row, LOAD, LIMIT_LOAD,
                          ">=", 0.5, gpu_only=True))
    for row in (COPY_STATE, SNAP, SNAP_INTO, RESTORE):
        goals.append(Goal(f"{row} <= 1.5x in-place device copy", row, COPIES, FOREACH, "<=", 1.5))
    return goals


def check_goals(res: Results, refs: dict, ctx: Context) -> list[dict]:
    out = []
    for g in issue_goals():
        doc = {"target": g.label, "contender": g.own, "op": g.op, "goal": g.goal}
        own = res.seconds.get(g.own_phase, {}).get(g.own)
        if g.ref_phase is not None:
            ref = res.seconds.get(g.ref_phase, {}).get(g.ref)
            ref_name = g.ref
        else:
            ref_name, ref = refs.get(g.ref, (g.ref, None))
        doc["compare_to"] = ref_name
        if g.gpu_only and not ctx.cuda:
            doc["status"] = NO_CUDA
        elif median_of(own or []) is None or median_of(ref or []) is None:
            missing = g.own if median_of(own or []) is None else ref_name
            doc["status"] = f"not measured ({missing}: " + (
                res.errors.get(missing, ctx.notes.get(missing, "no figure"))[:60] + ")")
        else:
            c = compare(own, ref, speed=(g.op == ">="))
            doc.update(ratio=c["ratio"], pair_ratio_median=c["pair_ratio_median"],
                       met=(c["ratio"] <= g.goal) if g.op == "<=" else (c["ratio"] >= g.goal))
            doc["status"] = "met" if doc["met"] else "MISSED"
        out.append(doc)
    return out


def memory_goals(memory: dict, ctx: Context) -> list[dict]:
    out = []
    rows = [PY_SAVE, *[py_async(i) for i in range(1, ASYNC_SAVES + 1)], PY_INTO, PY_DEVICE]
    for name in rows:
        m = memory.get(name)
        for what, key, limit in (("pinned", "pinned_in_use_bytes", ctx.nbytes + SLACK),
                                 ("pageable", "pageable_increase_bytes", SLACK)):
            doc = {"target": f"{name}: extra {what} <= "
                             + ("state + 64 MiB" if what == "pinned" else "64 MiB"),
                   "contender": name, "limit_bytes": limit}
            if m is None:
                doc["status"] = "not measured"
            elif "error" in m:
                doc["status"] = f"not measured ({m['error'][:60]})"
            elif not ctx.cuda and what == "pinned":
                doc["status"] = NO_CUDA
            elif not ctx.cuda and name == PY_DEVICE:
                doc["status"] = "n/a without CUDA (the loaded state is host memory)"
            else:
                doc["bytes"] = m[key]
                doc["met"] = m[key] <= limit
                doc["status"] = "met" if doc["met"] else "MISSED"
            out.append(doc)
    return out


def print_goals(goals: list[dict], mem_goals: list[dict]) -> None:
    print("\n== TARGETS (issue 12; ratio of medians, per-round pair median in brackets)")
    for d in goals:
        if "ratio" in d:
            pm = d["pair_ratio_median"]
            pm_s = f"[{pm:.2f}x]" if pm is not None else "[-]"
            print(f"  {d['target']:<58} {d['ratio']:6.2f}x {pm_s:>9}  {d['status']}"
                  f"   (vs {d['compare_to']})")
        else:
            print(f"  {d['target']:<58} {'':>17}  {d['status']}")
    for d in mem_goals:
        if "bytes" in d:
            print(f"  {d['target']:<58} {d['bytes'] / MiB:9.1f} MiB       {d['status']}")
        else:
            print(f"  {d['target']:<58} {'':>17}  {d['status']}")


def print_memory(memory: dict, ctx: Context) -> None:
    if not memory:
        return
    share = memory.get("_pinned_share", {})
    print(f"\n== PEAK EXTRA MEMORY (one untimed run each, MiB; state {ctx.nbytes / MiB:.1f} MiB)")
    print("  pinned: pinned host memory in use (torch's pinned allocator, or pyckpt's staging "
          "buffers); new pin: pinned during the call;\n  pageable: RssAnon increase less the "
          f"pinned part of it (a new pinned buffer showed {share.get('anon', 0):.0%} in RssAnon, "
          f"{share.get('rss', 0):.0%} in VmRSS)")
    hdr = (f"  {'contender':<30} {'VmRSS':>8} {'RssAnon':>8} {'pageable':>9} {'pinned':>8} "
           f"{'new pin':>8}" + (f" {'device':>8}" if ctx.cuda else ""))
    print(hdr)
    print("  " + "-" * (len(hdr) - 2))
    for name, m in memory.items():
        if name.startswith("_"):
            continue
        if "error" in m:
            print(f"  {name:<30} error: {m['error'][:80]}")
            continue
        cells = [m["peak_rss_increase_bytes"], m["peak_anon_increase_bytes"],
                 m["pageable_increase_bytes"], m["pinned_in_use_bytes"], m["new_pinned_bytes"]]
        if ctx.cuda:
            cells.append(m.get("device_peak_increase_bytes", 0))
        widths = [8, 8, 9, 8, 8, 8]
        print(f"  {name:<30} " + " ".join(f"{c / MiB:{w}.1f}" for c, w in zip(cells, widths)))


# ---------------------------------------------------------------------------
# main
# ---------------------------------------------------------------------------


def parse_args(argv=None):
    p = parser(__doc__.split("\n\n")[0], size_gb=4.0,
               size_help="state size in GiB (params + Adam m and v; default 0.25 without CUDA)",
               rounds=3, quick_help="smoke test: 256 MiB state, 2 rounds, limit threads 1,2, memory "
                          "run of pyckpt's methods only",
               torch_threads_help="torch intra-op threads (default 1; 0 = torch's default)")
    p.add_argument("--device", default="auto",
                   help="cuda, cuda:N or cpu (default: cuda:0 when CUDA is available, else cpu)")
    p.add_argument("--layers", type=int, default=32,
                   help="transformer layers (default 32: 1,162 tensors, as in issue 12)")
    p.add_argument("--limit-threads", default=None, metavar="LIST",
                   help="thread counts of the pwrite/preadv limits (default 1,2,4,8 up to the "
                        "usable cores, at least 1,2)")
    p.add_argument("--dcp-threads", type=int, default=None, metavar="N",
                   help="FileSystemWriter thread_count of DCP (default: pyckpt's thread count, "
                        "at most 8)")
    p.add_argument("--ballast-gb", type=float, default=None, metavar="F",
                   help="host ballast touched before every timed step (default: the state size; "
                        "0 = none)")
    p.add_argument("--skip", default="", metavar="LIST",
                   help="comma-separated substrings of group names not to run (groups: "
                        "'pinned D2H', 'pinned H2D', 'raw xN', 'pyckpt', 'pyckpt async', 'torch', "
                        "'safetensors', 'DCP', 'DCP async_save', 'DCP async pinned', "
                        "'torch._foreach_copy_', 'pyckpt.copy_state', 'snapshots'; a word starting "
                        "with '=' names one group exactly: --skip '=torch,DCP async')")
    p.add_argument("--memory", choices=("all", "pyckpt", "none"), default="all",
                   help="the untimed memory run: every method, pyckpt's only (--quick), or none")
    argv = sys.argv[1:] if argv is None else argv
    explicit_size = any(a == "--size-gb" or a.startswith("--size-gb=") for a in argv)
    args = parse(p, argv, quick={"size_gb": 0.25, "rounds": 2,
                                 "limit_threads": lambda a: a.limit_threads or "1,2",
                                 "memory": lambda a: "pyckpt" if a.memory == "all" else a.memory})
    args.explicit_size = explicit_size or args.quick
    return args


def resolve_device(arg: str):
    if arg == "auto":
        return torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() \
            else torch.device("cpu")
    dev = torch.device(arg)
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            raise SystemExit(f"--device {arg}: CUDA is not available")
        if dev.index is None:
            dev = torch.device("cuda", torch.cuda.current_device())
    return dev


def library_versions() -> dict:
    v = {"pyckpt": version_of(pyckpt), "torch": version_of(torch),
         "safetensors": version_of(optional_import("safetensors")),
         "fastsafetensors": version_of(fastsafetensors)}
    if torch is not None:
        v["cuda"] = torch.version.cuda
    return v


def device_info(dev) -> dict:
    if dev.type != "cuda":
        return {"device": "cpu"}
    p = torch.cuda.get_device_properties(dev)
    return {"device": str(dev), "name": p.name, "memory_gib": p.total_memory / GiB,
            "capability": f"{p.major}.{p.minor}"}


def select_groups(groups: list[Group], skip: str, ctx: Context) -> list[Group]:
    words = [w.strip().lower() for w in skip.split(",") if w.strip()]
    kept = []
    for g in groups:
        name = g.name.lower()
        if any(name == w[1:] if w.startswith("=") else w in name for w in words):
            for s in g.steps:
                ctx.notes[s.name] = "skipped (--skip)"
            continue
        kept.append(g)
    return kept


def main(argv=None) -> int:
    if pyckpt is None:
        return no_pyckpt()
    if torch is None:
        print("torch is not importable: nothing to benchmark", file=sys.stderr)
        return 1
    args = parse_args(argv)
    dev = resolve_device(args.device)
    cuda = dev.type == "cuda"
    if not cuda and not args.explicit_size:
        args.size_gb = 0.25  # host tensors: keep this machine's memory use modest
    cpus = usable_cpus()
    if args.limit_threads:
        threads = sorted({int(x) for x in args.limit_threads.split(",") if x.strip()})
    else:
        threads = [n for n in (1, 2, 4, 8) if n <= max(2, cpus)]
    if not threads or min(threads) < 1:
        raise SystemExit("--limit-threads: positive integers")
    apply_torch_threads(torch, args.torch_threads)
    dcp_threads = args.dcp_threads or max(1, min(8, pyckpt._core.default_threads()))
    workdir = make_workdir(args.dir, prefix="pyckpt-bench-gpu-")

    meta = machine_header(str(workdir), library_versions())
    meta["device"] = device_info(dev)
    print(f"device  : {meta['device']}" + ("" if cuda else "  -- no CUDA: GPU-only rows are "
                                            "not measured, tensors live in host memory"))
    print(f"threads : pyckpt {pyckpt._core.default_threads()}, DCP writer {dcp_threads}, "
          f"limits {','.join(map(str, threads))}, torch intra-op {torch.get_num_threads()}")

    t0 = time.perf_counter()
    state = build_state(int(args.size_gb * GiB), args.layers, dev, args.seed)
    ctx = make_context(state, dev, dcp_threads)
    info = describe_state(ctx.host)
    ctx.ckpt_src = pyckpt.Checkpoint(state=ctx.state)
    ctx.ckpt_dst = pyckpt.Checkpoint(state=ctx.copy_dst)
    print(f"state   : {state_text(info, extra=f', {args.layers} layers, on {dev}')}; built in "
          f"{time.perf_counter() - t0:.1f} s")
    ballast = int((args.size_gb if args.ballast_gb is None else args.ballast_gb) * GiB)

    dirs = Dirs(workdir)
    groups = (limit_groups(ctx, dirs, threads) + pyckpt_groups(ctx, dirs)
              + peer_groups(ctx, dirs) + copy_groups(ctx))
    groups = select_groups(groups, args.skip, ctx)
    print_plan(args.rounds, ballast, f"{len(groups)} groups")

    res = Results(PHASES)
    ctx.rec = res
    memory: dict = {}
    try:
        run_interleaved(groups, args.rounds, ballast, res)
        if args.memory != "none":
            print(f"memory run (untimed, {args.memory} methods) ...", flush=True)
            ctx.rec = None  # the memory run records no time
            memory = measure_memory([g for g in groups if args.memory == "all"
                                     or g.name.startswith("pyckpt")], ctx, res.errors)
    finally:
        close_stager(ctx)
        shutil.rmtree(workdir, ignore_errors=True)

    refs = references(res, threads, cuda)
    summary = summarize_rows(res, ctx, threads, refs)
    print_summary(summary, ctx)
    print_memory(memory, ctx)
    goals = check_goals(res, refs, ctx)
    mem_goals = memory_goals(memory, ctx) if memory else []
    print_goals(goals, mem_goals)
    print_errors(res.errors, limit=300)

    write_report(args.json, meta, {k: v for k, v in vars(args).items()},
                 state={**info, "layers": args.layers, "device": str(dev)},
                 limit_threads=threads, dcp_threads=dcp_threads,
                 references={k: {"row": n, "seconds": v} for k, (n, v) in refs.items()},
                 seconds_per_round=res.seconds, call_returned_seconds=ctx.returned,
                 summary=summary, memory=memory, targets=goals, memory_targets=mem_goals,
                 errors=res.errors, notes=ctx.notes)
    return 0


if __name__ == "__main__":
    sys.exit(main())
