"""Node-local checkpoints of a multi-worker job (the local tier of a tiered
``CheckpointManager``; docs/PROTOCOL.md section 7).

Every worker has a directory of its own (a node's local disk). A node-local save
is the multi-worker save of save.py up to step 5 (each worker writes its blocks
into its own directory); then:

 6. rank 0 assembles the index and broadcasts it with every worker's file list;
 7. with ``replicate=k``, each worker sends its files to the k workers after it
    (ring order) and writes the files of the k workers before it beside its own:
    the replicas;
 8. every worker writes the same index into its own directory, last: that is the
    node's commit record;
 9. the workers' outcomes are all-gathered: if any failed, every worker removes
    its index and files again, so a checkpoint counts only where every worker
    committed its part.

A restore (``restore_plan`` + ``fetch_missing``) all-gathers what each node holds,
picks the newest checkpoint whose files are all held by some node, and sends
every node the files it lacks (a replaced node gets its own part from the peer
holding its replica), so that every node then holds the whole checkpoint.
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from ..engine import commit, naming
from ..engine.commit import read_previous, sweep_orphans
from ..engine.copy import read_data_files
from ..errors import CheckpointError, DistributedSaveError
from ..format import INDEX_NAME, decode_index
from ..storage import Store
from ..storage.base import NewFile
from .comm import Communicator
from .plans import WriteResult


def _write_files(store: Store, path: str, files: Sequence[tuple[str, np.ndarray]]) -> None:
    """Writes whole files durably through the store's one write path (sizes confirmed),
    index not included."""
    if not files:
        return

    def filler(data: np.ndarray) -> Any:
        flat = np.ascontiguousarray(data).reshape(-1).view(np.uint8)

        def fill(begin: int, buf: bytearray) -> bytearray:
            buf[:] = flat[begin:begin + len(buf)].data
            return buf
        return fill

    store.write_files([NewFile(store.join(path, n), int(a.size), filler(a)) for n, a in files])
    store.sync_dir(path)


def _remove(store: Store, path: str, names: Sequence[str], index: bool) -> None:
    """Best effort: un-commit (index first), then the files."""
    try:
        if index:
            store.remove(path, [store.join(path, INDEX_NAME)])
        store.remove(path, [store.join(path, n) for n in names])
    except OSError:
        pass


def node_local_commit(comm: Communicator, store: Store, path: str, mine: WriteResult,
                      manifest: Any, error: str | None, replicate: int) -> None:
    """Steps 6-9 of the module doc, on every worker (``manifest``/``error``: rank 0's)."""
    rank, world = comm.rank, comm.world_size
    manifest, error = comm.broadcast((manifest, error) if rank == 0 else None)
    listing = comm.all_gather([(f.name, f.size) for f in mine.files])
    own = [n for n, _ in listing[rank]]
    if error is not None:
        _remove(store, path, own, index=False)
        raise DistributedSaveError(f"node-local save of {store.url(path)} failed; nothing was "
                                   f"committed:\n{error}")
    k = min(max(int(replicate), 0), world - 1)
    targets = [(rank + d) % world for d in range(1, k + 1)]
    sources = [(rank - d) % world for d in range(1, k + 1)]
    problem = None
    try:
        data = read_data_files(store, path, manifest, own) if targets else []
    except BaseException as e:  # noqa: BLE001 - every worker must reach the exchange
        problem, data = f"reading its files for replication: {type(e).__name__}: {e}", []
    if comm.all_gather(problem) != [None] * world:  # nobody exchanges: no half transfer
        problem = problem or "another worker could not read its files"
    else:
        got = comm.exchange({t: data for t in targets},
                            {s: [size for _, size in listing[s]] for s in sources})
        try:
            _write_files(store, path, [(name, arr) for s in sources
                                       for (name, _), arr in zip(listing[s], got[s])])
            commit.finish(commit.Kind.RECORD, store, path, manifest)  # step 8: the record
        except BaseException as e:  # noqa: BLE001 - reported to every worker below
            problem = f"{type(e).__name__}: {e}"
    problems = comm.all_gather(problem)                                   # step 9
    if any(p is not None for p in problems):
        replicas = [name for s in sources for name, _ in listing[s]]
        _remove(store, path, own + replicas, index=True)
        raise DistributedSaveError(
            f"node-local save of {store.url(path)} failed; nothing was committed:\n"
            + "\n".join(f"rank {r}: {p}" for r, p in enumerate(problems) if p is not None))
    sweep_orphans(store, path)


# -- restore ---------------------------------------------------------------------------------
def inventory(store: Store, directory: str, names: Sequence[str]) -> dict[str, Any]:
    """What this node holds of the committed checkpoints ``names`` of its directory:
    name -> (attempt, world size, every data file of the index, the files present
    with their full size)."""
    out: dict[str, Any] = {}
    for name in names:
        path = store.join(directory, name)
        m = read_previous(store, path)
        if m is None:
            continue
        present = []
        for f in m.files:
            try:
                if store.size(store.join(path, f.name)) == f.size:
                    present.append(f.name)
            except OSError:
                pass
        out[name] = (m.info.get("attempt"), m.info.get("world_size"),
                     tuple(f.name for f in m.files), frozenset(present))
    return out


def restore_plan(inventories: list[dict[str, Any]], order: Sequence[str],
                 world: int) -> str | None:
    """The first of ``order`` (names, newest first) that the nodes can restore together:
    every node that holds its index holds the same attempt's, written by a job of
    ``world`` workers, and every data file is held whole by at least one node."""
    for name in order:
        seen = [inv[name] for inv in inventories if name in inv]
        if not seen or len({(a, w, f) for a, w, f, _ in seen}) != 1 or seen[0][1] != world:
            continue
        held = frozenset().union(*(p for *_, p in seen))
        if held >= set(seen[0][2]):
            return name
    return None


def _read_to_send(store: Store, path: str, name: str, wanted: set[str]) -> dict[str, np.ndarray]:
    """The files of checkpoint ``name`` this node sends to others: a holder of a data file
    holds the index it belongs to, so every chunk is checked like any read."""
    if not wanted:
        return {}
    manifest = read_previous(store, path)
    if manifest is None:
        raise CheckpointError(f"{store.url(path)}: the index of {name} is gone")
    data_files = sorted(f for f in wanted if f != INDEX_NAME)
    out = dict(zip(data_files, read_data_files(store, path, manifest, data_files)))
    if INDEX_NAME in wanted:
        out[INDEX_NAME] = np.frombuffer(store.read_bytes(store.join(path, INDEX_NAME)), np.uint8)
    return out


def fetch_missing(comm: Communicator, store: Store, path: str, name: str,
                  inventories: list[dict[str, Any]]) -> int:
    """Sends every node the files of checkpoint ``name`` that it lacks, from the nodes
    holding them (spread over the holders), and commits the index on nodes that had
    none. Called by every worker; returns the bytes this worker received."""
    rank, world = comm.rank, comm.world_size
    entry = next(inv[name] for inv in inventories if name in inv)
    all_files = list(entry[2])
    holders = {f: [r for r in range(world) if name in inventories[r]
                   and f in inventories[r][name][3]] for f in all_files}
    indexed = [r for r in range(world) if name in inventories[r]]
    sends: dict[int, list[str]] = {}
    recvs: dict[int, list[str]] = {}
    for w in range(world):
        have = inventories[w][name][3] if name in inventories[w] else frozenset()
        need = [f for f in all_files if f not in have]
        if name not in inventories[w]:
            need.append(INDEX_NAME)
        for i, f in enumerate(need):
            hs = holders.get(f, indexed)
            h = hs[(w + i) % len(hs)]
            if h == rank:
                sends.setdefault(w, []).append(f)
            if w == rank:
                recvs.setdefault(h, []).append(f)
    sizes = comm.all_gather({f: store.size(store.join(path, f)) for fs in sends.values()
                             for f in fs})
    cache: dict[str, np.ndarray] = {}
    problem = None
    try:
        cache = _read_to_send(store, path, name, {f for fs in sends.values() for f in fs})
    except (CheckpointError, OSError) as e:  # every worker must hear of it before exchanging
        problem = f"{type(e).__name__}: {e}"
    problems = comm.all_gather(problem)
    if any(p is not None for p in problems):
        raise CheckpointError(f"cannot send the files of {name} between nodes:\n" + "\n".join(
            f"rank {r}: {p}" for r, p in enumerate(problems) if p is not None))
    got = comm.exchange({d: [cache[f] for f in fs] for d, fs in sends.items()},
                        {s: [sizes[s][f] for f in fs] for s, fs in recvs.items()})
    received = [(f, a) for s, fs in recvs.items() for f, a in zip(fs, got[s])]
    store.makedirs(path)
    _write_files(store, path, [(f, a) for f, a in received if f != INDEX_NAME])
    for f, a in received:
        if f == INDEX_NAME:  # last: the node's commit record, through the one commit routine
            index = decode_index(a.tobytes(), store.url(store.join(path, INDEX_NAME)))
            commit.finish(commit.Kind.RECORD, store, path, index)
    return sum(int(a.size) for _, a in received)


def writer_rank(data_file: str) -> int | None:
    """The rank that wrote a data file, from its name (None for other names)."""
    return naming.rank_of(data_file) if naming.is_data_file(data_file) else None
