#!/usr/bin/env python3
"""CPU proxy of loads into device memory (issue 40 item 3): what the load pipeline
(``pyckpt/device/loading.py``) costs, and how much of min(read rate, copy rate) its
scheduling reaches, measured without a GPU.

Three measurements, each per revision in a subprocess per round (``--against REV``:
this checkout and REV's Python code, same compiled core, interleaved), on the
shapes of bench_gpu.py's GPT-like state (1,162 float32 tensors):

- ``overhead``: ``fill_targets`` with reads and copies that cost nothing (no bytes
  move; a read only lets go of the GIL, as the core's does): the pipeline's own
  Python and scheduling cost, per tensor and per batch;
- ``model``: ``fill_targets`` of a 4.25 GB state (``--model-gb``) with reads that
  take the time of a shared read channel at ``--read-gbps`` (37.6: the H200's
  16-thread preadv of issue 40) and copies landing from one DMA queue at
  ``--copy-gbps`` (53: its pinned H2D); both sleep (no CPU), so this shows the
  schedule alone, on any machine: the ideal is max(read, copy) = the read time;
  ``model / ideal`` is the fraction of min(read, H2D) rate the schedule reaches
  (the GPU target: >= 0.8);
- ``real`` (``--real-mb``; 0 skips it): ``pyckpt.load(path, into=...)``, warm
  page cache, of a saved state into host arrays (``plain``: the read alone), and
  into device values of an engine whose copies cost nothing (``null``) or are host
  memcpys (``host``, HostCopyEngine): the whole load's cost over the plain read
  (noisy on a shared machine).

    python benchmarks/bench_load_pipeline.py --rounds 7 --against HEAD~1
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
REAL = ("plain", "null", "host")


# -- in the subprocess: imports pyckpt from the revision measured ------------------------

class Queue:
    """One channel of ``gbps``: work reserved on it ends after all work reserved before."""

    def __init__(self, gbps: float) -> None:
        self.rate = gbps * 1e9
        self.busy = 0.0
        self.lock = threading.Lock()

    def until(self, nbytes: int) -> float:
        with self.lock:
            self.busy = max(time.perf_counter(), self.busy) + nbytes / self.rate
            return self.busy


def sleep_until(t: float) -> None:
    left = t - time.perf_counter()
    if left > 0:
        time.sleep(left)


def _engines(copy_gbps: float) -> dict:
    """``null`` (copies that cost nothing and move nothing), ``host`` (HostCopyEngine)
    and ``sim`` (copies land from one DMA queue at ``copy_gbps``, moving nothing)."""
    from pyckpt.device.engine import CopyEngine, DoneTicket, HostCopyEngine, Ticket

    class AtTicket(Ticket):
        def __init__(self, at: float) -> None:
            self.at = at

        def done(self) -> bool:
            return time.perf_counter() >= self.at

        def wait(self) -> None:
            sleep_until(self.at)

    class NullEngine(CopyEngine):
        name = "null"

        def to_host(self, srcs, dsts):
            return [DoneTicket() for _ in srcs]

        def to_device(self, srcs, dsts):
            return [DoneTicket() for _ in srcs]

        def to_device_batch(self, srcs, dsts):  # used where the revision has it
            return DoneTicket()

        def copy(self, srcs, dsts):
            return None

        def empty_like(self, src):
            raise NotImplementedError

    class SimEngine(NullEngine):
        name = "sim"

        def __init__(self) -> None:
            self.queue = Queue(copy_gbps)

        def to_device(self, srcs, dsts):
            return [AtTicket(self.queue.until(s.nbytes)) for s in srcs]

        def to_device_batch(self, srcs, dsts):
            return AtTicket(self.queue.until(sum(s.nbytes for s in srcs)))

    return {"null": NullEngine(), "host": HostCopyEngine(), "sim": SimEngine()}


def batches_of(sizes: list[int]) -> int | None:
    """How many batches the revision cuts a load of targets of ``sizes`` into."""
    try:
        from pyckpt.device import loading
        if hasattr(loading, "plan_buffers"):
            return len(loading.plan_buffers(sizes, loading.load_settings()).batches)
        size = max([getattr(loading, "_MIN_BOUNCE", 64 << 20)] + sizes)
        return len(loading._batches(sizes, size))  # the revision before plan_buffers
    except Exception:  # noqa: BLE001 - informative only
        return None


def schedule_round(shapes: list, read_gbps: float, copy_gbps: float) -> dict:
    """``overhead`` and ``model`` (module doc): seconds of one fill_targets each, after
    an untimed one (bounce buffers allocated)."""
    from pyckpt.device import loading
    from pyckpt.device.array import DeviceArray

    eng = _engines(copy_gbps)
    sizes = [int(np.prod(s)) * 4 for s in shapes]

    def targets(e) -> list:
        return [DeviceArray(None, s, np.float32, e.name, e) for s in shapes]

    def free_read(indices, views) -> None:
        time.sleep(0)  # moves nothing, but lets go of the GIL as the core's read does

    channel = Queue(read_gbps)

    def channel_read(indices, views) -> None:  # the GIL is free meanwhile, as in the core
        sleep_until(channel.until(sum(v.nbytes for v in views)))

    out = {}
    for name, read, e in (("overhead", free_read, eng["null"]),
                          ("model", channel_read, eng["sim"])):
        dsts = targets(e)
        idx = list(range(len(dsts)))
        loading.fill_targets(read, idx, dsts)
        t0 = time.perf_counter()
        loading.fill_targets(read, idx, dsts)
        out[name] = time.perf_counter() - t0
    return {"seconds": out, "tensors": len(shapes), "batches": batches_of(sizes),
            "ideal_s": max(sum(sizes) / (read_gbps * 1e9), sum(sizes) / (copy_gbps * 1e9))}


def real_round(ckpt: str) -> dict:
    """``real`` (module doc): seconds of one load(into=) per kind, after an untimed one."""
    import pyckpt
    from pyckpt.device.array import DeviceArray
    from pyckpt.registry import register_adapter

    class Dev:
        __slots__ = ("d",)

        def __init__(self, d: DeviceArray) -> None:
            self.d = d

    register_adapter("bench-load", leaf=lambda o: o.d if isinstance(o, Dev) else None,
                     target=lambda o: o.d if isinstance(o, Dev) else None)
    engines = _engines(1.0)
    template = pyckpt.load(ckpt)
    host = {k: np.zeros_like(v) for k, v in template.items()}
    targets = {"plain": host}
    for kind in ("null", "host"):
        eng = engines[kind]
        targets[kind] = {k: Dev(DeviceArray(a, a.shape, a.dtype, kind, eng))
                         for k, a in host.items()}
    out: dict = {}
    for kind in REAL:
        pyckpt.load(ckpt, into=targets[kind])  # warm: bounce buffers, page cache
    for kind in REAL:
        t0 = time.perf_counter()
        pyckpt.load(ckpt, into=targets[kind])
        out[kind] = time.perf_counter() - t0
    k = next(iter(host))
    if not np.array_equal(host[k], template[k]):
        raise AssertionError("the load did not fill its targets")
    return {"seconds": out, "tensors": len(host),
            "batches": batches_of([a.nbytes for a in host.values()])}


def child(args: argparse.Namespace) -> dict:
    with open(args.child) as f:
        job = json.load(f)
    out = {"schedule": schedule_round([tuple(s) for s in job["shapes"]], job["read_gbps"],
                                      job["copy_gbps"])}
    if job.get("ckpt"):
        out["real"] = real_round(job["ckpt"])
    return out


# -- the driver --------------------------------------------------------------------------

def state_shapes(size_bytes: int, layers: int) -> list[tuple[int, ...]]:
    """bench_gpu.py's state: params, Adam m and v of its GPT shapes, and the step."""
    sys.path.insert(0, str(HERE))
    from bench_gpu import gpt_shapes

    shapes = list(gpt_shapes(size_bytes, layers).values())
    return shapes * 3 + [()]


