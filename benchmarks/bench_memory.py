#!/usr/bin/env python3
"""Host memory over many rounds: pyckpt's modes next to torch DCP's, untrimmed and
trimmed (issue 28).

Each case is one fresh process of tests/memory/rss_child.py (3 warm-up rounds, then
40 of a 16 MiB state; the cyclic collector on or off; ``malloc_trim(0)`` after every
round in the trimmed runs), on local disk and on a loopback SeaweedFS. Printed per
case: the resident set after the third round, the most it rose above that over the
40 rounds (growth) and the high-water mark above it (peak). The suite
(tests/memory/test_flat_memory.py) asserts pyckpt's; this adds DCP's and the trimmed
figures, in one run.

    python benchmarks/bench_memory.py [--modes load,dcp,peer_dcp] [--parallel 3]
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import os
import pathlib
import subprocess
import sys
import tempfile

CHILD = pathlib.Path(__file__).resolve().parent.parent / "tests" / "memory" / "rss_child.py"
MODES = ["load", "load_into", "save_async", "manager_async", "dcp", "peer_dcp",
         "peer_dcp_async"]
MiB = 1 << 20


def run(mode: str, where: str, collector: str, trim: bool, so: dict | None) -> dict:
    env = {**os.environ, "PYCKPT_MEM_TRIM": "1" if trim else "0"}
    with tempfile.TemporaryDirectory(prefix="pyckpt-mem-") as work:
        cmd = [sys.executable, str(CHILD), mode, work, collector]
        if so is not None:
            cmd.append(json.dumps(so))
        out = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=work,
                             timeout=600)
    if out.returncode != 0:
        return {"error": out.stderr.strip().splitlines()[-1:]}
    got = json.loads(out.stdout.strip().splitlines()[-1])
    rss, warm = got["rss"], got["warmup"]
    base = rss[warm - 1]
    return {"third": base / MiB, "growth": (max(rss[warm:]) - base) / MiB,
            "peak": (got["peak"] - base) / MiB}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--modes", default=",".join(MODES))
    p.add_argument("--parallel", type=int, default=3)
    p.add_argument("--no-s3", action="store_true")
    p.add_argument("--json", metavar="PATH")
    args = p.parse_args()
    from pyckpt.testing import servers

    modes = args.modes.split(",")
    places = ["local"] if args.no_s3 else ["local", "s3"]
    with servers.seaweedfs() as so:
        servers.make_bucket("s3", so, "pyckpt")
        cases = [(m, w, c, t) for w in places for m in modes for c in ("on", "off")
                 for t in (False, True)]
        with concurrent.futures.ThreadPoolExecutor(args.parallel) as pool:
            futures = {k: pool.submit(run, *k, so if k[1] == "s3" else None) for k in cases}
            results = {k: f.result() for k, f in futures.items()}
    print(f"{'where':<6}{'mode':<16}{'gc':<4}{'trim':<6}{'3rd round':>10}{'growth':>9}"
          f"{'peak':>8}   (MiB; growth and peak above the 3rd round, 40 rounds, "
          f"16 MiB state)")
    for (m, w, c, t), r in results.items():
        if "error" in r:
            print(f"{w:<6}{m:<16}{c:<4}{'yes' if t else 'no':<6} error: {r['error']}")
            continue
        print(f"{w:<6}{m:<16}{c:<4}{'yes' if t else 'no':<6}{r['third']:10.0f}"
              f"{r['growth']:9.1f}{r['peak']:8.1f}")
    if args.json:
        pathlib.Path(args.json).write_text(json.dumps(
            [{"mode": m, "where": w, "collector": c, "trim": t, **r}
             for (m, w, c, t), r in results.items()], indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
