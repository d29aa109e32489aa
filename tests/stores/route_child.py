"""One remote route of test_route_conformance.py, run in a process of its own.

    python route_child.py ROUTE PHASE URL OPTIONS_JSON WORKDIR MIB

PHASE ``prepare`` writes what a read route reads (the store answering); ``run``
does the route once. The route *arms* itself just before its own transfer: the first
bulk transfer call after that (``write_files``, ``fetch``, ``read_ranges`` of at least
4 MiB) prints ``armed`` and waits for a line on stdin before it makes any request, so
that the parent starts the transfers of every route of a batch together, and stalls
or kills the store while all of them are under way. The last line
printed is a JSON result: ``error`` (the exception's type, or null), ``message``,
``checkpoint_error`` (an instance of ``pyckpt.CheckpointError``), ``t`` (the
time.time() it ended) and ``hit``: the pyckpt functions (``module:qualname``) that
were on the stack of a bulk transfer call, i.e. the store entry points the route
went through.
"""

import json
import os
import sys
import threading
import time
import traceback

import numpy as np

import pyckpt
from pyckpt.storage.fsspec_store import FsspecStore
from pyckpt.testing.thread_comm import ThreadGroup
from pyckpt.transfer import transfer

ROUTE, PHASE, URL, OPTIONS, WORK, MIB = (sys.argv[1], sys.argv[2], sys.argv[3],
                                         json.loads(sys.argv[4]), sys.argv[5], int(sys.argv[6]))
SRC, DST = f"{URL}/src", f"{URL}/dst"
ARMED, STARTED = threading.Event(), threading.Event()
HIT: set[str] = set()
BIG = 4 << 20


def _record() -> None:
    f = sys._getframe(2)
    while f is not None:
        mod = f.f_globals.get("__name__", "")
        if mod.startswith("pyckpt.") and not mod.startswith(("pyckpt.storage",
                                                             "pyckpt.testing")):
            HIT.add(f"{mod}:{f.f_code.co_qualname}")
        f = f.f_back


def _watch(name, nbytes):
    real = getattr(FsspecStore, name)

    def watched(self, *args, **kwargs):
        _record()
        if ARMED.is_set() and not STARTED.is_set() and nbytes(*args) >= BIG:
            STARTED.set()
            print("armed", flush=True)  # at the door of its transfer: no request made yet
            sys.stdin.readline()  # the parent's go: every route of a batch starts together
        return real(self, *args, **kwargs)

    setattr(FsspecStore, name, watched)


_watch("write_files", lambda files, *a: sum(f.size for f in files))
_watch("fetch", lambda ranges, *a: sum(r.end - r.start for r in ranges))
_watch("read_ranges", lambda path, ranges, *a: sum(e - s for s, e in ranges))


def state(seed=0, n=8):
    """``MIB`` MiB of float32 in ``n`` arrays."""
    size = (MIB << 20) // 4 // n
    return {f"w{i}": np.full(size, seed + i, np.float32) for i in range(n)}


def ckpt(seed=0):
    return pyckpt.Checkpoint(**{k: pyckpt.Variable(v) for k, v in state(seed).items()})


def local_source():
    path = f"{WORK}/local-src"
    pyckpt.save(state(), path)
    return path


def arm():
    """The route's own transfer comes next (at its first bulk transfer call)."""
    ARMED.set()


# -- write routes -------------------------------------------------------------------------

def save():
    tree = state()
    arm()
    pyckpt.save(tree, DST, storage_options=OPTIONS)


def save_async():
    tree = state()
    arm()
    pyckpt.save(tree, DST, storage_options=OPTIONS, blocking=False).wait()


def save_workers():
    def one(comm):
        tree = {k: pyckpt.PerWorker(v) for k, v in state(seed=10 * comm.rank, n=4).items()}
        if comm.rank == 0:
            arm()
        comm.barrier()
        pyckpt.save(tree, DST, storage_options=OPTIONS, comm=comm)
    _group(one)


