#!/usr/bin/env python3
"""Export to a Hugging Face safetensors folder: pyckpt's ``export_hf`` against torch DCP's
``consolidate_safetensors_files``, on the same sharded state.

A torchrun job (``--workers`` ranks, gloo, CPU) saves one state (``--size-gb`` of float32
and bfloat16 DTensors sharded by rows) three ways: DCP's ``HuggingFaceStorageWriter``
with ``save_distributed=True`` (per-rank safetensors shards: the input of DCP's
consolidation), ``pyckpt.dcp.StorageWriter`` (a pyckpt checkpoint) and DCP's own
``FileSystemWriter`` (``.metadata`` + ``.distcp``, exported by pyckpt when it reads that
format). Then, in this process, rounds in rotating order: each contender writes
``--files`` output files of the whole state plus the index into a fresh folder, which is
checked against the state once and deleted. The raw limit: reading the state's bytes
from one file and writing them to another, fsynced (pyckpt's writes are durable) and
not (DCP's consolidation does not fsync).

    python benchmarks/bench_export_hf.py [--size-gb 1] [--workers 4] [--files 4] [--rounds 3]
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
import warnings
from pathlib import Path

HERE = Path(__file__).resolve()


def _state(nbytes: int, mesh):
    import torch
    from torch.distributed.tensor import Shard, distribute_tensor

    g = torch.Generator().manual_seed(0)
    n = 8
    rows = max(1, nbytes // n // 4 // 2048)
    sd = {}
    for i in range(n):
        t = torch.randn(rows, 2048, generator=g)
        sd[f"model.layers.{i}.weight"] = distribute_tensor(t if i % 2 else t.bfloat16(), mesh,
                                                           [Shard(0)])
    return sd


def worker(args) -> None:
    import datetime

    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint import HuggingFaceStorageWriter
    from torch.distributed.device_mesh import init_device_mesh

    import pyckpt.dcp

    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=600))
    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    sd = _state(args.nbytes, mesh)
    base = Path(args.base)
    dcp.save(sd, storage_writer=HuggingFaceStorageWriter(str(base / "dcp-hf"), save_distributed=True))
    dcp.save(sd, storage_writer=pyckpt.dcp.StorageWriter(str(base / "pyckpt")))
    dcp.save(sd, storage_writer=dcp.FileSystemWriter(str(base / "dcp-fs")))
    dist.barrier()
    dist.destroy_process_group()


def _raw(src_file: Path, dst_file: Path, sync: bool = True) -> None:
    with open(src_file, "rb") as fi, open(dst_file, "wb") as fo:
        while True:
            b = fi.read(64 << 20)
            if not b:
                break
            fo.write(b)
        fo.flush()
        if sync:
            os.fsync(fo.fileno())


def contenders(base: Path, files: int, total: int, keys: list[str]):
    from torch.distributed.checkpoint._consolidate_hf_safetensors import consolidate_safetensors_files

    import pyckpt
    from pyckpt.interop.safetensors import export_hf

    mapping = {k: 1 + i * files // len(keys) for i, k in enumerate(keys)}
    # DCP's per-rank shards (shard-0000r-model-0000i-of-0000N.safetensors), wherever its
    # writer put them (a missing input makes DCP's consolidation write empty tensors)
    shards = sorted({str(d) for d in (base / "dcp-hf").rglob("shard-*.safetensors")})
    sharded = str(Path(shards[0]).parent) if shards else str(base / "dcp-hf")
    shard = -(-total // files) + 1
    out = {
        "dcp consolidate (1 thread)": lambda o: (os.makedirs(o), consolidate_safetensors_files(
            sharded, o, mapping)),
        "dcp consolidate (4 threads)": lambda o: (os.makedirs(o), consolidate_safetensors_files(
            sharded, o, mapping, num_threads=4)),
        "pyckpt export_hf": lambda o: export_hf(str(base / "pyckpt"), o, max_shard_size=shard),
    }
    try:
        pyckpt.load_checkpoint(str(base / "dcp-fs"))
        out["pyckpt export_hf from .distcp"] = lambda o: export_hf(str(base / "dcp-fs"), o,
                                                                   max_shard_size=shard)
    except Exception as e:  # noqa: BLE001 - a pyckpt without the DCP-format reader
        print(f"(pyckpt cannot read DCP's own format here: {type(e).__name__}: {e})")
    return out


def check(folder: str, want: dict) -> None:
    import numpy as np
    from safetensors.numpy import load_file

    got = {}
    for name in os.listdir(folder):
        if name.endswith(".safetensors"):
            got.update(load_file(os.path.join(folder, name)))
    assert sorted(got) == sorted(want), (sorted(got)[:3], sorted(want)[:3])
    for k, v in want.items():
        assert np.array_equal(got[k].view(np.uint8), v.view(np.uint8)), k


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--size-gb", type=float, default=1.0)
    p.add_argument("--workers", type=int, default=4)
    p.add_argument("--files", type=int, default=4)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--dir", default=None)
    p.add_argument("--json", default=None)
    p.add_argument("--worker", action="store_true")
    p.add_argument("--base")
    p.add_argument("--nbytes", type=int)
    args = p.parse_args(argv)
    if args.worker:
        worker(args)
        return 0
    warnings.filterwarnings("ignore")
    base = Path(tempfile.mkdtemp(prefix="pyckpt-bench-hf-", dir=args.dir))
    try:
        nbytes = int(args.size_gb * (1 << 30))
        cmd = [shutil.which("torchrun") or "torchrun", "--standalone",
               f"--nproc-per-node={args.workers}", str(HERE), "--worker", "--base", str(base),
               "--nbytes", str(nbytes)]
        r = subprocess.run(cmd, capture_output=True, text=True, env=dict(os.environ, OMP_NUM_THREADS="1"))
        if r.returncode != 0:
            raise SystemExit(f"torchrun failed:\n{r.stdout[-3000:]}\n{r.stderr[-5000:]}")
        import pyckpt

        want = pyckpt.load(str(base / "pyckpt"), as_numpy=True)
        total = sum(v.nbytes for v in want.values())
        runs = contenders(base, args.files, total, sorted(want))
        raw_src = base / "raw-src.bin"
        with open(raw_src, "wb") as f:
            f.write(os.urandom(1 << 20) * (total >> 20))
        runs["raw read+write+fsync"] = lambda o: (os.makedirs(o), _raw(raw_src, Path(o) / "x"))
        # DCP's consolidation does not fsync its output; pyckpt's writes do
        runs["raw read+write (no fsync)"] = lambda o: (os.makedirs(o),
                                                       _raw(raw_src, Path(o) / "x", False))
        times: dict[str, list[float]] = {n: [] for n in runs}
        names = list(runs)
        for rnd in range(args.rounds):
            for name in names[rnd % len(names):] + names[:rnd % len(names)]:
                out = str(base / f"out-{rnd}-{names.index(name)}")
                t0 = time.perf_counter()
                runs[name](out)
                times[name].append(time.perf_counter() - t0)
                if rnd == 0 and not name.startswith("raw"):
                    try:
                        check(out, want)
                    except Exception as e:
                        raise SystemExit(f"{name}: wrong output in {out}: {e}") from e
                shutil.rmtree(out)
    finally:
        shutil.rmtree(base, ignore_errors=True)
    rows = []
    ref = statistics.median(times["pyckpt export_hf"])
    raw = statistics.median(times["raw read+write+fsync"])
    print(f"state: {total / 1e9:.2f} GB in {len(want)} tensors, saved by {args.workers} workers; "
          f"{args.files} output files; median of {args.rounds}")
    print(f"{'contender':34} {'seconds':>8} {'GB/s':>7} {'pyckpt x':>9} {'of raw':>7}")
    for name, t in times.items():
        m = statistics.median(t)
        rows.append({"contender": name, "seconds": round(m, 3), "GBps": round(total / m / 1e9, 3),
                     "pyckpt_x": round(m / ref, 2), "of_raw": round(raw / m, 2)})
        print(f"{name:34} {m:8.3f} {total / m / 1e9:7.3f} {m / ref:9.2f} {raw / m:7.2f}")
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
