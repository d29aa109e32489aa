#!/usr/bin/env python3
"""JAX restores: the first one in a fresh process against the later ones (issue 40, item 5:
the first within 1.2x of the later ones).

A GPT-like state of JAX arrays (``model_state.state_shapes``: a 12-layer transformer's
parameters and Adam's m and v, float32, ``--mib`` MiB in a few hundred arrays, nested as
``{"params": ..., "adam.m": ..., "adam.v": ...}``) is saved once with
``jax_support.save``; then each contender runs in fresh processes (``--processes`` of
them, interleaved), each doing ``--restores`` calls in a row after building its target
(arrays of the same shapes on ``jax.devices()[0]``, the GPU when there is one, made
there by one jitted function: no host-to-device copy warms anything up). Every
call is timed until its arrays are ready (``jax.block_until_ready``). Contenders:

- ``restore``: ``jax_support.restore(path, target)``;
- ``load``: ``pyckpt.load(path)`` (new ``jax.Array``s on the default device);
- ``device_put``: the floor, ``jax.device_put`` of the same host arrays (read before the
  timing) to the target's shardings, in one call;
- ``orbax``: ``StandardCheckpointer().restore(path, target)``, when orbax is importable.

Each call's arrays are kept until the process ends (``--drop``: dropped before the next
call), so that every call lands in memory the process never used, as the first one does:
with them dropped, the allocator hands the next call the pages the last one freed, and
the later calls skip the page faults that the first one (and any restore into a program's
live state) takes. Before each call, as in every benchmark here, a ballast the size of
the state is touched and freed (harness.touch_ballast: no first touch of a VM's memory
inside the timing), and ``gc`` is collected, then disabled during the call.

The table gives, per contender, the median over processes of the first call, of the later
calls (each process's median of calls 2..n), and of first / later per process (target:
<= 1.2). With ``--before REV`` the pyckpt contenders also run under that revision's Python
code (``harness.tree_at``: a git worktree with this install's compiled core), alternating
with this tree's. ``--bounce`` makes this tree's restore treat the target's arrays as if
they were on an accelerator (the path of GPU arrays: reads through reused bounce buffers,
one batched ``device_put`` per buffer), so that a machine without one measures that path.

Usage: python benchmarks/bench_jax_restore.py [--mib 256] [--processes 5] [--restores 4]
    [--contenders restore,load,device_put,orbax] [--before REV] [--bounce] [--drop]
    [--json PATH]
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

from harness import TREE_PRELUDE, make_workdir, remove_tree, tree_at, write_json

HERE = Path(__file__).resolve().parent

COMMON = """
import json, sys, time
sys.path.insert(0, sys.argv[1])
import numpy as np
import jax
from model_state import build_state, state_shapes

GROUPS = ("params", "adam.m", "adam.v")


def nested(flat):
    out = {}
    for k, v in flat.items():
        group, name = next((g, k[len(g) + 1:]) for g in GROUPS if k.startswith(g + "."))
        out.setdefault(group, {})[name] = v
    return out
"""

SAVE = COMMON + """
from pyckpt.adapters import jax_support

path, mib, seed, orbax_path = sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), sys.argv[5]
tree = jax.tree_util.tree_map(jax.device_put, nested(build_state(mib << 20, seed)))
jax_support.save(tree, path)
if orbax_path:
    import orbax.checkpoint as ocp
    ckptr = ocp.StandardCheckpointer()
    ckptr.save(orbax_path, tree)
    ckptr.wait_until_finished()
leaves = jax.tree_util.tree_leaves(tree)
print(json.dumps({"arrays": len(leaves), "bytes": sum(int(a.nbytes) for a in leaves),
                  "platform": jax.devices()[0].platform, "device": str(jax.devices()[0])}))
"""

MEASURE = COMMON + """
import gc
from harness import touch_ballast

