"""The one home of manifests and commits: every checkpoint's index is built here from
what was written (``ManifestParts``, ``copied_index``) and committed here (``finish``),
for every way of saving: single process and multi-worker saves, blocking or in the
background, node-local commit records, copies and tier persists.

``finish(kind, store, path, index)`` runs these steps, in this order (docs/PROTOCOL.md):

1. read the manifest being replaced, if any, and refuse to replace data that other
   checkpoints reference (incremental saves: ``references.check_not_referenced``);
2. write the index atomically: from this moment the checkpoint is committed;
3. if that write raised, check whether the index landed anyway (an answer lost
   after the rename or the PUT): then it counts as committed; else, delete this
   attempt's new files (``abandon``, only when the index is certainly not this
   attempt's) and raise;
4. delete the data files of the replaced manifest that the new one does not name;
5. remove the orphans of dead attempts (``attempts.sweep``).

Which of the steps run follows from the commit's ``Kind``, what the caller's plan
is, never from flags (steps 1 and 2 always run):

========== ========================================== ===== ======= ====== =====
kind       the plan                                   own   abandon delete sweep
========== ========================================== ===== ======= ====== =====
SAVE       a save by this process                     yes   yes     yes    yes
WORKERS    a multi-worker save, committed by rank 0   yes   no      yes    yes
COPY       a copy under a new attempt (cp, persist)   yes   yes     yes    no
PERSIST    files copied under their names by workers  no    no      no     yes
RECORD     a node's commit record (node-local tier)   no    no      no     no
========== ========================================== ===== ======= ====== =====

- *own*: the index is this commit's attempt's (``manifest.info["attempt"]``): an
  index write that raised but landed counts as committed (step 3), and the attempt's
  own files without an index do not count as referenced data (step 1). A persisted
  or node-local index is another attempt's (the save's): neither applies.
- *abandon*: a failed commit deletes the index's own data files (those without
  ``at``: the files this attempt wrote). WORKERS: each worker's files are removed
  by the coordinator's failure path or the next commit's sweep.
- *delete*: the files of the replaced index that the new one does not name go.
  PERSIST and RECORD: the files keep their names from the source, and a node's
  files are not its record's to delete (step 9 of node_local.py removes them).
- *sweep*: COPY leaves other attempts' files to the next save's sweep; a node-local
  save sweeps each node once every worker committed (``sweep_orphans``,
  node_local.py step 9), not at its record.

Steps 4 and 5 are best effort: they warn, never raise, as nothing committed can be
lost by skipping them (a later commit's sweep removes what is left).

Around the commit runs the save's attempt (``Attempt``, the one home of the steps
every route takes: a new attempt id, its marker before the first data byte,
``attempts.begin``, and its end, ``attempts.end``, once it committed or gave up):

    with commit.Attempt.begin(Kind.SAVE, store, path) as a:
        data = write_data(..., attempt=a.id)
        a.finish(parts)                      # the commit; then the marker ends

The kinds of an attempt are those that commit their own index (*own*: SAVE,
WORKERS, COPY); a PERSIST or RECORD commit commits another attempt's index and has
no marker of its own (``finish`` directly). Who holds the attempt follows from the
kind's plan: SAVE and COPY, the process that writes; WORKERS, the coordinator (rank
0, or DCP's coordinator), whose workers write under its ``id`` and leave the marker
to it (docs/PROTOCOL.md sections 6, 6b, 7b, 8). The marker ends when the attempt is
finished (committed or not), when its ``with`` block is left, or at ``end()`` (a
coordinator whose attempt gives way: a refused plan, a node-local save's records).
"""

from __future__ import annotations

import dataclasses
import enum
import warnings
from typing import Sequence

import numpy as np

from ..format import INDEX_NAME, Manifest, decode_index, encode_index
from ..format.manifest import FileEntry, build_manifest
from ..format.records import BlockTable
from ..run_directory import committed_manifest as read_previous  # the commit's name for it
from ..errors import CheckpointError
from ..storage import Store
from . import attempts, naming
from .references import check_not_referenced

__all__ = ["Kind", "ManifestParts", "copied_index", "finish", "Attempt", "read_previous",
           "abandon", "discard", "sweep_orphans"]


class Kind(enum.Enum):
    """What a commit's plan is; its steps: the module doc's table."""
    SAVE = "save"
    WORKERS = "workers"
    COPY = "copy"
    PERSIST = "persist"
    RECORD = "record"