def manager_async():
    m = pyckpt.CheckpointManager(ckpt(), DST, storage_options=OPTIONS)
    arm()
    m.save(blocking=False)
    try:
        m.wait_until_finished()
    finally:
        m.close()


def _change_half(ck):
    for k in list(state())[1::2]:
        v = getattr(ck, k)
        v.assign(v.numpy() + 1)


def manager_incremental():
    ck = ckpt()
    with pyckpt.CheckpointManager(ck, DST, storage_options=OPTIONS, incremental=True,
                                  max_to_keep=1) as m:  # retention reads the references
        m.restore_or_initialize()
        if PHASE == "prepare":  # the base: a full checkpoint
            m.save()
            return
        _change_half(ck)
        arm()
        m.save()


def tiered_persist():
    m = pyckpt.CheckpointManager(ckpt(), DST, storage_options=OPTIONS,
                                 local_dir=f"{WORK}/local", persist_every=1)
    arm()
    m.save()
    m.close()  # waits for the persist: its error surfaces here


def tiered_incremental():
    ck = ckpt()
    m = pyckpt.CheckpointManager(ck, DST, storage_options=OPTIONS, local_dir=f"{WORK}/local",
                                 persist_every=1, incremental=True)
    try:
        m.restore_or_initialize()
        if PHASE == "prepare":  # the base, persisted
            m.save()
            m.wait_until_finished()
            return
        _change_half(ck)
        arm()
        m.save()
    finally:
        m.close()


def _node_ck(rank, seed):
    return pyckpt.Checkpoint(**{k: pyckpt.PerWorker(v)
                                for k, v in state(seed=seed + 10 * rank, n=4).items()})


def node_tiers():
    def one(comm):
        m = pyckpt.CheckpointManager(_node_ck(comm.rank, 0), DST, storage_options=OPTIONS,
                                     comm=comm, local_dir=f"{WORK}/local{comm.rank}",
                                     persist_every=1, replicate=1)
        try:
            if comm.rank == 0:
                arm()
            m.save()
        finally:
            m.close()
    _group(one)


def node_tiers_restore():
    """A restore of node-local tiers whose local copies are gone: read from the
    durable tier, together (prepared: one persisted checkpoint)."""
    def one(comm):
        ck = _node_ck(comm.rank, 0 if PHASE == "prepare" else 100)
        m = pyckpt.CheckpointManager(ck, SRC, storage_options=OPTIONS, comm=comm,
                                     local_dir=f"{WORK}/restore-{comm.rank}-{os.getpid()}",
                                     persist_every=1, replicate=1)
        try:
            if PHASE == "prepare":
                m.save()
                return
            if comm.rank == 0:
                arm()
            comm.barrier()
            m.restore_or_initialize()
            want = state(seed=10 * comm.rank, n=4)
            bad = [k for k in want if not np.array_equal(getattr(ck, k).value, want[k])]
            assert not bad, f"wrong values for {bad}"
        finally:
            m.close()
    _group(one)


def copy_to_store():
    src = local_source()
    arm()
    transfer(src, DST, "pyckpt", dst_options=OPTIONS)


def export_tensorflow():
    src = local_source()
    arm()
    transfer(src, f"{DST}/model", "tf", dst_options=OPTIONS)


def export_safetensors():
    src = local_source()
    arm()
    transfer(src, f"{DST}/model.safetensors", "safetensors", dst_options=OPTIONS)


