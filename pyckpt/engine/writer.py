"""Writing checkpoints: shard data first, the index (the commit record) last.

Save sequence for one process (docs/PROTOCOL.md gives the multi-worker one):
 1. validate every value (dtype, key) before any byte is written;
 2. place tensors into a few shard files (balanced, aligned; C++ planner);
 3. write the shard files under names unique to this attempt, computing the
    CRC32C of every chunk on the way, and fsync them (C++ core, GIL released);
 4-5. commit (commit.py, the one home of manifests and commits, a SAVE commit):
    build the index from what was written and write it atomically
    (temp + fsync + rename locally, one PUT on an object store), from which
    moment the checkpoint is committed; then delete the data files of the index
    that was replaced, if any, and the orphans of dead attempts (attempts.py:
    racing writers, killed saves).
Steps 3-5 run inside the attempt (commit.Attempt: its marker). A failure
before step 4 deletes this attempt's files and leaves any previous checkpoint
at the path untouched.
"""

from __future__ import annotations

import json
import math
import time
from typing import Any, Sequence

import numpy as np

from .._native import core as _core
from .._version import __version__
from .._dtypes import dtype_name, little_endian
from ..device.ring import stage_ring
from ..device.staging import has_device_values, issue_copies, stage_values
from ..errors import add_note, WriteEnded
from ..format import Manifest
from ..format.manifest import FileEntry
from ..storage import Store
from ..tree import validate_keys
from . import commit as commits, naming, write_executor
from .options import DEFAULT, IOOptions

__all__ = ["PreparedTensor", "WrittenData", "prepare_tensors", "write_data", "StagedWrite",
           "StagedSave", "stages_natively", "save_tensors"]


class PreparedTensor:
    """A validated tensor ready to write: little-endian array and stored dtype name."""

    __slots__ = ("key", "array", "dtype_name")

    def __init__(self, key: str, array: np.ndarray, dtype_name: str) -> None:
        self.key = key
        self.array = array
        self.dtype_name = dtype_name


def prepare_tensors(items: Sequence[tuple[str, Any]], keys_checked: bool = False
                    ) -> list[PreparedTensor]:
    """Validates keys (unless the caller did) and dtypes; makes data little-endian."""
    if not keys_checked:
        validate_keys([key for key, _ in items])
    out = []
    for key, arr in items:
        if not isinstance(arr, np.ndarray):
            arr = np.asarray(arr)
        try:
            name = dtype_name(arr.dtype)
        except TypeError as e:
            raise TypeError(f"{key!r}: {e}") from None
        out.append(PreparedTensor(key, little_endian(arr), name))
    return out


def check_metadata(metadata: Any) -> dict:
    if metadata is None:
        return {}
    if not isinstance(metadata, dict):
        raise TypeError("metadata must be a dict of JSON-serializable values")
    try:
        json.dumps(metadata, allow_nan=False, ensure_ascii=False).encode("utf-8")
    except (TypeError, ValueError) as e:  # (UnicodeEncodeError: a lone surrogate)
        raise ValueError(f"metadata is not JSON-serializable: {e}") from None
    _check_json_keys(metadata, "metadata")
    return metadata


def _check_json_keys(value: Any, where: str) -> None:
    """ValueError for a dict of ``value`` with two keys JSON writes as one name (``1``
    and ``"1"``: one of the two values would be lost)."""
    if isinstance(value, dict):
        names: dict[str, Any] = {}
        for k, v in value.items():
            name = k if isinstance(k, str) else next(iter(json.loads(json.dumps({k: 0}))))
            if name in names:
                raise ValueError(f"{where}: keys {names[name]!r} and {k!r} are both stored as "
                                 f"{name!r} (JSON names are strings): one value would be lost")
            names[name] = k
            _check_json_keys(v, f"{where}[{k!r}]")
    elif isinstance(value, (list, tuple)):
        for i, v in enumerate(value):
            _check_json_keys(v, f"{where}[{i}]")


