"""Writes the DCP checkpoint under tests/interop_dcp/fixtures/ with torch's own
torch.distributed.checkpoint, from 2 processes (torchrun, gloo, CPU).

Run it (torch installed; pyckpt is not imported) to regenerate it:

    python tests/interop_dcp/make_fixtures.py [OUT_DIR]

It starts ``torchrun --nproc-per-node 2`` on itself. The two workers build a
2-rank CPU DeviceMesh and ``dcp.save`` (FileSystemWriter, default planner) a
state dict with:

- ``model.sharded``: a 5x3 float32 DTensor sharded ``Shard(0)`` (rows 0-2 on rank
  0, 3-4 on rank 1: two chunks, one per rank's file);
- ``model.cols``: a 2x4 bfloat16 DTensor sharded ``Shard(1)`` (two chunks of columns);
- ``model.replicated``: a float64 DTensor ``Replicate()`` (one chunk, written once);
- ``plain.*``: plain tensors: bfloat16, int64, bool, a transposed (non-contiguous:
  stored with its strides) int32 view, and a 0-d float32;
- ``nested.deep.u8``: a tensor two dicts down;
- ``nested.step`` (an int) and ``nested.blob`` (an io.BytesIO): non-tensor entries,
  stored by DCP as torch.save'd bytes.

Beside the checkpoint (``fixtures/ckpt``) it writes ``fixtures/expected.npz``: each
tensor's value under ``t:<key>`` (bfloat16 as its raw uint16 bits, under
``bf16:<key>``), the exact stored bytes of each non-tensor entry under
``b:<key>`` (uint8), and the chunk boxes of the sharded tensors under
``chunks:<key>`` (rows of offsets then sizes), so that the tests compare exactly
without torch.
"""

from __future__ import annotations

import io
import os
import pickle
import shutil
import subprocess
import sys

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))


def full_values():
    """The global values every worker builds (seeded: the same on both)."""
    import torch
    g = torch.Generator().manual_seed(24)
    return {
        "sharded": torch.randn(5, 3, generator=g),
        "cols": torch.randn(2, 4, generator=g).to(torch.bfloat16),
        "replicated": torch.randn(3, generator=g, dtype=torch.float64),
        "bf16": torch.tensor([1.5, -2.25, 3.0], dtype=torch.bfloat16),
        "i64": torch.tensor([2 ** 40, -7, 0], dtype=torch.int64),
        "flags": torch.tensor([True, False, True]),
        "transposed": torch.arange(6, dtype=torch.int32).reshape(2, 3).t(),
        "scalar": torch.tensor(7.25),
        "u8": torch.arange(4, dtype=torch.uint8),
    }


def state_dict(mesh):
    from torch.distributed.tensor import Replicate, Shard, distribute_tensor
    v = full_values()
    assert not v["transposed"].is_contiguous()
    return {
        "model": {
            "sharded": distribute_tensor(v["sharded"], mesh, [Shard(0)]),
            "cols": distribute_tensor(v["cols"], mesh, [Shard(1)]),
            "replicated": distribute_tensor(v["replicated"], mesh, [Replicate()]),
        },
        "plain": {k: v[k] for k in ("bf16", "i64", "flags", "transposed", "scalar")},
        "nested": {"deep": {"u8": v["u8"]}, "step": 42, "blob": io.BytesIO(b"opaque bytes")},
    }


def expected(ckpt: str) -> dict[str, np.ndarray]:
    """What the tests compare against (module doc), read with torch's own classes."""
    import torch
    out: dict[str, np.ndarray] = {}
    v = full_values()
    names = {"sharded": "model.sharded", "cols": "model.cols", "replicated": "model.replicated",
             "u8": "nested.deep.u8"}
    for k, t in v.items():
        key = names.get(k, f"plain.{k}")
        if t.dtype == torch.bfloat16:
            out[f"bf16:{key}"] = t.contiguous().view(torch.int16).numpy().view(np.uint16)
        else:
            out[f"t:{key}"] = t.contiguous().numpy()
    with open(os.path.join(ckpt, ".metadata"), "rb") as f:
        md = pickle.load(f)  # our own file, just written by torch
    for key, m in md.state_dict_metadata.items():
        if type(m).__name__ == "BytesStorageMetadata":
            info = next(s for i, s in md.storage_data.items() if i.fqn == key)
            with open(os.path.join(ckpt, info.relative_path), "rb") as f:
                f.seek(info.offset)
                out[f"b:{key}"] = np.frombuffer(f.read(info.length), dtype=np.uint8)
        elif len(m.chunks) > 1:
            out[f"chunks:{key}"] = np.array([list(c.offsets) + list(c.sizes) for c in m.chunks])
    return out


def worker(out: str) -> None:
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp
    from torch.distributed.device_mesh import init_device_mesh
    dist.init_process_group("gloo")
    mesh = init_device_mesh("cpu", (2,))
    ckpt = os.path.join(out, "ckpt")
    dcp.save(state_dict(mesh), checkpoint_id=ckpt)
    dist.barrier()
    if dist.get_rank() == 0:
        np.savez_compressed(os.path.join(out, "expected.npz"), **expected(ckpt))
    dist.destroy_process_group()


def main() -> None:
    if len(sys.argv) > 2 and sys.argv[1] == "--worker":
        worker(sys.argv[2])
        return
    out = sys.argv[1] if len(sys.argv) > 1 else os.path.join(HERE, "fixtures")
    if os.path.exists(out):
        shutil.rmtree(out)
    os.makedirs(out)
    torchrun = os.path.join(os.path.dirname(sys.executable), "torchrun")
    subprocess.run([torchrun, "--standalone", "--nproc-per-node", "2", os.path.abspath(__file__),
                    "--worker", out], check=True)
    total = sum(os.path.getsize(os.path.join(r, f)) for r, _, fs in os.walk(out) for f in fs)
    import torch
    print(f"wrote {out}: {total} bytes (torch {torch.__version__})")


if __name__ == "__main__":
    main()
