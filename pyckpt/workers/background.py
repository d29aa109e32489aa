"""Multi-worker saves finished in the background (docs/PROTOCOL.md section 6b):
``CheckpointManager.save(blocking=False)`` with several workers.

A background thread must never issue collectives on the training job's
communicator: they would interleave with the job's own (all_reduce...), whose
order must be the same on every worker, and deadlock or mix messages. So the
save is split at the last collective:

In the caller's thread, at the point where every worker calls ``save``
(``prepare``), with the communicator:
 1. (every worker) copy its values aside (``stage``: staging buffers, pinned for
    device values) and build its local plan from the copies;
 2. (every worker) send the plan to rank 0 (gather);
 3. (rank 0) validate and plan (who writes what), pick the attempt id, mark the
    attempt; broadcast the decision (or refuse: ValueError on every worker).

In a background thread of each worker, through the store only
(``BackgroundSave.run``):
 4. (every worker) write its assigned blocks from its staging copies;
 5. (every worker) publish what it wrote (files, offsets, chunk CRCs), or its
    error, as ``pyckpt-part-<attempt>-<rank>.json`` in the checkpoint
    directory, written atomically;
 6. (rank 0) wait for every worker's part: a failed part ends the wait at once,
    and so does ``timeout`` seconds without a new part; check the parts,
    assemble the manifest and commit it (the index), then remove the parts. On
    failure it writes ``pyckpt-failed-<attempt>.json`` (every error) instead
    and commits nothing;
 7. (other workers) wait for the outcome: the index naming this attempt
    (committed) or the failure file; ``timeout`` seconds without any change of
    the parts present ends the wait (rank 0 dead or stuck).

What a failed attempt leaves (its data files, parts, failure file) is removed
with ``discard`` once every worker is known to be done with it (the manager
does it at its next save, after a collective).
"""

from __future__ import annotations

import base64
import json
import time
from typing import Any, Callable, Sequence

import numpy as np

from ..engine import attempts, commit, naming
from ..engine.commit import read_previous
from ..engine.options import DEFAULT, IOOptions
from ..engine.writer import PreparedTensor
from ..format import INDEX_NAME
from ..format.manifest import FileEntry
from ..sharded import ShardedArray
from ..sharded.perworker import PerWorker
from ..storage import Store
from .comm import Communicator, WorkerTimeoutError
from .plans import GlobalPlan, TensorPlan, WriteResult
from .save import DistributedSaveError, _assemble, plan_save, write_part

__all__ = ["BackgroundSave", "prepare", "planned", "agree", "discard", "part_name", "failed_name"]

PART_PREFIX = "pyckpt-part-"
FAILED_PREFIX = "pyckpt-failed-"
_POLL_FIRST, _POLL_MAX = 0.002, 0.25  # seconds between two looks at the directory


def part_name(attempt: str, rank: int) -> str:
    """The file publishing one worker's part of ``attempt``."""
    return f"{PART_PREFIX}{attempt}-{rank:05d}.json"


def failed_name(attempt: str) -> str:
    """The file by which rank 0 tells every worker that ``attempt`` failed."""
    return f"{FAILED_PREFIX}{attempt}.json"


def _of_attempt(name: str, attempt: str) -> bool:
    if naming.is_data_file(name):
        return naming.attempt_of(name) == attempt
    return (name.startswith(f"{PART_PREFIX}{attempt}-") or name == failed_name(attempt)
            or name == attempts.marker_name(attempt))


def planned(objs: Sequence[Any], staged: Sequence[np.ndarray]) -> list[Any]:
    """What each staged copy is planned as: a ShardedArray block or a PerWorker row
    when its live object is one, else the (replicated) array itself."""
    out: list[Any] = []
    for obj, arr in zip(objs, staged):
        if isinstance(obj, ShardedArray):
            out.append(ShardedArray(arr, obj.global_shape, obj.offsets))
        elif isinstance(obj, PerWorker):
            out.append(PerWorker(arr))
        else:
            out.append(arr)
    return out


