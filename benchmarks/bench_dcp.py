#!/usr/bin/env python3
"""torch DCP storage benchmark: ``dcp.save`` / ``dcp.load`` with pyckpt's StorageWriter /
StorageReader against DCP's own FileSystemWriter/Reader (local disk) and
FsspecWriter/Reader (S3: a SeaweedFS server on 127.0.0.1), with 1 and 4 torchrun
workers (gloo, CPU).

The state: ``--tensors`` float32 DTensors sharded by rows over the workers' CPU mesh,
``--size-gb`` in all (plus a few non-tensor entries). Each job runs every contender of
its storage kind ``--rounds`` times, in rotating order; every save goes to a fresh
directory (deleted after its load); a load fills preallocated DTensors. The times are
the slowest worker's (barriers around each operation). The raw limit: one process
writing the same bytes to one file and fsyncing it, and reading it back.

    python benchmarks/bench_dcp.py [--size-gb 1] [--s3-size-gb 0.25] [--workers 1 4]
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
import time
from pathlib import Path

HERE = Path(__file__).resolve()


# -- the worker side (inside torchrun) ------------------------------------------------------
def _contenders(kind: str, base: str, opts: dict):
    import pyckpt.dcp
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint._fsspec_filesystem import FsspecReader, FsspecWriter

    if kind == "local":
        return {
            "pyckpt": (lambda p: pyckpt.dcp.StorageWriter(p), lambda p: pyckpt.dcp.StorageReader(p)),
            "dcp FileSystem": (lambda p: dcp.FileSystemWriter(p), lambda p: dcp.FileSystemReader(p)),
            "dcp FileSystem t4": (lambda p: dcp.FileSystemWriter(p, thread_count=4),
                                  lambda p: dcp.FileSystemReader(p)),
        }
    return {
        "pyckpt": (lambda p: pyckpt.dcp.StorageWriter(p, storage_options=opts),
                   lambda p: pyckpt.dcp.StorageReader(p, storage_options=opts)),
        "dcp Fsspec": (lambda p: FsspecWriter(p, **opts), lambda p: FsspecReader(p, **opts)),
        "dcp Fsspec t4": (lambda p: FsspecWriter(p, thread_count=4, **opts),
                          lambda p: FsspecReader(p, **opts)),
    }


def _state(nbytes: int, ntensors: int, mesh):
    import torch
    from torch.distributed.tensor import Shard, distribute_tensor

    rows = max(1, nbytes // ntensors // 4 // 1024)
    g = torch.Generator().manual_seed(0)
    sd = {f"layer{i}.weight": distribute_tensor(torch.randn(rows, 1024, generator=g), mesh, [Shard(0)])
          for i in range(ntensors)}
    sd["step"] = 1000
    sd["loader"] = {"epoch": 3, "offset": 123456}
    return sd


def _rm(path: str, opts: dict) -> None:
    if "://" in path:
        import fsspec

        fs, p = fsspec.core.url_to_fs(path, **opts)
        if fs.exists(p):
            fs.rm(p, recursive=True)
    else:
        shutil.rmtree(path, ignore_errors=True)


def worker(args) -> None:
    import datetime

    import torch
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp
    from torch.distributed.device_mesh import init_device_mesh

    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=600))
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.set_num_threads(1)
    mesh = init_device_mesh("cpu", (world,))
    opts = json.loads(args.opts)
    sd = _state(args.nbytes, args.tensors, mesh)
    targets = {k: (v.clone() if isinstance(v, torch.Tensor) else v) for k, v in sd.items()}
    contenders = _contenders(args.kind, args.base, opts)
    times: dict[str, dict[str, list[float]]] = {n: {"save": [], "load": []} for n in contenders}
    names = list(contenders)
    for rnd in range(args.rounds):
        for name in names[rnd % len(names):] + names[:rnd % len(names)]:
            make_w, make_r = contenders[name]
            path = f"{args.base}/r{rnd}-{name.replace(' ', '_')}"
            dist.barrier()
            t0 = time.perf_counter()
            dcp.save(sd, storage_writer=make_w(path))
            dist.barrier()
            t1 = time.perf_counter()
            for k, v in targets.items():
                if isinstance(v, torch.Tensor):
                    v.to_local().zero_()
            dist.barrier()
            t2 = time.perf_counter()
            dcp.load(targets, storage_reader=make_r(path))
            dist.barrier()
            t3 = time.perf_counter()
            if rnd == 0:
                for k, v in sd.items():
                    if isinstance(v, torch.Tensor):
                        assert torch.equal(targets[k].to_local(), v.to_local()), (name, k)
            times[name]["save"].append(t1 - t0)
            times[name]["load"].append(t3 - t2)
            if rank == 0:
                _rm(path, opts)
    if rank == 0:
        Path(args.out).write_text(json.dumps(times))
    dist.barrier()
    dist.destroy_process_group()


# -- the driver -----------------------------------------------------------------------------
def raw_limit(nbytes: int, directory: Path, rounds: int) -> dict:
    """One file written with 64 MiB writes and fsynced, then read back (page cache)."""
    block = os.urandom(1 << 20) * 64
    w, r = [], []
    for _ in range(rounds):
        f = directory / "raw.bin"
        t0 = time.perf_counter()
        with open(f, "wb") as fh:
            left = nbytes
            while left > 0:
                fh.write(block[:min(left, len(block))])
                left -= len(block)
            fh.flush()
            os.fsync(fh.fileno())
        w.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        with open(f, "rb") as fh:
            while fh.read(64 << 20):
                pass
        r.append(time.perf_counter() - t0)
        f.unlink()
    return {"save": statistics.median(w), "load": statistics.median(r)}


def launch(kind: str, n: int, nbytes: int, args, base: str, opts: dict) -> dict:
    out = tempfile.mktemp(suffix=".json")
    cmd = [shutil.which("torchrun") or "torchrun", "--standalone", f"--nproc-per-node={n}",
           str(HERE), "--worker", "--kind", kind, "--base", base, "--nbytes", str(nbytes),
           "--tensors", str(args.tensors), "--rounds", str(args.rounds), "--out", out,
           "--opts", json.dumps(opts)]
    env = dict(os.environ, OMP_NUM_THREADS="1")
    r = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if r.returncode != 0:
        raise SystemExit(f"torchrun failed ({kind}, {n} workers):\n{r.stdout[-3000:]}\n{r.stderr[-5000:]}")
    times = json.loads(Path(out).read_text())
    os.unlink(out)
    return times


def report(kind: str, n: int, nbytes: int, times: dict, limit: dict | None) -> list[dict]:
    rows = []
    own = {op: statistics.median(times["pyckpt"][op]) for op in ("save", "load")}
    for name, t in times.items():
        row = {"storage": kind, "workers": n, "contender": name}
        for op in ("save", "load"):
            m = statistics.median(t[op])
            row[f"{op}_s"] = round(m, 3)
            row[f"{op}_rounds_s"] = t[op]  # unrounded, per round (bench_revs.py's medians)
            row[f"{op}_GBps"] = round(nbytes / m / 1e9, 3)
            row[f"pyckpt_x_{op}"] = round(m / own[op], 2)
            if limit is not None:
                row[f"{op}_of_limit"] = round(limit[op] / m, 2)
        rows.append(row)
    return rows


def print_rows(rows: list[dict]) -> None:
    print(f"{'storage':7} {'n':>2} {'contender':20} {'save GB/s':>9} {'load GB/s':>9} "
          f"{'pyckpt x save':>13} {'pyckpt x load':>13} {'save/limit':>10} {'load/limit':>10}")
    for r in rows:
        print(f"{r['storage']:7} {r['workers']:>2} {r['contender']:20} {r['save_GBps']:>9} "
              f"{r['load_GBps']:>9} {r['pyckpt_x_save']:>13} {r['pyckpt_x_load']:>13} "
              f"{r.get('save_of_limit', '-'):>10} {r.get('load_of_limit', '-'):>10}")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--size-gb", type=float, default=1.0)
    p.add_argument("--s3-size-gb", type=float, default=0.25)
    p.add_argument("--tensors", type=int, default=16)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--workers", type=int, nargs="+", default=[1, 4])
    p.add_argument("--no-s3", action="store_true")
    p.add_argument("--dir", default=None, help="local directory for the checkpoints")
    p.add_argument("--json", default=None, help="write the results here")
    # worker mode (internal)
    p.add_argument("--worker", action="store_true")
    for a in ("--kind", "--base", "--out", "--opts"):
        p.add_argument(a)
    p.add_argument("--nbytes", type=int)
    args = p.parse_args(argv)
    if args.worker:
        worker(args)
        return 0
    work = Path(tempfile.mkdtemp(prefix="pyckpt-bench-dcp-", dir=args.dir))
    rows: list[dict] = []
    try:
        nbytes = int(args.size_gb * (1 << 30))
        limit = raw_limit(nbytes, work, args.rounds)
        print(f"raw limit (one file, {nbytes / 1e9:.2f} GB): write+fsync "
              f"{nbytes / limit['save'] / 1e9:.3f} GB/s, read {nbytes / limit['load'] / 1e9:.3f} GB/s")
        for n in args.workers:
            rows += report("local", n, nbytes, launch("local", n, nbytes, args, str(work / f"w{n}"), {}),
                           limit)
        if not args.no_s3:
            from pyckpt.testing import servers

            s3_bytes = int(args.s3_size_gb * (1 << 30))
            with servers.seaweedfs() as opts:
                servers.make_bucket("s3", opts, "bench")
                for n in args.workers:
                    rows += report("s3", n, s3_bytes,
                                   launch("s3", n, s3_bytes, args, f"s3://bench/w{n}", opts), None)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print_rows(rows)
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