path, contender, mib, restores, bounce, keep = (sys.argv[2], sys.argv[3], int(sys.argv[4]),
                                                int(sys.argv[5]), sys.argv[6] == "1",
                                                sys.argv[7] == "1")
dev = jax.devices()[0]
shapes = state_shapes(mib << 20)
nbytes = 4 * len(GROUPS) * sum(int(np.prod(s)) for s in shapes.values())
# made on the device, as a program's state is (no host-to-device copy warms anything up)
with jax.default_device(dev):
    target = jax.jit(lambda: {g: {k: jax.numpy.zeros(s, np.float32) for k, s in shapes.items()}
                              for g in GROUPS})()
jax.block_until_ready(target)
if contender in ("restore", "load"):
    import pyckpt
    from pyckpt.adapters import jax_support
    if bounce:  # this tree only: the accelerator path for every array
        jax_support.through_bounce_buffers = lambda leaf: True
    if contender == "restore":
        fn = lambda: jax_support.restore(path, target)
    else:
        fn = lambda: pyckpt.load(path)
elif contender == "device_put":
    import pyckpt
    host = pyckpt.load(path, as_numpy=True)
    leaves, treedef = jax.tree_util.tree_flatten(host)
    shardings = [a.sharding for a in jax.tree_util.tree_leaves(target)]
    assert jax.tree_util.tree_structure(target) == treedef
    fn = lambda: jax.device_put(leaves, shardings)
elif contender == "orbax":
    import orbax.checkpoint as ocp
    ckptr = ocp.StandardCheckpointer()
    fn = lambda: ckptr.restore(path, target)
else:
    raise SystemExit(f"unknown contender {contender!r}")
times, cpu, kept = [], [], []
for _ in range(restores):
    touch_ballast(nbytes)
    gc.collect()
    gc.disable()
    c, t = time.process_time(), time.perf_counter()
    out = fn()
    jax.block_until_ready(out)
    times.append(time.perf_counter() - t)
    cpu.append(time.process_time() - c)
    gc.enable()
    if keep:
        kept.append(out)
    out = None