def _num_files(total: int, nonzero: int, opts: IOOptions) -> int:
    if nonzero == 0:
        return 0
    threads = opts.threads if opts.threads > 0 else _core.default_threads()
    want = max(min(threads, math.ceil(total / opts.min_file_bytes)),
               math.ceil(total / opts.max_file_bytes), 1)
    return min(want, nonzero)


class WrittenData:
    """What one worker wrote: its files, and per tensor the (file, offset, nbytes)
    of its block and its masked chunk CRCs (concatenated, in tensor order)."""

    __slots__ = ("files", "file", "offset", "nbytes", "crcs")

    def __init__(self, files: list[FileEntry], file: np.ndarray, offset: np.ndarray,
                 nbytes: np.ndarray, crcs: np.ndarray) -> None:
        self.files = files
        self.file = file
        self.offset = offset
        self.nbytes = nbytes
        self.crcs = crcs


def _layout(tensors: list[PreparedTensor], attempt: str, rank: int,
            options: IOOptions) -> tuple[np.ndarray, Any, Any, list, list[str]]:
    """(nbytes, file index, offsets, file sizes, file names) of one worker's shard files."""
    n = len(tensors)
    nbytes = np.fromiter((t.array.nbytes for t in tensors), dtype=np.uint64, count=n)
    total = int(nbytes.sum()) if n else 0
    n_files = _num_files(total, int(np.count_nonzero(nbytes)), options)
    if n_files == 0:
        zeros = np.zeros(n, dtype=np.uint64)
        return nbytes, zeros, zeros, [], []
    file_idx, offsets, sizes = _core.plan_layout(nbytes, n_files, options.alignment)
    names = [naming.data_file_name(attempt, rank, i) for i in range(n_files)]
    return nbytes, file_idx, offsets, sizes, names


def _written(names: list[str], sizes: list, file_idx: Any, offsets: Any, nbytes: np.ndarray,
             crcs: np.ndarray) -> WrittenData:
    files = [FileEntry(name, int(size)) for name, size in zip(names, sizes)]
    return WrittenData(files, np.asarray(file_idx, dtype=np.int64),
                       np.asarray(offsets, dtype=np.int64), nbytes.astype(np.int64), crcs)


def write_data(store: Store, path: str, tensors: list[PreparedTensor], *, attempt: str,
               rank: int = 0, options: IOOptions = DEFAULT) -> WrittenData:
    """Writes the shard files of one worker. Deletes its own files on failure."""
    nbytes, file_idx, offsets, sizes, names = _layout(tensors, attempt, rank, options)
    if not names:
        return _written([], [], file_idx, offsets, nbytes, np.zeros(0, dtype=np.uint32))
    paths = [store.join(path, name) for name in names]
    keys = [t.key for t in tensors]
    arrays = [t.array for t in tensors]
    try:
        crcs = write_executor.write_shards(store, path, paths, sizes, keys, arrays, file_idx,
                                           offsets, options, attempt=attempt)
    except BaseException as e:
        _discard(store, path, paths, e)
        raise
    return _written(names, sizes, file_idx, offsets, nbytes, crcs)


def _discard(store: Store, path: str, paths: list[str], error: BaseException) -> None:
    """Deletes a failed attempt's files; a failure to do so never hides ``error``."""
    try:
        store.remove(path, paths)
    except Exception as cleanup:
        add_note(error, f"pyckpt: deleting this attempt's files also failed: "
                        f"{type(cleanup).__name__}: {cleanup}")


def info(attempt: str, world_size: int = 1) -> dict:
    return {"library": "pyckpt", "version": __version__, "attempt": attempt,
            "created": time.time(), "world_size": world_size}


