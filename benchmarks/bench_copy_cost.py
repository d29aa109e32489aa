#!/usr/bin/env python3
"""Python cost per tensor of pyckpt's in-memory copies of torch state on a device (issue 40
item 4), measured on the CPU: this tree against an earlier revision, rounds interleaved.

On a GPU, ``copy_state`` / ``Checkpoint.snapshot()`` / ``restore(snapshot)`` cost the
device copy (what ``torch._foreach_copy_`` of the same tensors costs) plus pyckpt's Python
work in front of it. This proxy runs the device path on CPU tensors (device_proxy.py):
an adapter placed before torch's makes every CPU tensor a ``DeviceArray`` of a stand-in
engine (its ``copy`` is ``torch_device.foreach_copy``, its ``empty_like``
``torch.empty_like``, as ``TorchCudaEngine``'s), and the ``copy`` hook is
``torch_device.copy_tensors`` with every pair copied by ``foreach_copy``. The tensors
are small, so the difference to ``torch._foreach_copy_`` is mostly the Python work
(glibc's mmap threshold is raised so that freed memory is reused, as CUDA's caching
allocator reuses it: one snapshot's buffers do not fault in fresh pages):

- ``gpt``: ``Checkpoint(state=...)`` of 1,162 float32 tensors (bench_gpu.py's 32-layer
  transformer with Adam m and v, ``--mib`` MiB);
- ``seq32``: ``Checkpoint(model=...)`` of an ``nn.Sequential`` of 16 ``Linear(256, 256)``
  (32 tensors);
- ``enc12+adam``: ``Checkpoint(model=..., optimizer=...)`` of 12
  ``TransformerEncoderLayer(64, 4, 128)`` and their Adam after one step (576 tensors:
  parameters, ``exp_avg``, ``exp_avg_sq``, ``step``): a graph with a state node (the
  optimizer), which no kept walk covers yet.

Per state, the median (and the best) of ``--reps`` calls of ``torch._foreach_copy_`` (the limit),
``copy_state`` (``gpt``: of the two dicts; ``seq32``: of the two modules), ``snapshot()``,
``snapshot(into=)`` and ``restore(snapshot)``; the table gives each with its Python cost
per tensor ((time - limit) / tensors) and the earlier revision's. Each operation is
repeated on an unchanged graph, as a training loop repeats it: from the second call on,
the graph's kept walk is re-checked instead of walked (pyckpt/graph/walk_cache.py; the
proxy adapter stamps tensors as torch's does).

Usage: python benchmarks/bench_copy_cost.py [--before REV] [--rounds 3] [--reps 21]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
from pathlib import Path

from harness import against, child_json

HERE = Path(__file__).resolve().parent

MEASURE = """
import json, sys
sys.path.insert(0, sys.argv[1])
import torch
import pyckpt
from pyckpt.device.array import DeviceArray
from device_proxy import install
from bench_gpu import build_state
from harness import copy_rows, median_best

mib, reps = int(sys.argv[2]), int(sys.argv[3])
torch.set_num_threads(1)
install()


def med(fn):
    return list(median_best(fn, reps))


def seq(seed):
    torch.manual_seed(seed)
    return torch.nn.Sequential(*[torch.nn.Linear(256, 256) for _ in range(16)])


def enc_adam(seed):
    torch.manual_seed(seed)
    m = torch.nn.Sequential(*[torch.nn.TransformerEncoderLayer(64, 4, 128, batch_first=True)
                              for _ in range(12)])
    opt = torch.optim.Adam(m.parameters())
    m(torch.randn(2, 4, 64)).sum().backward()
    opt.step()
    tensors = [p.detach() for p in m.parameters()] + \\
        [v for s in opt.state.values() for v in s.values() if torch.is_tensor(v)]
    return pyckpt.Checkpoint(model=m, optimizer=opt), tensors


gpt_a, gpt_b = build_state(mib << 20, 32, torch.device("cpu"), 0), \\
    build_state(mib << 20, 32, torch.device("cpu"), 1)
seq_a, seq_b = seq(0), seq(1)
(enc_a, enc_ta), (enc_b, enc_tb) = enc_adam(0), enc_adam(1)
cases = {
    "gpt": (pyckpt.Checkpoint(state=gpt_a), pyckpt.Checkpoint(state=gpt_b), gpt_a, gpt_b,
            list(gpt_a.values()), list(gpt_b.values())),
    "seq32": (pyckpt.Checkpoint(model=seq_a), pyckpt.Checkpoint(model=seq_b), seq_a, seq_b,
              list(seq_a.parameters()), list(seq_b.parameters())),
    "enc12+adam": (enc_a, enc_b, enc_a, enc_b, enc_ta, enc_tb),
}
out = {}
for name, (src, dst, csrc, cdst, a, b) in cases.items():
    rows, snap = copy_rows(med, src, dst, a, b, csrc, cdst)
    assert isinstance(snap.arrays[snap.keys()[0]], DeviceArray), "the proxy engine is not used"
    out[name] = {"tensors": len(a), **rows}
print(json.dumps(out))
"""


def measure(tree: Path | None, args: argparse.Namespace) -> dict:
    env = dict(os.environ)
    # freed memory reused, as CUDA's caching allocator reuses it (glibc would unmap a large
    # freed block and fault its pages in again at the next snapshot's first copy)
    env.setdefault("MALLOC_MMAP_THRESHOLD_", str(32 << 20))  # (its maximum)
    env.setdefault("MALLOC_TRIM_THRESHOLD_", str(1 << 31))
    return child_json(MEASURE, [str(HERE), str(args.mib), str(args.reps)], tree, env)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--before", default=None, help="the earlier revision to compare with")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--reps", type=int, default=21, help="calls per contender and round")
    ap.add_argument("--mib", type=int, default=16, help="MiB of the gpt state")
    a = ap.parse_args()
    runs = against(a.before, a.rounds, lambda tree: measure(tree, a), "pyckpt-bench-copy-cost-")
    trees = list(runs)
    this = runs["this tree"]
    for state in this[0]:
        n = this[0][state]["tensors"]
        print(f"\n{state}: {n} tensors, {a.rounds} rounds x {a.reps} calls: median (best)")
        head = f"  {'operation':18s} {'this tree':>18s} {'us/tensor':>14s} {'vs limit':>9s}"
        if a.before:
            head += f" {a.before:>18s} {'us/tensor':>14s}"
        print(head)
        for op in [k for k in this[0][state] if k != "tensors"]:
            line = ""
            for label in trees:
                t, best = (statistics.median(x[state][op][j] for x in runs[label]) for j in (0, 1))
                limit, lbest = (statistics.median(x[state]["foreach"][j] for x in runs[label])
                                for j in (0, 1))
                line += (f" {t * 1e3:8.2f} ({best * 1e3:6.2f})ms"
                         f" {(t - limit) / n * 1e6:6.2f} ({(best - lbest) / n * 1e6:5.2f})")
                if label == "this tree":
                    line += f" {t / limit:8.2f}x"
            print(f"  {op:18s}" + line)
    print("\n(us/tensor: (time - torch._foreach_copy_) / tensors, pyckpt's Python work per "
          "tensor; vs limit: time over torch._foreach_copy_ of the same tensors; in brackets: "
          "from the best call of each round, less disturbed by other work on the machine)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