print(json.dumps({"times": times, "cpu": cpu}))
"""


def child(code: str, args: list[str], tree: Path | None) -> dict:
    env = dict(os.environ)
    env.pop("PYCKPT_BENCH_TREE", None)
    if tree is not None:
        env["PYCKPT_BENCH_TREE"] = str(tree)
    r = subprocess.run([sys.executable, "-c", TREE_PRELUDE + code, str(HERE), *args],
                       capture_output=True, text=True, env=env, cwd=tempfile.gettempdir(),
                       timeout=1800)
    if r.returncode:
        raise RuntimeError(r.stderr[-3000:])
    return json.loads(r.stdout.strip().splitlines()[-1])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--mib", type=int, default=256, help="MiB of the state (default 256)")
    ap.add_argument("--processes", type=int, default=5,
                    help="fresh processes per contender (default 5)")
    ap.add_argument("--restores", type=int, default=4, help="calls per process (default 4)")
    ap.add_argument("--contenders", default="restore,load,device_put,orbax",
                    help="comma-separated (default: all; orbax only where importable)")
    ap.add_argument("--before", default=None, help="an earlier revision to compare with")
    ap.add_argument("--bounce", action="store_true",
                    help="this tree's restore takes the accelerator path for every array")
    ap.add_argument("--drop", action="store_true",
                    help="drop each call's arrays before the next call (default: keep them)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--dir", default=None, help="where the checkpoints go (default: /tmp)")
    ap.add_argument("--json", default=None, metavar="PATH")
    ap.add_argument("--quick", action="store_true", help="64 MiB, 2 processes, 3 restores")
    a = ap.parse_args()
    if a.quick:
        a.mib, a.processes, a.restores = 64, 2, 3
    if a.mib < 1 or a.processes < 1 or a.restores < 2:
        ap.error("--mib and --processes must be >= 1, --restores >= 2")
    wanted = [c.strip() for c in a.contenders.split(",") if c.strip()]
    has_orbax = "orbax" in wanted and subprocess.run(
        [sys.executable, "-c", "import orbax.checkpoint"], capture_output=True).returncode == 0
    if "orbax" in wanted and not has_orbax:
        print("orbax is not importable: its contender is skipped")
        wanted.remove("orbax")
    work = make_workdir(a.dir, "pyckpt-bench-jax-")
    ckpt, orbax_ckpt = work / "pyckpt-ckpt", work / "orbax-ckpt"
    trees: dict[str, Path | None] = {"this tree": None}
    runs: dict[tuple[str, str], list[list[float]]] = {}
    cpus: dict[tuple[str, str], list[list[float]]] = {}  # CPU seconds, all threads
    try:
        info = child(SAVE, [str(ckpt), str(a.mib), str(a.seed),
                            str(orbax_ckpt) if has_orbax else ""], None)
        print(f"state: {info['arrays']} arrays, {info['bytes'] / 2**20:.0f} MiB, on "
              f"{info['device']} ({info['platform']}); {a.processes} processes x "
              f"{a.restores} calls per contender" + (" (--bounce)" if a.bounce else "")
              + (", each call's arrays dropped before the next" if a.drop else
                 ", every call's arrays kept"))
        if a.before:
            trees[a.before] = tree_at(a.before, work / "before")
        jobs = [(label, c) for c in wanted for label in trees
                if label == "this tree" or c in ("restore", "load")]
        for p in range(a.processes):
            for label, c in (jobs if p % 2 == 0 else jobs[::-1]):
                path = orbax_ckpt if c == "orbax" else ckpt
                bounce = "1" if a.bounce and label == "this tree" else "0"
                out = child(MEASURE, [str(path), c, str(a.mib), str(a.restores), bounce,
                                      "0" if a.drop else "1"], trees[label])
                runs.setdefault((label, c), []).append(out["times"])
                cpus.setdefault((label, c), []).append(out["cpu"])
            print(f"process round {p + 1}/{a.processes} done", flush=True)
    finally:
        if a.before:
            remove_tree(work / "before")
        shutil.rmtree(work, ignore_errors=True)
    print(f"\n{'contender':12s} {'tree':12s} {'first':>9s} {'later':>9s} {'first/later':>12s}"
          f" {'target':>7s} {'CPU first':>10s} {'later':>9s} {'ratio':>6s}")
    rows = {}
    for (label, c), times in runs.items():
        row = rows[f"{c} @ {label}"] = {"times": times, "cpu": cpus[(label, c)]}
        for kind, xs in (("", times), ("cpu_", cpus[(label, c)])):
            row[kind + "first_s"] = statistics.median(t[0] for t in xs)
            row[kind + "later_s"] = statistics.median(statistics.median(t[1:]) for t in xs)
            row[kind + "first_over_later"] = statistics.median(
                t[0] / max(statistics.median(t[1:]), 1e-9) for t in xs)
        ratio = row["first_over_later"]
        ok = "met" if ratio <= 1.2 else "MISSED"
        print(f"{c:12s} {label:12s} {row['first_s'] * 1e3:7.1f}ms {row['later_s'] * 1e3:7.1f}ms "
              f"{ratio:11.2f}x {ok if c != 'device_put' else '':>7s} "
              f"{row['cpu_first_s'] * 1e3:8.1f}ms {row['cpu_later_s'] * 1e3:7.1f}ms "
              f"{row['cpu_first_over_later']:5.2f}x")
    print("\n(first: the first call in a fresh process; later: the median of calls 2..n; "
          "first/later: the median over processes of each one's ratio; target <= 1.2x; "
          "CPU: the process's CPU seconds in the call, every thread, which other load on "
          "the machine disturbs less than the wall time)")
    if a.json:
        write_json(a.json, {"args": vars(a), "state": info, "rows": rows})
    return 0


if __name__ == "__main__":
    sys.exit(main())