@dataclasses.dataclass(frozen=True)
class _Steps:
    own: bool
    abandon: bool
    delete: bool
    sweep: bool


#: the module doc's table (tests/engine/test_one_commit_home.py holds them equal)
STEPS = {
    Kind.SAVE: _Steps(own=True, abandon=True, delete=True, sweep=True),
    Kind.WORKERS: _Steps(own=True, abandon=False, delete=True, sweep=True),
    Kind.COPY: _Steps(own=True, abandon=True, delete=True, sweep=False),
    Kind.PERSIST: _Steps(own=False, abandon=False, delete=False, sweep=True),
    Kind.RECORD: _Steps(own=False, abandon=False, delete=False, sweep=False),
}


@dataclasses.dataclass(frozen=True)
class ManifestParts:
    """What a writer produced, as the columns of a new index (``build_manifest``'s):
    its files, per tensor key, dtype name and shape, per block file, offset, byte
    count and chunk CRCs (``nblocks`` per tensor, ``box`` per block for sharded
    tensors, ``hashes`` per block for fingerprints), and the checkpoint's content
    (``tree``, ``metadata``, ``graph``, ``info``: its ``"attempt"`` is the writer's)."""

    chunk_size: int
    files: list[FileEntry]
    keys: Sequence[str]
    dtype_names: Sequence[str]
    shapes: Sequence[tuple[int, ...]]
    file: np.ndarray
    offset: np.ndarray
    nbytes: np.ndarray
    crcs: np.ndarray
    nblocks: np.ndarray | None = None
    box: list | None = None
    tree: dict | None = None
    metadata: dict | None = None
    graph: dict | None = None
    info: dict | None = None
    hashes: list[str] | None = None

    def build(self) -> Manifest:
        """The manifest. ``finish`` builds it; a caller builds it first where the index
        is used before its commit (a node-local save: rank 0 builds it, every node
        commits it as its RECORD)."""
        return build_manifest(**{f.name: getattr(self, f.name)
                                 for f in dataclasses.fields(self)})


def copied_index(source: Manifest, files: list[FileEntry], blocks: BlockTable,
                 info: dict) -> Manifest:
    """The index of a copy of ``source``: its tensors and content, with the copy's
    data ``files``, block table (offsets in those files) and ``info``."""
    return Manifest(chunk_size=source.chunk_size, files=files, keys=source.keys,
                    dtype_names=source.dtype_names, shapes=source.shapes, blocks=blocks,
                    tree=source.tree, metadata=source.metadata, graph=source.graph, info=info)


def _landed(store: Store, path: str, attempt: str | None) -> bool:
    """Whether the index of ``attempt`` is committed at path after its write raised.
    An index that cannot be read back counts as not landed."""
    if attempt is None:
        return False
    current = read_previous(store, path)
    return current is not None and current.info.get("attempt") == attempt


def discard(store: Store, path: str, files: list[FileEntry]) -> None:
    """Deletes the data files of an attempt that failed before its commit began
    (nothing of it can be committed), best effort: files whose failed upload already
    cleaned up after itself cost no request (``Store.delete``)."""
    try:
        store.remove(path, (store.join(path, f.name) for f in files))
    except OSError:
        pass


def abandon(store: Store, path: str, files: list[FileEntry], attempt: str | None) -> None:
    """Deletes an attempt's data files after a failed commit, unless its index
    became visible anyway (a failure after the rename, or an upload whose answer
    was lost): then the files stay. When the index cannot be read back at all,
    the files stay too (they may be committed); the next commit's orphan sweep
    removes them if they are not."""
    index = store.join(path, INDEX_NAME)
    try:
        current = decode_index(store.read_bytes(index), store.url(index))
    except FileNotFoundError:
        current = None
    except (ValueError, OSError):
        return  # unknown whether this attempt is committed: never delete its data
    if current is not None and attempt is not None and current.info.get("attempt") == attempt:
        return
    discard(store, path, files)


def _delete_replaced(store: Store, path: str, manifest: Manifest,
                     previous: Manifest | None) -> None:
    if previous is None:
        return
    keep = {f.name for f in manifest.files if f.at is None}
    try:  # its own files only: references name other checkpoints' files
        store.remove(path, (store.join(path, f.name) for f in previous.files
                            if f.at is None and f.name not in keep))
    except OSError as e:
        warnings.warn(f"could not delete old data files under {store.url(path)}: {e}")