def prepare(comm: Communicator, store: Store, path: str,
            stage: Callable[[], Sequence[tuple[str, Any]]], *, tree: Any = None,
            graph: dict | None = None, metadata: dict | None = None,
            options: IOOptions | None = None, timeout: float | None = None,
            incremental: bool = False, base: Any = None) -> "BackgroundSave":
    """Steps 1-3 (module doc; ``save.plan_save``), on every worker of ``comm`` at the
    same point: ``stage()`` copies this worker's values aside and returns its (key,
    value) items; its error, like any local planning error, refuses the save on every
    worker (ValueError). Returns the work of steps 4-7. ``timeout`` (default: the
    communicator's) bounds the background waits. ``incremental``/``base``: an
    incremental save, decided here (``save.plan_save``)."""
    options = options or DEFAULT
    p = plan_save(comm, store, path, stage, metadata, options, incremental, base)
    expected = None
    if comm.rank == 0:
        assert p.plans is not None
        expected = [np.asarray(lp.nbytes)[p.gp.writes[r]] for r, lp in enumerate(p.plans)]
    return BackgroundSave(store, path, p.gp, comm.rank, comm.world_size, p.mine,
                          comm.timeout if timeout is None else float(timeout), options,
                          tplans=p.tplans, expected=expected, tree=tree, graph=graph,
                          metadata=p.metadata, reuse=p.reuse, attempt=p.attempt)


