"""The multi-worker save protocol (docs/PROTOCOL.md, "Multi-worker saves").

Every worker calls ``distributed_save`` with its items; the steps:

 1. (every worker) build a local plan: keys, dtypes, global shapes, blocks, and
    a CRC-32C digest of each replicated value's bytes (the C++ core); local
    validation errors travel inside the plan;
 2. (every worker) send the local plan to the coordinator (rank 0);
 3. (coordinator) validate the global plan (replicated values must have the
    same digest everywhere) and decide who writes each block and each
    replicated array (planner.py); broadcast the decision;
 4. (every worker) write its assigned blocks into its own shard files, named
    with the attempt id and its rank, each chunk checksummed;
 5. (every worker) send what it wrote, or its error, to the coordinator;
 6. (coordinator) if every worker succeeded, assemble the manifest and commit
    it (the index, written last); otherwise delete the attempt's files;
    broadcast the outcome;
 7. (every worker) return, or raise the same error naming the failed workers.

A worker that dies or hangs makes the next collective step time out on the
others (WorkerTimeoutError), before anything was committed.
"""

from __future__ import annotations

import dataclasses
import traceback
from typing import Any, Callable, Sequence

import numpy as np

from .._dtypes import dtype_name, little_endian
from .._native import core as _core
from ..engine import commit
from ..engine.options import DEFAULT
from ..engine import writer
from ..engine.incremental import Base, record, reference
from ..engine.writer import PreparedTensor, check_metadata, info
from ..format.manifest import FileEntry
from ..sharded import ShardedArray
from ..sharded.perworker import INFO_KEY, PerWorker
from ..storage import Store
from ..tree import validate_keys
from ..variables import Variable
from .comm import Communicator
from .node_local import DistributedSaveError, node_local_commit
from .incremental import Reuse, decide
from .planner import plan_global
from .plans import GlobalPlan, LocalPlan, TensorPlan, WriteResult


def _as_array(value: Any) -> np.ndarray:
    if isinstance(value, Variable):
        return value._value
    return value if isinstance(value, np.ndarray) else np.asarray(value)


def _digests(prepared: list[PreparedTensor], replicated: np.ndarray, options: Any) -> np.ndarray:
    """Per item, a CRC-32C digest of a replicated value's bytes (0 for the others): the
    masked CRC of each 1 MiB chunk, computed by the C++ core on all threads, then a
    CRC of those CRCs for values of several chunks."""
    out = np.zeros(len(prepared), dtype=np.uint32)
    idx = np.nonzero(replicated)[0]
    if not len(idx):
        return out
    opts = _core.WriteOptions(chunk_size=options.chunk_size, threads=options.threads,
                              piece_size=options.piece_size)  # no progress: nothing is written
    crcs, begin = _core.compute_checksums(keys=[prepared[i].key for i in idx],
                                          arrays=[prepared[i].array for i in idx], options=opts)
    begin = np.asarray(begin, dtype=np.int64)
    counts = np.diff(begin)
    one = counts == 1
    out[idx[one]] = crcs[begin[:-1][one]]
    for j in np.nonzero(counts > 1)[0]:
        out[idx[j]] = _core.crc32c(crcs[begin[j]:begin[j + 1]].tobytes())
    return out


def local_plan(rank: int, items: Sequence[tuple[str, Any]], world: int = 1,
               options: Any = None) -> tuple[LocalPlan, list]:
    """Step 1: the plan of one worker, and its prepared (key, array) pairs. A
    ``PerWorker`` item becomes row ``rank`` of a tensor of shape ``(world, *shape)``."""
    keys, dtypes, gshapes, prepared = [], [], [], []
    ndim = max([(v.local.ndim if isinstance(v, ShardedArray) else
                 _as_array(v.value).ndim + 1 if isinstance(v, PerWorker) else _as_array(v).ndim)
                for _, v in items] + [1])
    n = len(items)
    sharded = np.zeros(n, dtype=bool)
    per_worker = np.zeros(n, dtype=bool)
    offsets = np.zeros((n, ndim), dtype=np.int64)
    shapes = np.ones((n, ndim), dtype=np.int64)
    nbytes = np.zeros(n, dtype=np.int64)
    error = None
    try:
        validate_keys([key for key, _ in items])
    except (TypeError, ValueError) as e:
        error = str(e)
    for i, (key, value) in enumerate(items):
        try:
            if isinstance(value, ShardedArray):
                arr, gshape = value.local, value.global_shape
                sharded[i] = True
                offsets[i, :arr.ndim] = value.offsets
            elif isinstance(value, PerWorker):  # this worker's row of (world, *shape)
                arr = _as_array(value.value)
                arr = arr.reshape((1,) + arr.shape)
                gshape = (world,) + arr.shape[1:]
                sharded[i] = per_worker[i] = True
                offsets[i, 0] = rank
            else:
                arr = _as_array(value)
                gshape = tuple(arr.shape)
            name = dtype_name(arr.dtype)
        except (TypeError, ValueError) as e:
            error = error or f"{key!r}: {e}"
            arr, gshape, name = np.zeros(0), (0,), "float64"
        arr = little_endian(arr)
        shapes[i, :arr.ndim] = arr.shape
        nbytes[i] = arr.nbytes
        keys.append(key)
        dtypes.append(name)
        gshapes.append(tuple(int(x) for x in gshape))
        prepared.append(PreparedTensor(key, arr, name))
    digest = _digests(prepared, ~sharded, options or DEFAULT) if world > 1 and error is None \
        else np.zeros(n, dtype=np.uint32)
    plan = LocalPlan(rank, tuple(keys), tuple(dtypes), tuple(gshapes), sharded, offsets, shapes,
                     nbytes, error, digest, per_worker)
    return plan, prepared