def save_state(workdir: Path, size_mb: float, layers: int) -> tuple[str, int]:
    import pyckpt
    rng = np.random.default_rng(0)
    state = {f"t{i:04d}": rng.standard_normal(s, dtype=np.float32)
             for i, s in enumerate(state_shapes(int(size_mb * (1 << 20)), layers))}
    path = str(workdir / "ckpt")
    pyckpt.save(state, path)
    return path, sum(v.nbytes for v in state.values())


def run_child(job: str, tree: Path | None) -> dict:
    env = dict(os.environ)
    if tree is not None:
        from harness import tree_env
        env = tree_env(tree, env)
    cmd = [sys.executable, str(Path(__file__).resolve()), "--child", job]
    r = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    if r.returncode != 0:
        raise RuntimeError(f"round failed ({tree or 'this checkout'}):\n{r.stderr[-3000:]}")
    return json.loads(r.stdout.strip().splitlines()[-1])


def summarize(rounds: list[dict]) -> dict:
    sch = [r["schedule"] for r in rounds]
    first = sch[0]
    over = statistics.median(r["seconds"]["overhead"] for r in sch)
    model = statistics.median(r["seconds"]["model"] for r in sch)
    out = {"tensors": first["tensors"], "batches": first["batches"], "overhead_s": over,
           "overhead_per_tensor_us": over / first["tensors"] * 1e6,
           "overhead_per_batch_us": over / first["batches"] * 1e6 if first["batches"] else None,
           "model_s": model, "ideal_s": first["ideal_s"],
           "model_fraction": first["ideal_s"] / model}
    if "real" in rounds[0]:
        real = {k: statistics.median(r["real"]["seconds"][k] for r in rounds) for k in REAL}
        out["real_s"] = real
        out["real_batches"] = rounds[0]["real"]["batches"]
    return out


