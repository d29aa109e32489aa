"""One mode of the memory suite (test_flat_memory.py) in a fresh interpreter: a state
of STATE_MIB MiB, WARMUP rounds, then ROUNDS rounds of the mode, with the cyclic
collector on or off (never collected by hand, never trimmed). Prints one JSON line:
the resident set after every round, the state's size and the peak over the timed
rounds (VmHWM, reset after the warm-up through /proc/self/clear_refs).

Usage: python rss_child.py MODE WORKDIR on|off [STORAGE_OPTIONS_JSON]"""

import gc
import json
import os
import sys
import uuid

import numpy as np

import pyckpt

STATE_MIB = 16
N_ARRAYS = 16
WARMUP = 3
#: modes whose steady state takes longer to reach: a tiered manager fills its local tier
#: and starts its persist thread's pools and the store client's connections over the
#: first rounds (CI saw the S3 tier reach its plateau at round 6, then stay flat for 37)
LONGER_WARMUP = {"manager_tiered": 8}
ROUNDS = 40
MiB = 1 << 20


def rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def peak() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("no VmHWM in /proc/self/status")


def reset_peak() -> None:
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")


def state(seed: int = 0) -> dict:
    n = STATE_MIB * MiB // 4 // N_ARRAYS
    return {f"w{i:02d}": np.full(n, seed + i, np.float32) for i in range(N_ARRAYS)}


def variables(values: dict) -> pyckpt.Checkpoint:
    return pyckpt.Checkpoint(**{k: pyckpt.Variable(v) for k, v in values.items()})


# -- the modes: each returns the function of one round ----------------------------------

def m_save(ctx):
    tree = state()
    return lambda: pyckpt.save(tree, ctx.at("s"), storage_options=ctx.so)


def m_save_async(ctx):
    tree = state()
    return lambda: pyckpt.save(tree, ctx.at("s"), storage_options=ctx.so, blocking=False).wait()


def m_load(ctx):
    src = ctx.source()

    def run():
        got = pyckpt.load(src, storage_options=ctx.so)
        del got
    return run


def m_load_into(ctx):
    src, into = ctx.source(), state(seed=100)
    return lambda: pyckpt.load(src, storage_options=ctx.so, into=into)


def m_load_mmap(ctx):
    src = ctx.source()

    def run():
        got = pyckpt.load(src, mmap=True)
        del got
    return run


def m_restore(ctx):
    src = ctx.at("ck")
    variables(state()).write(src, storage_options=ctx.so)
    ck = variables(state(seed=100))
    return lambda: ck.read(src, storage_options=ctx.so).assert_consumed()


def _manager(ctx, blocking=True, **kw):
    ck = variables(state())
    m = pyckpt.CheckpointManager(ck, ctx.at("run"), max_to_keep=2, storage_options=ctx.so, **kw)
    ctx.closing.append(m)
    k = iter(range(10**6))
    w = state()["w00"]

    def run():
        w[next(k) % 1000] += 1  # a change each round (incremental runs save it)
        ck.w00.assign(w)
        m.save(blocking=blocking)
        m.wait_until_finished()
    return run


def m_manager(ctx):
    return _manager(ctx)


def m_manager_async(ctx):
    return _manager(ctx, blocking=False)


def m_manager_tiered(ctx):
    return _manager(ctx, local_dir=f"{ctx.work}/local", persist_every=1)


def m_manager_incremental(ctx):
    return _manager(ctx, incremental=True)


def m_copy_state(ctx):
    a, b = variables(state()), variables(state(seed=100))
    return lambda: pyckpt.copy_state(a, b)


def m_snapshot(ctx):
    a, b = variables(state()), variables(state(seed=100))

    def run():
        snap = a.snapshot()
        b.restore(snap).assert_consumed()
        del snap
    return run


def m_torch(ctx):
    import torch

    tree = {k: torch.from_numpy(v) for k, v in state().items()}
    into = {k: torch.zeros_like(v) for k, v in tree.items()}
    path = ctx.at("t")

    def run():
        pyckpt.save(tree, path, storage_options=ctx.so)
        pyckpt.load(path, storage_options=ctx.so, into=into)
    return run


def m_dcp(ctx):
    import torch
    import torch.distributed.checkpoint as dcp

    import pyckpt.dcp

    sd = {k: torch.from_numpy(v) for k, v in state().items()}
    into = {k: torch.zeros_like(v) for k, v in sd.items()}
    path = ctx.at("dcp")

    def run():
        dcp.save(sd, storage_writer=pyckpt.dcp.StorageWriter(path, storage_options=ctx.so))
        dcp.load(into, storage_reader=pyckpt.dcp.StorageReader(path, storage_options=ctx.so))
    return run