class BackgroundSave:
    """Steps 4-7 of one worker (module doc): ``run()`` returns once the checkpoint
    is committed (rank 0: committed by it; others: seen committed), or raises
    DistributedSaveError (nothing committed) or WorkerTimeoutError."""

    def __init__(self, store: Store, path: str, gp: GlobalPlan, rank: int, world: int,
                 mine: list[PreparedTensor], timeout: float, options: IOOptions, *,
                 tplans: list[TensorPlan], expected: list[np.ndarray] | None, tree: Any,
                 graph: dict | None, metadata: dict | None, reuse: Any = None,
                 attempt: commit.Attempt | None = None) -> None:
        self.store, self.path, self.rank, self.world = store, path, rank, world
        self.attempt = gp.attempt
        self._attempt = attempt  # rank 0's: the attempt it began (save.plan_save)
        self.timeout = timeout
        self._gp, self._mine, self._options = gp, mine, options
        self._tplans, self._expected = tplans, expected
        self._tree, self._graph, self._metadata = tree, graph, metadata
        self._reuse = reuse  # rank 0 of an incremental save: what it references
        self.url = store.url(path)

    def _join(self, name: str) -> str:
        return self.store.join(self.path, name)

    def _failed(self, text: str) -> DistributedSaveError:
        return DistributedSaveError(f"distributed save of {self.url} failed; nothing was "
                                    f"committed:\n{text}")

    # -- every worker ---------------------------------------------------------------------
    def run(self) -> None:
        """Steps 4-7 (module doc)."""
        result, own = write_part(self.store, self.path, self._mine, self.attempt,  # step 4
                                 self.rank, self._options)
        try:                                                                # step 5
            self.store.write_atomic(self._join(part_name(self.attempt, self.rank)),
                                    _encode(result))
        except BaseException as e:  # rank 0 does not need its own part (the others'
            if self.rank != 0 and own is None:  # wait then ends on the time limit)
                raise self._failed(f"rank {self.rank}: publishing its part failed: "
                                   f"{type(e).__name__}: {e}") from e
        if self.rank == 0:
            self._coordinate(result, own)                                   # step 6
        elif own is not None:
            raise self._failed(f"rank {self.rank}: {result.error}") from own
        else:
            self._await_outcome()                                           # step 7

    # -- rank 0 ---------------------------------------------------------------------------
    def _coordinate(self, own_result: WriteResult, own: BaseException | None) -> None:
        assert self._attempt is not None  # rank 0's
        try:
            if own is not None:
                raise self._failed(f"rank 0: {own_result.error}") from own
            results = self._collect(own_result)
            manifest = _assemble(self._tplans, self._gp, results, self._options.chunk_size,
                                 self._tree, self._graph, self._metadata, self.attempt,
                                 self.world, self._reuse).build()
            try:  # an index that landed though its answer was lost counts as committed
                self._attempt.finish(manifest)
            except BaseException as e:
                raise self._failed(f"rank 0 (commit): {type(e).__name__}: {e}") from e
        except BaseException as e:
            try:  # tells the other workers at once; discard() removes it later
                self.store.write_atomic(self._join(failed_name(self.attempt)),
                                        json.dumps({"error": str(e)[-20000:]}).encode())
            except BaseException:  # noqa: BLE001 - they time out instead
                pass
            raise
        finally:
            self._attempt.end()
        try:  # nobody needs the parts any more
            self.store.remove(self.path, (self._join(part_name(self.attempt, r))
                                          for r in range(self.world)))
        except OSError:
            pass

    def _collect(self, own: WriteResult) -> list[WriteResult]:
        """Step 6's wait: every worker's part, or DistributedSaveError."""
        results: list[WriteResult | None] = [None] * self.world
        results[0] = own
        deadline = time.monotonic() + self.timeout
        delay = _POLL_FIRST
        while True:
            names = set(self.store.listdir(self.path))
            news = False
            for r in range(1, self.world):
                if results[r] is None and part_name(self.attempt, r) in names:
                    results[r] = self._read_part(r)
                    news = True
            errors = [f"rank {x.rank}: {x.error}" for x in results if x is not None and x.error]
            if errors:  # one failed worker ends the wait: nothing can be committed
                raise self._failed("\n".join(errors))
            missing = [r for r, x in enumerate(results) if x is None]
            if not missing:
                return [x for x in results if x is not None]
            now = time.monotonic()
            if news:
                deadline, delay = now + self.timeout, _POLL_FIRST
            elif now > deadline:
                raise self._failed(f"no part from rank(s) {missing} for {self.timeout:g} s: "
                                   "those workers are dead or stuck") from WorkerTimeoutError(
                    f"rank(s) {missing} did not publish their part")
            time.sleep(delay)
            delay = min(delay * 2, _POLL_MAX)

    def _read_part(self, r: int) -> WriteResult:
        """Worker r's part, checked against what it was asked to write; a part that
        cannot be used counts as that worker's failure."""
        try:
            data = self.store.read_bytes(self._join(part_name(self.attempt, r)))
            assert self._expected is not None
            return _decode(data, r, self.attempt, self._expected[r], self._options.chunk_size)
        except (OSError, ValueError, TypeError, KeyError) as e:
            return WriteResult(r, error=f"its part cannot be used: {type(e).__name__}: {e}")

    # -- other workers --------------------------------------------------------------------
    def _await_outcome(self) -> None:
        """Step 7: returns once the index names this attempt; DistributedSaveError
        when rank 0 reported a failure; WorkerTimeoutError after ``timeout``
        seconds without any change among the parts present."""
        deadline = time.monotonic() + self.timeout
        delay = _POLL_FIRST
        seen: set[str] | None = None  # the parts (and the index) present at the last look
        while True:
            names = set(self.store.listdir(self.path))
            failed = failed_name(self.attempt)
            if failed in names:
                raise self._failed(self._failure_text())
            parts = {n for n in names if n.startswith(f"{PART_PREFIX}{self.attempt}-")
                     or n == INDEX_NAME}
            now = time.monotonic()
            changed = parts != seen
            if changed:
                seen, deadline, delay = parts, now + self.timeout, _POLL_FIRST
            # the index is read when it may have changed: rank 0 commits, then removes
            # the parts; a late look covers a rank 0 that stopped in between
            if INDEX_NAME in names and (changed or now > deadline) and self._committed():
                return
            if now > deadline:
                raise WorkerTimeoutError(
                    f"distributed save of {self.url}: no outcome from rank 0 and no worker "
                    f"progress for {self.timeout:g} s (rank {self.rank} waiting): rank 0 "
                    "or another worker is dead or stuck; nothing is known to be committed")
            time.sleep(delay)
            delay = min(delay * 2, _POLL_MAX)

    def _committed(self) -> bool:
        current = read_previous(self.store, self.path)
        return current is not None and current.info.get("attempt") == self.attempt

    def _failure_text(self) -> str:
        try:
            doc = json.loads(self.store.read_bytes(self._join(failed_name(self.attempt))))
            text = doc.get("error") if isinstance(doc, dict) else None
            return text if isinstance(text, str) else "(rank 0 reported a failure)"
        except (OSError, ValueError):
            return "(rank 0 reported a failure)"