def print_summary(name: str, s: dict, real_bytes: int) -> None:
    pb = f"{s['overhead_per_batch_us']:.0f} us per batch" if s["overhead_per_batch_us"] \
        else "per batch n/a"
    print(f"\n== {name} (medians)")
    print(f"  overhead: {s['overhead_s'] * 1e3:.2f} ms per load of {s['tensors']} tensors in "
          f"{s['batches']} batches = {s['overhead_per_tensor_us']:.2f} us per tensor, {pb}")
    print(f"  model: {s['model_s'] * 1e3:.1f} ms, ideal max(read, copy) "
          f"{s['ideal_s'] * 1e3:.1f} ms: {s['model_fraction']:.2f}x of min(read, H2D) rate "
          "(GPU target >= 0.8x)")
    if "real_s" in s:
        r = s["real_s"]
        print(f"  real load(into=) of {real_bytes / 1e6:.0f} MB ({s['real_batches']} batches): "
              + ", ".join(f"{k} {v * 1e3:.0f} ms ({real_bytes / v / 1e9:.2f} GB/s)"
                          for k, v in r.items())
              + f"; null - plain {1e3 * (r['null'] - r['plain']):+.0f} ms")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model-gb", type=float, default=3.96, help="GiB of the modelled state "
                   "(default 3.96: 4.25 GB)")
    p.add_argument("--layers", type=int, default=32, help="layers (32: 1,162 tensors)")
    p.add_argument("--read-gbps", type=float, default=37.6)
    p.add_argument("--copy-gbps", type=float, default=53.0)
    p.add_argument("--real-mb", type=float, default=512.0,
                   help="MiB of the saved state of the real loads (0: skip them)")
    p.add_argument("--rounds", type=int, default=7)
    p.add_argument("--against", default=None, metavar="REV",
                   help="also measure REV's Python code (a git worktree), interleaved")
    p.add_argument("--dir", default=None, help="where the checkpoint goes (default /tmp)")
    p.add_argument("--json", default=None)
    p.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.child:
        sys.path.insert(0, str(HERE))
        print(json.dumps(child(args)))
        return 0
    sys.path.insert(0, str(HERE))
    from harness import remove_tree, tree_at
    workdir = Path(tempfile.mkdtemp(prefix="pyckpt-bench-load-", dir=args.dir))
    tree = None
    try:
        job = {"shapes": state_shapes(int(args.model_gb * (1 << 30)), args.layers),
               "read_gbps": args.read_gbps, "copy_gbps": args.copy_gbps}
        real_bytes = 0
        if args.real_mb > 0:
            job["ckpt"], real_bytes = save_state(workdir, args.real_mb, args.layers)
        job_file = workdir / "job.json"
        job_file.write_text(json.dumps(job))
        print(f"model: {len(job['shapes'])} tensors, read {args.read_gbps} GB/s, copy "
              f"{args.copy_gbps} GB/s; real: {real_bytes / 1e6:.0f} MB; {args.rounds} rounds")
        if args.against:
            tree = tree_at(args.against, Path(tempfile.gettempdir()) / "wt_d")
        results: dict[str, list] = {"this checkout": []}
        if tree is not None:
            results[args.against] = []
        for _ in range(args.rounds):
            results["this checkout"].append(run_child(str(job_file), None))
            if tree is not None:
                results[args.against].append(run_child(str(job_file), tree))
        summary = {name: summarize(rs) for name, rs in results.items()}
        for name, s in summary.items():
            print_summary(name, s, real_bytes)
        if args.json:
            with open(args.json, "w") as f:
                json.dump({"args": vars(args), "rounds": results, "summary": summary}, f,
                          indent=1)
    finally:
        if tree is not None:
            remove_tree(tree)
        shutil.rmtree(workdir, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