def m_lightning(ctx):
    import torch

    from pyckpt.lightning import CheckpointIO

    io = CheckpointIO(storage_options=ctx.so)
    ckpt = {"state_dict": {k: torch.from_numpy(v) for k, v in state().items()},
            "epoch": 3, "global_step": 100}
    path = ctx.at("last.ckpt")

    def run():
        io.save_checkpoint(ckpt, path)
        got = io.load_checkpoint(path)
        del got
    return run


def m_export_hf(ctx):
    from pyckpt.interop.safetensors import export_hf

    src = ctx.source()
    return lambda: export_hf(src, ctx.at("hf"), max_shard_size="6MB", src_options=ctx.so,
                             dst_options=ctx.so)


def _fsspec_dcp():
    try:
        from torch.distributed.checkpoint import FsspecReader, FsspecWriter
    except ImportError:  # not exported by every torch version
        from torch.distributed.checkpoint._fsspec_filesystem import FsspecReader, FsspecWriter
    return FsspecWriter, FsspecReader


def m_peer_dcp(ctx):
    """torch DCP's own storage (a peer, for benchmarks/bench_memory.py): a save and a
    load into the same tensors per round."""
    import torch
    import torch.distributed.checkpoint as dcp

    sd = {k: torch.from_numpy(v) for k, v in state().items()}
    into = {k: torch.zeros_like(v) for k, v in sd.items()}
    path = ctx.at("peer-dcp")
    if ctx.so:
        writer, reader = _fsspec_dcp()
        make = (lambda: writer(path, **ctx.so), lambda: reader(path, **ctx.so))
    else:
        make = (lambda: dcp.FileSystemWriter(path), lambda: dcp.FileSystemReader(path))

    def run():
        dcp.save(sd, storage_writer=make[0]())
        dcp.load(into, storage_reader=make[1]())
    return run


def m_peer_dcp_async(ctx):
    """torch DCP's async_save (a peer): one per round, waited for."""
    import torch
    import torch.distributed.checkpoint as dcp

    sd = {k: torch.from_numpy(v) for k, v in state().items()}
    path = ctx.at("peer-dcp-async")
    if ctx.so:
        writer = _fsspec_dcp()[0]
        make = (lambda: writer(path, **ctx.so))
    else:
        make = (lambda: dcp.FileSystemWriter(path))
    return lambda: dcp.async_save(sd, storage_writer=make()).result()


MODES = {name[2:]: fn for name, fn in globals().items() if name.startswith("m_")}


def _trimmer():
    """malloc_trim(0) after every round when PYCKPT_MEM_TRIM=1 (the trimmed figures
    of benchmarks/bench_memory.py; the suite never trims)."""
    if os.environ.get("PYCKPT_MEM_TRIM") != "1":
        return lambda: None
    import ctypes

    libc = ctypes.CDLL("libc.so.6")
    return lambda: libc.malloc_trim(0)


class Context:
    def __init__(self, work: str, so: dict | None) -> None:
        self.work, self.so, self.closing = work, so, []
        # a fresh prefix per run on a shared server; a directory of its own locally
        self.base = f"s3://pyckpt/mem-{uuid.uuid4().hex[:10]}" if so else work

    def at(self, name: str) -> str:
        return f"{self.base}/{name}"

    def source(self) -> str:
        src = self.at("src")
        pyckpt.save(state(), src, storage_options=self.so)
        return src


def main(mode: str, work: str, collector: str, so_json: str | None = None) -> None:
    ctx = Context(work, json.loads(so_json) if so_json else None)
    run = MODES[mode](ctx)
    if collector == "off":
        gc.collect()
        gc.disable()
    sizes = []
    trim = _trimmer()
    warmup = LONGER_WARMUP.get(mode, WARMUP)
    for r in range(warmup + ROUNDS):
        if r == warmup:
            reset_peak()
        run()
        trim()
        sizes.append(rss())
    top = peak()
    for m in ctx.closing:
        m.close()
    print(json.dumps({"mode": mode, "collector": collector, "rss": sizes,
                      "state": STATE_MIB * MiB, "warmup": warmup, "peak": top}))


if __name__ == "__main__":
    main(*sys.argv[1:])