def export_hf():
    src = local_source()
    arm()
    transfer(src, f"{DST}/hf", "hf", dst_options=OPTIONS, max_shard_size=(MIB << 20) // 3)


def dcp_writer():
    import torch
    import torch.distributed.checkpoint as dcp

    from pyckpt.dcp import StorageWriter

    sd = {k: torch.from_numpy(v) for k, v in state().items()}
    arm()
    dcp.save(sd, storage_writer=StorageWriter(DST, storage_options=OPTIONS))


# -- read routes (their source is written by the prepare phase) -----------------------------

def _check(tree, want=None):
    want = state() if want is None else want
    bad = [k for k in want if not np.array_equal(np.asarray(tree[k]), want[k])]
    assert not bad, f"wrong values for {bad}"


def load():
    if PHASE == "prepare":
        return pyckpt.save(state(), SRC, storage_options=OPTIONS)
    arm()
    _check(pyckpt.load(SRC, storage_options=OPTIONS))


def reader():
    if PHASE == "prepare":
        return pyckpt.save(state(), SRC, storage_options=OPTIONS)
    r = pyckpt.load_checkpoint(SRC, storage_options=OPTIONS)
    arm()
    _check({k: r.get_tensor(k) for k in state()})


def copy_from_store():
    if PHASE == "prepare":
        return pyckpt.save(state(), SRC, storage_options=OPTIONS)
    arm()
    transfer(SRC, f"{WORK}/copied-{time.monotonic_ns()}", "pyckpt", src_options=OPTIONS)


def load_safetensors():
    if PHASE == "prepare":
        return transfer(local_source(), f"{SRC}.safetensors", "safetensors",
                        dst_options=OPTIONS)
    arm()
    _check(pyckpt.load(f"{SRC}.safetensors", storage_options=OPTIONS))


def load_tensorflow():
    if PHASE == "prepare":
        src = f"{WORK}/local-src-text"
        pyckpt.save({**state(), "names": np.array(["a", "bb"])}, src)  # a string tensor
        return transfer(src, f"{SRC}-tf/model", "tf", dst_options=OPTIONS)
    arm()
    _check(pyckpt.load(f"{SRC}-tf/model", storage_options=OPTIONS))


def load_dcp():
    """A directory written by torch DCP's own fsspec writer, read by pyckpt."""
    if PHASE == "prepare":
        import torch
        import torch.distributed.checkpoint as dcp
        try:
            from torch.distributed.checkpoint import FsspecWriter
        except ImportError:
            from torch.distributed.checkpoint._fsspec_filesystem import FsspecWriter
        sd = {**{k: torch.from_numpy(v) for k, v in state().items()},
              "step": 7}  # a bytes entry
        so = {k: v for k, v in OPTIONS.items() if k != "pyckpt"}
        return dcp.save(sd, storage_writer=FsspecWriter(f"{SRC}-dcp", sync_files=False, **so))
    arm()
    _check(pyckpt.load(f"{SRC}-dcp", storage_options=OPTIONS))


def _group(fn):
    for r in ThreadGroup(2, timeout=300).run(fn):
        if isinstance(r, BaseException):
            raise r


ROUTES = {name: fn for name, fn in globals().items()
          if callable(fn) and getattr(fn, "__module__", None) == "__main__"
          and not name.startswith("_") and name not in ("state", "ckpt", "local_source", "arm",
                                                        "transfer")}


def _is_checkpoint_error(err):
    """A pyckpt.CheckpointError; through torch DCP (which wraps what its storage layer
    raises in its own CheckpointException, per rank), one on every failed rank."""
    if isinstance(err, pyckpt.CheckpointError):
        return True
    failures = getattr(err, "failures", None)
    if type(err).__name__ == "CheckpointException" and isinstance(failures, dict) and failures:
        return all(isinstance(f[0] if isinstance(f, tuple) else f, pyckpt.CheckpointError)
                   for f in failures.values())
    return False


def main():
    fn = ROUTES[ROUTE]
    err = None
    try:
        fn()
    except BaseException as e:  # noqa: BLE001 - reported to the parent
        err = e
        traceback.print_exc()
    print(json.dumps({"error": None if err is None else type(err).__name__,
                      "message": None if err is None else str(err)[:2000],
                      "checkpoint_error": _is_checkpoint_error(err),
                      "t": time.time(), "hit": sorted(HIT)}), flush=True)
    if os.environ.get("ROUTE_DUMP_AT_EXIT"):  # what keeps the process from ending
        import faulthandler
        faulthandler.dump_traceback_later(float(os.environ["ROUTE_DUMP_AT_EXIT"]))


if __name__ == "__main__":
    main()