def _finish(attempt: commits.Attempt, tensors: list[PreparedTensor], data: WrittenData,
            tree: Any, graph: dict | None, metadata: dict, options: IOOptions) -> Manifest:
    """Commits the manifest of written data as ``attempt`` (steps 4-5 of the save: a
    SAVE commit; the attempt's marker ends with it)."""
    return attempt.finish(commits.ManifestParts(
        chunk_size=options.chunk_size, files=data.files, keys=[t.key for t in tensors],
        dtype_names=[t.dtype_name for t in tensors], shapes=[t.array.shape for t in tensors],
        file=data.file, offset=data.offset, nbytes=data.nbytes, crcs=data.crcs,
        tree=tree, metadata=metadata, graph=graph, info=info(attempt.id)))


def _prepare_dir(store: Store, path: str) -> None:
    if store.exists(path) and not store.isdir(path):
        raise FileExistsError(f"{store.url(path)} exists and is not a checkpoint directory")
    store.makedirs(path)


def save_tensors(store: Store, path: str, items: Sequence[tuple[str, Any]], *,
                 tree: Any = None, graph: dict | None = None,
                 metadata: dict | None = None, options: IOOptions = DEFAULT,
                 keys_checked: bool = False) -> Manifest:
    """Single-process save of (key, array) pairs as one committed checkpoint."""
    metadata = check_metadata(metadata)
    tensors = prepare_tensors(items, keys_checked)
    _prepare_dir(store, path)
    with commits.Attempt.begin(commits.Kind.SAVE, store, path) as a:
        data = write_data(store, path, tensors, attempt=a.id, options=options)
        return _finish(a, tensors, data, tree, graph, metadata, options)


def stages_natively(store: Store, path: str, live: Sequence[Any]) -> bool:
    """Whether ``live`` (host arrays and DeviceArrays) can be written into ``path`` by a
    ``StagedWrite`` (copies overlapped with the writes): the C++ core writes the
    files (local ones), and each value is written as staged (native byte order)."""
    return all(a.dtype.byteorder in "=<|" for a in live) and write_executor.can_stage(
        store, path)