def agree(comm: Communicator, name: str, fits: bool) -> bool:
    """Collective, before an async save: every worker saves the same checkpoint
    ``name`` (else ValueError on all), and in the background only if it ``fits`` on
    every worker."""
    views = comm.all_gather((name, bool(fits)))
    names = sorted({v[0] for v in views})
    if len(names) > 1:
        raise ValueError(f"the workers would save different checkpoints ({', '.join(names)}): "
                         "their save counters or checkpoint_number differ")
    return all(v[1] for v in views)


def discard(store: Store, path: str, attempt: str) -> None:
    """Removes what a failed background save left: the whole directory when no
    checkpoint is committed there, else only the attempt's files. Call it once every
    worker is done with the attempt."""
    if not store.is_link(path) and not store.exists(store.join(path, INDEX_NAME)):
        store.remove_tree(path.rstrip("/").rpartition("/")[0], path)
        return
    store.remove(path, (store.join(path, n) for n in store.listdir(path) if _of_attempt(n, attempt)))


# -- the part file: JSON, arrays as base64 of little-endian bytes ----------------------------
def _b64(a: Any, dtype: str) -> str:
    return base64.b64encode(np.ascontiguousarray(a, dtype=dtype).tobytes()).decode("ascii")


def _unb64(doc: dict, field: str, dtype: str) -> np.ndarray:
    text = doc[field]
    if not isinstance(text, str):
        raise ValueError(f"{field} is not a string")
    raw = base64.b64decode(text.encode("ascii"), validate=True)
    dt = np.dtype(dtype)
    if len(raw) % dt.itemsize:
        raise ValueError(f"{field}: {len(raw)} bytes is no whole number of {dt.name}")
    return np.frombuffer(raw, dtype=dt).astype(dt.newbyteorder("="))


def _encode(r: WriteResult) -> bytes:
    doc: dict[str, Any] = {"rank": r.rank, "error": r.error}
    if r.error is None:
        doc.update(files=[[f.name, int(f.size)] for f in r.files],
                   file=_b64(r.file, "<i8"), offset=_b64(r.offset, "<i8"),
                   nbytes=_b64(r.nbytes, "<i8"), crcs=_b64(r.crcs, "<u4"))
    return json.dumps(doc).encode()


def _decode(data: bytes, rank: int, attempt: str, expected: np.ndarray,
            chunk: int) -> WriteResult:
    """A part file, validated like any input from storage (ValueError when wrong)."""
    doc = json.loads(data.decode("utf-8"))
    if not isinstance(doc, dict) or doc.get("rank") != rank:
        raise ValueError("not this worker's part")
    if doc.get("error") is not None:
        return WriteResult(rank, error=str(doc["error"]))
    files = []
    for entry in doc["files"]:
        name, size = entry
        if not (isinstance(name, str) and naming.is_data_file(name)
                and naming.attempt_of(name) == attempt and name[18:23] == f"{rank:05d}"):
            raise ValueError(f"{name!r} is not a data file of this worker's attempt")
        if type(size) is not int or size < 0:
            raise ValueError(f"bad size of {name}")
        files.append(FileEntry(name, size))
    file, offset, nbytes = (_unb64(doc, f, "<i8") for f in ("file", "offset", "nbytes"))
    crcs = _unb64(doc, "crcs", "<u4")
    n = len(expected)
    if not len(file) == len(offset) == len(nbytes) == n:
        raise ValueError(f"{len(nbytes)} values reported, {n} assigned")
    if not np.array_equal(nbytes, expected):
        raise ValueError("the sizes written differ from the values assigned")
    if len(crcs) != int((-(-nbytes // chunk)).sum()):
        raise ValueError("wrong number of chunk checksums")
    used = nbytes > 0
    if used.any():
        f = file[used]
        if f.min() < 0 or f.max() >= len(files):
            raise ValueError("a value in a file it did not report")
        sizes = np.asarray([e.size for e in files], np.int64)
        if (offset[used] < 0).any() or (offset[used] + nbytes[used] > sizes[f]).any():
            raise ValueError("a value beyond the end of its file")
    return WriteResult(rank, tuple(files), file, offset, nbytes, crcs)