class _Written:
    """The blocks the workers wrote (their ``WriteResult`` s), looked up by (rank,
    item): where each lies in the files of all workers, one after the other."""

    def __init__(self, gp: GlobalPlan, results: list[WriteResult], chunk: int) -> None:
        self.gp, self.results = gp, results
        self.files: list[FileEntry] = []
        self.first: list[int] = []  # per rank: its first file's position in files
        self.crc_starts = []
        for wr in results:
            self.first.append(len(self.files))
            self.files.extend(wr.files)
            counts = -(-wr.nbytes // chunk) if wr.nbytes is not None else np.zeros(0, np.int64)
            starts = np.zeros(len(counts) + 1, dtype=np.int64)
            np.cumsum(counts, out=starts[1:])
            self.crc_starts.append(starts)

    def block(self, r: int, item: int) -> tuple[int, int, int, np.ndarray]:
        """(file, offset, nbytes, chunk CRCs) of item ``item`` of rank ``r``."""
        res = self.results[r]
        # a worker that wrote items (and did not fail) reports all its columns
        assert res.nbytes is not None and res.file is not None
        assert res.offset is not None and res.crcs is not None
        p = int(np.searchsorted(self.gp.writes[r], item))
        n = int(res.nbytes[p])
        return (int(res.file[p]) + self.first[r] if n else 0, int(res.offset[p]), n,
                res.crcs[self.crc_starts[r][p]:self.crc_starts[r][p + 1]])


def _assemble(tplans: list[TensorPlan], gp: GlobalPlan, results: list[WriteResult],
              chunk: int, tree: Any, graph: dict | None, metadata: dict | None, attempt: str,
              world: int, reuse: Reuse | None = None) -> commit.ManifestParts:
    """Step 6: the index of the blocks the workers wrote (``results``), and of an
    incremental save's referenced blocks (``reuse``: workers/incremental.py; their
    files come after every worker's own), as the parts ``commit`` builds it from."""
    written = _Written(gp, results, chunk)
    files = written.files
    cols: list[tuple[int, int, int, np.ndarray]] = []
    boxes: list = []
    hashes: list[str] = []
    where: dict[tuple[str, str], int] = {}
    for t in tplans:
        for b in range(len(t.rank)):
            r, item = int(t.rank[b]), int(t.item[b])
            if t.box_offsets is None or t.box_shapes is None:
                boxes.append(None)
            else:
                boxes.append((tuple(t.box_offsets[b].tolist()), tuple(t.box_shapes[b].tolist())))
            j = -1 if reuse is None else reuse.blocks.get((r, item), -1)
            if j < 0:
                cols.append(written.block(r, item))
            else:
                assert reuse is not None and reuse.base is not None
                cols.append(reference(reuse.base, j, files, where))  # appended after own
            if reuse is not None:
                hashes.append(reuse.hashes[(r, item)])
    info_doc = info(attempt, world)
    if reuse is not None:
        info_doc["incremental"] = record(reuse.base, reuse.mode, reuse.changed, reuse.total)
    rows = [t.key for t in tplans if t.per_worker]
    if rows:
        info_doc[INFO_KEY] = rows  # docs/FORMAT.md section 7
    return commit.ManifestParts(
        chunk_size=chunk, files=files, keys=[t.key for t in tplans],
        dtype_names=[t.dtype for t in tplans], shapes=[t.shape for t in tplans],
        file=np.asarray([c[0] for c in cols], np.int64),
        offset=np.asarray([c[1] for c in cols], np.int64),
        nbytes=np.asarray([c[2] for c in cols], np.int64),
        crcs=np.concatenate([c[3] for c in cols]) if cols else np.zeros(0, np.uint32),
        nblocks=np.asarray([len(t.rank) for t in tplans], np.int64),
        box=boxes if any(x is not None for x in boxes) else None,
        tree=tree, graph=graph, metadata=metadata, info=info_doc,
        hashes=hashes if reuse is not None else None)


@dataclasses.dataclass
class Planned:
    """Steps 1-3 on one worker: the decision (``gp``), what this worker writes, and on
    rank 0 the tensors' plans, every worker's local plan, for an incremental save its
    ``Reuse``, and the save's attempt (``gp.attempt`` is its id: the other workers
    write under it and leave its marker to rank 0)."""
    gp: GlobalPlan
    mine: list[PreparedTensor]
    tplans: list[TensorPlan]
    plans: list[LocalPlan] | None
    metadata: dict | None
    reuse: Reuse | None = None
    attempt: commit.Attempt | None = None


def refused_plan(rank: int, error: str) -> LocalPlan:
    """A local plan that refuses the save on every worker, with ``error``."""
    return LocalPlan(rank, (), (), (), np.zeros(0, bool), np.zeros((0, 1), np.int64),
                     np.zeros((0, 1), np.int64), np.zeros(0, np.int64), error)


def plan_save(comm: Communicator, store: Store, path: str,
              items: Callable[[], Sequence[tuple[str, Any]]], metadata: dict | None,
              options: Any, incremental: bool = False, base: Base | None = None) -> Planned:
    """Steps 1-3, on every worker of ``comm`` at the same point. ``items()`` returns this
    worker's (key, value) pairs (an async save copies its values aside in it); its error,
    like any local planning error, refuses the save on every worker: ValueError, nothing
    written. Rank 0 begins the attempt in ``store``/``path`` (``Planned.attempt``,
    ended by its step 6, or here when the save is refused or a collective fails).
    ``incremental``: steps 3b-3c decide what is referenced in ``base`` (rank 0's;
    workers/incremental.py)."""
    rank, world = comm.rank, comm.world_size
    try:
        metadata = check_metadata(metadata)
        plan, prepared = local_plan(rank, items(), world, options)
    except Exception as e:  # noqa: BLE001 - travels in the plan: every worker refuses
        plan, prepared = refused_plan(rank, f"{type(e).__name__}: {e}"), []
    plans = comm.gather(plan)                                               # step 2
    tplans: list[TensorPlan] = []
    gp, attempt = None, None
    if rank == 0:                                                           # step 3
        assert plans is not None  # gathered on rank 0
        gp, tplans = plan_global(plans, "")
        if not gp.error:
            try:  # the attempt and its marker, ended by rank 0 in step 6
                attempt = commit.Attempt.begin(commit.Kind.WORKERS, store, path)
                gp = dataclasses.replace(gp, attempt=attempt.id)
            except Exception as e:  # noqa: BLE001 - refuses the save on every worker
                gp = dataclasses.replace(gp, error=f"cannot start the save: "
                                                   f"{type(e).__name__}: {e}")
    try:
        gp = comm.broadcast(gp)
        assert gp is not None
        if gp.error:
            raise ValueError(f"distributed save of {store.url(path)} refused: {gp.error}")
        reuse = None
        if incremental:
            gp, reuse = decide(comm, store, path, gp, prepared, tplans, base, options)
    except BaseException:
        if attempt is not None:  # nothing of it is written: it gives up
            attempt.end()
        raise
    return Planned(gp, [prepared[i] for i in gp.writes[rank]], tplans, plans, metadata, reuse,
                   attempt)


def write_part(store: Store, path: str, mine: Sequence[PreparedTensor], attempt: str,
               rank: int, options: Any) -> tuple[WriteResult, BaseException | None]:
    """Step 4: writes this worker's blocks. Returns the result for the coordinator (with
    the error text on failure) and the error itself; never raises."""
    try:
        store.makedirs(path)
        data = writer.write_data(store, path, list(mine), attempt=attempt, rank=rank,
                                 options=options)
        return WriteResult(rank, tuple(data.files), data.file, data.offset, data.nbytes,
                           data.crcs), None
    except BaseException as e:  # noqa: BLE001 - reported to the coordinator, raised everywhere
        return WriteResult(rank, error=f"{type(e).__name__}: {e}\n"
                           + "".join(traceback.format_exception(e))[-2000:]), e


def commit_node_local(comm: Communicator, store: Store, path: str, p: Planned,
                      result: WriteResult, *, tree: Any, graph: dict | None, replicate: int,
                      options: Any) -> None:
    """Steps 5-9 of a node-local save (node_local.py): gather the results, rank 0
    assembles the index, then replicas and every node's commit record."""
    rank, world = comm.rank, comm.world_size
    results = comm.gather(result)                                           # step 5
    manifest, error = None, None
    if rank == 0:
        assert results is not None
        error = "\n".join(f"rank {r.rank}: {r.error}" for r in results if r.error) or None
        if error is None:
            try:
                manifest = _assemble(p.tplans, p.gp, results, options.chunk_size, tree, graph,
                                     p.metadata, p.gp.attempt, world).build()
            except BaseException as e:  # noqa: BLE001 - raised on every worker
                error = f"rank 0 (assembling the index): {type(e).__name__}: {e}"
        assert p.attempt is not None
        p.attempt.end()  # its index is built: every node commits it as its RECORD
    node_local_commit(comm, store, path, result, manifest, error, replicate)


class NodeLocalSave:
    """The background part of an async node-local save: ``run()`` writes this worker's
    blocks and runs steps 5-9 on ``comm``, a communicator made for background threads
    (``Communicator.background``), so the job's own never sees a collective of it."""

    def __init__(self, comm: Communicator, store: Store, path: str, p: Planned, *,
                 graph: dict | None, replicate: int, options: Any, tree: Any = None) -> None:
        self.comm, self.store, self.path, self.planned = comm, store, path, p
        self.attempt = p.gp.attempt
        self._tree, self._graph = tree, graph
        self._replicate, self._options = replicate, options

    def run(self) -> None:
        """Steps 4-9 (raises DistributedSaveError or WorkerTimeoutError on failure)."""
        result, _ = write_part(self.store, self.path, self.planned.mine, self.attempt,
                               self.comm.rank, self._options)
        commit_node_local(self.comm, self.store, self.path, self.planned, result, tree=self._tree,
                          graph=self._graph, replicate=self._replicate, options=self._options)


def distributed_save(comm: Communicator, store: Store, path: str, items: Sequence[tuple[str, Any]],
                     *, tree: Any = None, graph: dict | None = None,
                     metadata: dict | None = None, options: Any = None,
                     node_local: bool = False, replicate: int = 0, incremental: bool = False,
                     base: Base | None = None) -> None:
    """Saves this worker's ``items`` (``(key, array, ShardedArray or PerWorker)`` pairs) into the
    one checkpoint at ``path``; every worker of ``comm`` calls it (steps in the module
    doc). Rank 0's ``tree``, ``graph`` and ``metadata`` go into the manifest;
    ``options`` are the writer's (chunk size...), default ``DEFAULT``.

    Raises, on every worker: ValueError when the plan is refused (nothing written; e.g.
    the copies of a replicated value differ: the message names the key and ranks),
    DistributedSaveError when writing or committing failed (nothing committed),
    WorkerTimeoutError when a worker does not take part in time.

    ``node_local``: ``store``/``path`` are this worker's own (a node-local tier): every
    worker commits the same index in its own directory, after keeping a replica of
    the files of the ``replicate`` workers before it (node_local.py, docs/PROTOCOL.md
    section 7).

    ``incremental``: an incremental save (docs/PROTOCOL.md section 9b) referencing
    the unchanged blocks of ``base`` (rank 0's; None: a full one with fingerprints)."""
    options = options or DEFAULT
    rank = comm.rank
    url = store.url(path)
    p = plan_save(comm, store, path, lambda: items, metadata, options,     # steps 1-3
                  incremental, base)
    result, _ = write_part(store, path, p.mine, p.gp.attempt, rank, options)  # step 4
    if node_local:
        commit_node_local(comm, store, path, p, result, tree=tree, graph=graph,
                          replicate=replicate, options=options)
        return
    results = comm.gather(result)                                           # step 5
    outcome: tuple[str, str | None] = ("ok", None)
    if rank == 0:                                                           # step 6
        assert results is not None and p.attempt is not None  # rank 0's
        with p.attempt:
            failed = [r for r in results if r.error]
            if failed:
                outcome = ("error", "\n".join(f"rank {r.rank}: {r.error}" for r in failed))
                try:  # best effort: a later save's orphan sweep removes what is left
                    store.remove(path, (store.join(path, f.name) for r in results
                                        for f in r.files))
                except OSError:
                    pass
            else:
                try:
                    p.attempt.finish(_assemble(p.tplans, p.gp, results, options.chunk_size,
                                               tree, graph, p.metadata, p.gp.attempt,
                                               comm.world_size, p.reuse))
                except BaseException as e:
                    outcome = ("error", f"rank 0 (commit): {type(e).__name__}: {e}")
    outcome = comm.broadcast(outcome)
    if outcome[0] != "ok":                                                  # step 7
        raise DistributedSaveError(f"distributed save of {url} failed; nothing was "
                                   f"committed:\n{outcome[1]}")


