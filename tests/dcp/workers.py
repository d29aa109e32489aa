"""Worker program of the torchrun tests of pyckpt.dcp (gloo, CPU).

    torchrun --nproc-per-node=N workers.py SCENARIO PATH

Scenarios:
  save        FSDP2 model + Adam state (or DTensors on a CPU mesh), replicated and plain
              tensors, non-tensor entries; dcp.save through pyckpt.dcp.StorageWriter
  load        the same state built on N workers (any N), dcp.load through
              pyckpt.dcp.StorageReader, every value checked against the saved one
  async       dcp.async_save, then the live values change before the save finishes
  fail        rank 1's write fails: nothing committed, the previous checkpoint intact

Each worker writes "ok ..." or "raised ..." to $PYCKPT_TEST_RESULTS/<rank>.
"""

import datetime
import os
import sys
import traceback

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import DTensor, Replicate, Shard, distribute_tensor

import pyckpt.dcp

ROWS = 11  # not a multiple of the world sizes: uneven shards


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.tok = torch.nn.Embedding(ROWS, 6)
        self.out = torch.nn.Linear(6, 3)

    def forward(self, x):
        return self.out(self.tok(x)).sum()


def full_values():
    g = torch.Generator().manual_seed(1)
    return {"sharded": torch.randn(ROWS, 5, generator=g),
            "replicated": torch.randn(4, 4, generator=g).bfloat16(),
            "plain": torch.arange(12, dtype=torch.int64).reshape(3, 4)}


def model_and_optim(mesh, train):
    torch.manual_seed(0)
    net = Net()
    sharded = False
    try:
        from torch.distributed.fsdp import fully_shard

        fully_shard(net, mesh=mesh)
        sharded = True
    except Exception:  # noqa: BLE001 - FSDP2 unsupported on CPU here: DTensors below
        pass
    opt = torch.optim.Adam(net.parameters(), lr=0.01)
    for step in range(train):
        torch.manual_seed(100 + step)
        net(torch.randint(0, ROWS, (8,))).backward()
        opt.step()
        opt.zero_grad()
    return net, opt, sharded


def state(mesh, train):
    net, opt, sharded = model_and_optim(mesh, train)
    msd, osd = get_state_dict(net, opt)
    v = full_values()
    return {"model": msd, "optim": osd,
            "extra": {"sharded": distribute_tensor(v["sharded"], mesh, [Shard(0)]),
                      "replicated": distribute_tensor(v["replicated"], mesh, [Replicate()]),
                      "plain": v["plain"]},
            "step": 42, "loader": {"epoch": 3, "name": "shard-a"}}, net, opt, sharded


def zeroed(sd):
    out = {}
    for k, v in sd.items():
        if isinstance(v, dict):
            out[k] = zeroed(v)
        elif isinstance(v, torch.Tensor):
            out[k] = v.clone()
            (out[k].to_local() if isinstance(out[k], DTensor) else out[k]).zero_()
        elif isinstance(v, (int, float)) and not isinstance(v, bool):
            out[k] = type(v)(0)
        elif isinstance(v, str):
            out[k] = ""
        else:
            out[k] = v
    return out


def full(t):
    return t.full_tensor() if isinstance(t, DTensor) else t


def to_full(sd):
    """The state with every DTensor assembled (a collective: every rank calls it)."""
    if isinstance(sd, dict):
        return {k: to_full(v) for k, v in sd.items()}
    if isinstance(sd, list):
        return [to_full(v) for v in sd]
    return full(sd)


def compare(got, want, path=""):
    if isinstance(want, dict):
        assert set(got) == set(want), (path, sorted(got), sorted(want))
        for k in want:
            compare(got[k], want[k], f"{path}.{k}")
    elif isinstance(want, list):
        assert len(got) == len(want), path
        for i, (g, w) in enumerate(zip(got, want)):
            compare(g, w, f"{path}[{i}]")
    elif isinstance(want, torch.Tensor):
        g, w = full(got), full(want)
        assert g.dtype == w.dtype and torch.equal(g, w), (path, g, w)
    else:
        assert type(got) is type(want) and got == want, (path, got, want)


def scenario(name, path, rank, world):
    mesh = init_device_mesh("cpu", (world,))
    if name == "save":
        sd, _, _, sharded = state(mesh, train=2)
        dcp.save(sd, storage_writer=pyckpt.dcp.StorageWriter(path))
        want = to_full(sd)
        if rank == 0:  # what the load scenarios compare with, written by torch itself
            torch.save(want, path + ".want.pt")
        return f"ok fsdp2={sharded}"
    if name == "load":
        want = torch.load(path + ".want.pt")
        got, net2, opt2, _ = state(mesh, train=0)
        got = zeroed(got)
        dcp.load(got, storage_reader=pyckpt.dcp.StorageReader(path))
        compare(to_full(got), want)
        set_state_dict(net2, opt2, model_state_dict=got["model"], optim_state_dict=got["optim"])
        compare(to_full(get_state_dict(net2, opt2)[0]), want["model"])
        return "ok"
    if name == "async":
        sd, _, _, _ = state(mesh, train=2)
        want = {k: full(v).clone() for k, v in sd["extra"].items()}
        fut = dcp.async_save(sd, storage_writer=pyckpt.dcp.StorageWriter(path))
        for v in sd["extra"].values():  # changed after async_save returned
            (v.to_local() if isinstance(v, DTensor) else v).fill_(7)
        fut.result()
        got = {k: torch.zeros_like(v) for k, v in sd["extra"].items()}
        dcp.load({"extra": got}, storage_reader=pyckpt.dcp.StorageReader(path))
        for k in want:
            assert torch.equal(full(got[k]), want[k]), k
        return "ok"
    if name == "fail":
        sd, _, _, _ = state(mesh, train=2)
        writer = pyckpt.dcp.StorageWriter(path)
        if rank == 1:
            def broken(*a, **k):
                raise OSError("disk full (injected on rank 1)")
            writer.write_data = broken
        try:
            dcp.save(sd, storage_writer=writer)
        except BaseException as e:  # noqa: BLE001 - the expected outcome (CheckpointException)
            failures = getattr(e, "failures", {}) or {}
            causes = "; ".join(f"rank {r}: {f[0] if isinstance(f, tuple) else f!r}"
                               for r, f in sorted(failures.items()))
            return f"raised {type(e).__name__}: {causes or str(e)[:300]}"
        return "saved"
    raise SystemExit(f"unknown scenario {name}")


def main():
    name, path = sys.argv[1], sys.argv[2]
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=60))
    rank, world = dist.get_rank(), dist.get_world_size()
    try:
        text = scenario(name, path, rank, world)
    except BaseException as e:  # noqa: BLE001 - reported to the test
        text = f"raised {type(e).__name__}: {e}\n{traceback.format_exc()}"
    with open(os.path.join(os.environ["PYCKPT_TEST_RESULTS"], str(rank)), "w") as f:
        f.write(text)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