class StagedWrite:
    """One worker's shard files of an attempt, written while the live values are
    copied into staging buffers (``_core.StagedWrite``): ``stage()`` returns once
    the live values may change again, ``written()`` waits for the files and says
    what was written (``write_data``'s result). The attempt is the caller's (the
    DCP writer's, begun by its coordinator; ``StagedSave`` begins its own) and so
    is the commit.

    Live values may be DeviceArrays: then the copies are run by their engines
    (``device.staging.stage_values``) and each staging buffer is handed to the
    writers as soon as its copy landed (the StagedWrite's external mode). A
    staging buffer that is its live array (a host array of a blocking save) is
    written from directly, never copied."""

    def __init__(self, store: Store, path: str, keys: list[str], live: list[Any],
                 staging: list[np.ndarray], *, attempt: str | None, rank: int = 0,
                 options: IOOptions = DEFAULT,
                 ring: dict[int, np.ndarray] | None = None) -> None:
        if not write_executor.can_stage(store, path):
            raise ValueError("staged saves write local files")
        self.store, self.path, self.options, self.rank = store, path, options, rank
        self.live, self.staging = list(live), list(staging)
        self.external = has_device_values(self.live) or any(
            a is b for a, b in zip(self.live, self.staging))
        # values staged through a ring of pinned memory (device/ring.py): item -> ring
        self.ring = dict(ring or {})
        # the device copies fly while the files are planned (stage() lands them)
        self.issued = issue_copies(self.live, self.staging, skip=self.ring) \
            if self.external else None
        try:
            self.tensors = prepare_tensors(list(zip(keys, self.staging)), keys_checked=True)
            self.attempt = self._begin(attempt)
            try:
                self._start(keys)
            except BaseException:
                self._end()
                raise
        except BaseException:
            if self.issued is not None:
                self.issued.abandon()
            raise

    def _begin(self, attempt: str | None) -> str:
        """The attempt the files belong to (here the caller's, begun by it)."""
        assert attempt is not None
        self.store.makedirs(self.path)
        return attempt

    def _end(self) -> None:
        """Ends what ``_begin`` began (here nothing: the attempt is the caller's)."""

    def _start(self, keys: list[str]) -> None:
        store, options = self.store, self.options
        self.nbytes, self.file_idx, self.offsets, self.sizes, self.names = _layout(
            self.tensors, self.attempt, self.rank, options)
        self.paths = [store.join(self.path, name) for name in self.names]
        self.job = None
        if self.names:
            self.job = write_executor.start_staged(
                store, self.paths, self.sizes, keys, [t.array for t in self.tensors],
                None if self.external else self.live, self.file_idx, self.offsets, options,
                ring=bool(self.ring))

    def stage(self) -> None:
        """Copies the live values aside; returns once they may change. On failure
        the write is abandoned, its files removed, and the error raised."""
        try:
            if self.ring:
                self._stage_ring()
            elif self.issued is not None:
                self.issued.land(order=None if self.job is None else self.job.order(),
                                 mark=None if self.job is None else self.job.mark_ready,
                                 threads=self.options.threads)
            elif self.job is None:  # nothing to write: still a consistent copy
                stage_values(self.live, self.staging, threads=self.options.threads)
            else:
                self.job.stage(self.options.threads)
        except BaseException as e:
            writer_error: BaseException | None = None
            try:
                if self.job is not None:
                    try:
                        self.job.wait()  # abandoned: the writer stops
                    except BaseException as we:  # noqa: BLE001 - the staging error is raised...
                        writer_error = we
                    _discard(self.store, self.path, self.paths, e)
            finally:
                self._end()
            if isinstance(e, WriteEnded) and writer_error is not None:
                raise writer_error from None  # ...unless the writers' error stopped it
            raise

    def _stage_ring(self) -> None:
        """Stages the small values as usual, then the ring's values in the writers'
        order, each slot reused once the writers wrote its value (device/ring.py)."""
        assert self.job is not None and self.issued is not None
        job = self.job
        order = job.order()
        self.issued.land(order=[i for i in order if i not in self.ring], mark=job.mark_ready,
                         threads=self.options.threads)
        rings = {self.live[i].engine: buf for i, buf in self.ring.items()}

        def written(i: int) -> None:
            try:
                job.wait_written(i)
            except Exception as e:
                raise WriteEnded(str(e)) from e

        stage_ring(self.live, [i for i in order if i in self.ring], rings,
                   mark=job.mark_ready, written=written)

    def written(self) -> WrittenData:
        """Waits for the files (after ``stage()``); what was written. On failure the
        files are removed and the error raised."""
        if self.job is None:
            crcs = np.zeros(0, dtype=np.uint32)
        else:
            try:
                crcs, _ = self.job.wait()
            except BaseException as e:
                _discard(self.store, self.path, self.paths, e)
                raise
        return _written(self.names, self.sizes, self.file_idx, self.offsets, self.nbytes, crcs)


class StagedSave(StagedWrite):
    """A local save that copies live tensors into staging buffers while writing
    them (``StagedWrite``) under an attempt of its own: ``stage()`` returns once
    the live tensors may change again, ``finish()`` waits for the data and commits."""

    def __init__(self, store: Store, path: str, keys: list[str], live: list[Any],
                 staging: list[np.ndarray], *, graph: dict | None, metadata: dict | None,
                 tree: Any = None, options: IOOptions = DEFAULT,
                 ring: dict[int, np.ndarray] | None = None) -> None:
        self.graph, self.tree = graph, tree
        self.metadata = check_metadata(metadata)
        super().__init__(store, path, keys, live, staging, attempt=None, options=options,
                         ring=ring)

    def _begin(self, attempt: str | None) -> str:
        """A new attempt, its marker made before any data (ended by ``_end``)."""
        _prepare_dir(self.store, self.path)
        self._attempt = commits.Attempt.begin(commits.Kind.SAVE, self.store, self.path)
        return self._attempt.id

    def _end(self) -> None:
        self._attempt.end()

    def finish(self) -> Manifest:
        with self._attempt:
            data = self.written()
            return _finish(self._attempt, self.tensors, data, self.tree, self.graph,
                           self.metadata, self.options)