def sweep_orphans(store: Store, path: str) -> None:
    """Best-effort ``attempts.sweep`` (step 5), for commits whose sweep waits for
    more than the index (node-local commit records: once every worker committed)."""
    try:
        attempts.sweep(store, path)
    except OSError as e:
        warnings.warn(f"could not remove orphaned data files under {store.url(path)}: {e}")


def finish(kind: Kind, store: Store, path: str, index: ManifestParts | Manifest) -> Manifest:
    """Builds ``index`` (when given as parts) and commits it at ``store``/``path`` with
    ``kind``'s steps (module doc); returns the committed manifest. Raises the index
    write's error when the index did not land (after deleting the attempt's files
    where ``kind`` abandons them), and step 1's ValueError."""
    manifest = index.build() if isinstance(index, ManifestParts) else index
    steps = STEPS[kind]
    attempt = None
    if steps.own:
        attempt = manifest.info.get("attempt")
        if not isinstance(attempt, str):
            raise ValueError(f"a {kind.name} commit of {store.url(path)}: its index names "
                             "no attempt (info['attempt'])")
    _commit(steps, store, path, manifest, attempt)
    return manifest


def _commit(steps: _Steps, store: Store, path: str, manifest: Manifest,
            attempt: str | None) -> Manifest | None:
    """Steps 1-5 of the module doc; returns the manifest replaced, if known."""
    new_files = [f for f in manifest.files if f.at is None] if steps.abandon else None
    previous = read_previous(store, path)
    try:
        check_not_referenced(store, path, previous, attempt)
    except ValueError:
        if new_files is not None:
            discard(store, path, new_files)
        raise
    try:
        store.write_atomic(store.join(path, INDEX_NAME), encode_index(manifest))
    except BaseException:
        if not _landed(store, path, attempt):
            if new_files is not None:
                abandon(store, path, new_files, attempt)
            raise
        previous = None  # committed though its answer was lost: what it replaced is unknown
    if steps.delete:
        _delete_replaced(store, path, manifest, previous)
    if steps.sweep:
        sweep_orphans(store, path)
    return previous


class Attempt:
    """One save attempt at ``store``/``path`` under its coordinator (module doc): ``id``
    names its data files; its marker exists from ``begin`` until ``finish``, ``end``
    or the end of its ``with`` block, whichever comes first. Finished once."""

    def __init__(self, kind: Kind, store: Store, path: str, attempt: str) -> None:
        """(Through ``begin``.)"""
        self.kind, self.store, self.path, self.id = kind, store, path, attempt
        self._live = True
        self._finished = False

    @classmethod
    def begin(cls, kind: Kind, store: Store, path: str) -> "Attempt":
        """A new attempt of ``kind`` at ``path`` (made if missing), its marker written
        before any of its data. ValueError for a kind that commits another attempt's
        index (PERSIST, RECORD: no marker of their own)."""
        if not STEPS[kind].own:
            raise ValueError(f"a {kind.name} commit has no attempt of its own")
        attempt = cls(kind, store, path, naming.new_attempt_id())
        attempts.begin(store, path, attempt.id)
        return attempt

    @property
    def live(self) -> bool:
        """Whether its marker is still there (not yet finished or ended)."""
        return self._live

    def finish(self, index: ManifestParts | Manifest) -> Manifest:
        """Commits ``index`` (``finish`` with this attempt's kind), then ends the
        marker, committed or not; returns the committed manifest. The index must name
        this attempt (``info["attempt"]``): ValueError otherwise. CheckpointError when
        the attempt was finished or ended before."""
        if self._finished or not self._live:
            raise CheckpointError(f"attempt {self.id} at {self.store.url(self.path)} is "
                                  f"{'finished' if self._finished else 'ended'}: "
                                  "it commits at most once, before its end")
        self._finished = True
        try:
            manifest = index.build() if isinstance(index, ManifestParts) else index
            if manifest.info.get("attempt") != self.id:
                raise ValueError(f"a commit of attempt {self.id} at {self.store.url(self.path)}"
                                 f": its index names attempt {manifest.info.get('attempt')!r}")
            return finish(self.kind, self.store, self.path, manifest)
        finally:
            self.end()

    def end(self) -> None:
        """Removes the marker (best effort), once; a no-op after that."""
        if self._live:
            self._live = False
            attempts.end(self.store, self.path, self.id)

    def __enter__(self) -> "Attempt":
        return self

    def __exit__(self, *exc: object) -> None:
        self.end()
