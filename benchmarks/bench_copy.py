"""Copies of a committed checkpoint (``pyckpt cp``, ``copy_checkpoint``, the persists
of tiered managers): pyckpt's guarded streamed copy (issue 22: through the store's
``write_files``) against an earlier pyckpt (``--before REV``, whose remote copies went
through fsspec's own file object) and against the raw limit of each destination,
in one run with rounds interleaved.

- local -> local: the raw limit is reading the source files and writing them with
  one fsync each (``shutil.copyfile`` + fsync);
- local -> S3 (SeaweedFS on 127.0.0.1, started here): the raw limit is s3fs' own
  ``put`` of the same files (concurrent multipart uploads).

Usage: python benchmarks/bench_copy.py [--gib 1] [--rounds 3] [--before ce11349]

Each contender runs in a fresh interpreter per round; the median of the rounds is
reported, with the ratio to the limit and to the earlier pyckpt.
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
from pathlib import Path

from harness import TREE_PRELUDE, remove_tree, tree_at

COPY = """
import sys, time, json
import pyckpt
from pyckpt.engine.copy import copy_checkpoint
src, dst, so = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
t = time.perf_counter()
copy_checkpoint(src, dst, dst_options=so or None)
print(time.perf_counter() - t)
"""

RAW_LOCAL = """
import os, shutil, sys, time
src, dst = sys.argv[1], sys.argv[2]
t = time.perf_counter()
os.makedirs(dst)
for name in sorted(os.listdir(src)):
    shutil.copyfile(os.path.join(src, name), os.path.join(dst, name))
    fd = os.open(os.path.join(dst, name), os.O_RDONLY); os.fsync(fd); os.close(fd)
print(time.perf_counter() - t)
"""

RAW_S3 = """
import json, os, sys, time
import s3fs
src, dst, so = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
so.pop("pyckpt", None)
fs = s3fs.S3FileSystem(**so, skip_instance_cache=True)
names = sorted(os.listdir(src))
t = time.perf_counter()
fs.put([os.path.join(src, n) for n in names], [dst.removeprefix("s3://") + "/" + n for n in names])
print(time.perf_counter() - t)
"""


def run(code: str, args: list[str], path: Path | None) -> float:
    env = dict(os.environ)
    if path is not None:
        env["PYCKPT_BENCH_TREE"] = str(path)
    r = subprocess.run([sys.executable, "-c", TREE_PRELUDE + code, *args], capture_output=True,
                       text=True,
                       env=env, cwd=tempfile.gettempdir(), timeout=1800)
    if r.returncode:
        raise RuntimeError(r.stderr[-3000:])
    return float(r.stdout.strip().splitlines()[-1])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--gib", type=float, default=1.0)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--before", default="ce11349", help="the earlier pyckpt to compare with")
    ap.add_argument("--dir", default=None, help="scratch directory (default: a temporary one)")
    a = ap.parse_args()

    import numpy as np
    import pyckpt
    from pyckpt.testing import servers

    work = Path(a.dir or tempfile.mkdtemp(prefix="pyckpt-bench-copy-"))
    work.mkdir(parents=True, exist_ok=True)
    n = max(1, int(a.gib * 8))
    state = {f"w{i}": np.random.default_rng(i).random((128 << 20) // 8) for i in range(n)}
    src = str(work / "src" / "ckpt-1")
    pyckpt.save(state, src)
    del state
    nbytes = sum(os.path.getsize(os.path.join(src, f)) for f in os.listdir(src))
    new_tree = tree_at("HEAD", work / "tree-new")
    old_tree = tree_at(a.before, work / "tree-old")
    times: dict[str, list[float]] = {}
    with servers.seaweedfs_server() as weed:
        servers.make_bucket("s3", weed.options, "pyckpt")
        so = json.dumps(weed.options)
        steps = [
            ("local: raw copy + fsync", lambda d: run(RAW_LOCAL, [src, d], None), "local"),
            ("local: pyckpt cp (this tree)", lambda d: run(COPY, [src, d, "{}"], new_tree), "local"),
            (f"local: pyckpt cp ({a.before})", lambda d: run(COPY, [src, d, "{}"], old_tree), "local"),
            ("s3: s3fs put", lambda d: run(RAW_S3, [src, d, so], None), "s3"),
            ("s3: pyckpt cp (this tree)", lambda d: run(COPY, [src, d, so], new_tree), "s3"),
            (f"s3: pyckpt cp ({a.before})", lambda d: run(COPY, [src, d, so], old_tree), "s3"),
        ]
        for r in range(a.rounds):
            order = steps[r % len(steps):] + steps[:r % len(steps)]
            for name, fn, kind in order:
                dst = (str(work / "dst" / f"{len(times.get(name, []))}-{abs(hash(name))}")
                       if kind == "local" else f"s3://pyckpt/bench/{r}-{abs(hash(name))}")
                times.setdefault(name, []).append(fn(dst))
                if kind == "local":
                    shutil.rmtree(dst, ignore_errors=True)
            print(f"round {r + 1}: " + ", ".join(f"{k} {v[-1]:.2f} s" for k, v in times.items()),
                  flush=True)
    for tree in (new_tree, old_tree):
        remove_tree(tree)
    print(f"\n{nbytes / 1e9:.2f} GB copied, median of {a.rounds} rounds (GB/s; ratio to the "
          "destination's raw limit, and to the earlier pyckpt)")
    med = {k: statistics.median(v) for k, v in times.items()}
    for kind, limit in (("local", "local: raw copy + fsync"), ("s3", "s3: s3fs put")):
        for k in [k for k in med if k.startswith(kind + ":")]:
            before = med.get(f"{kind}: pyckpt cp ({a.before})")
            print(f"  {k:32s} {nbytes / med[k] / 1e9:6.3f} GB/s  {med[limit] / med[k]:5.2f}x limit"
                  + (f"  {before / med[k]:5.2f}x {a.before}" if "this tree" in k and before else ""))
    shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
