"""The one commit routine: every way of committing a checkpoint ends here (single
process and multi-worker saves, blocking or in the background, node-local commit
records, copies and tier persists).

``commit_checkpoint`` runs the commit's steps in one order (docs/PROTOCOL.md):

1. read the manifest being replaced, if any, and refuse to replace data that other
   checkpoints reference (incremental saves: ``references.check_not_referenced``);
2. write the index atomically: from this moment the checkpoint is committed;
3. if that write raised, check whether the index landed anyway (an answer lost
   after the rename or the PUT): then it counts as committed; else, delete this
   attempt's new files (``abandon``, only when the index is certainly not this
   attempt's) and raise;
4. delete the data files of the replaced manifest that the new one does not name;
5. remove the orphans of dead attempts (``attempts.sweep``);
6. end the attempt (its marker), whatever happened.

Steps 4 and 5 are best effort: they warn, never raise, as nothing committed can
be lost by skipping them (a later commit's sweep removes what is left). The
request is a ``Commit`` record, so what a commit must also record (references to
earlier checkpoints' data, for incremental saves) joins it in one place.
"""

from __future__ import annotations

import dataclasses
import warnings

from ..format import INDEX_NAME, Manifest, decode_index, encode_index
from ..format.manifest import FileEntry
from ..storage import Store
from . import attempts
from .references import check_not_referenced

__all__ = ["Commit", "commit_checkpoint", "read_previous", "abandon", "discard", "sweep_orphans"]


@dataclasses.dataclass(frozen=True)
class Commit:
    """What to commit at ``store``/``path``, and which of the commit's steps apply.

    - ``manifest``: the index to write;
    - ``attempt``: the save attempt whose index it is (its id is in
      ``manifest.info``); with it, an index write that raised but landed counts as
      committed, and ``end_attempt`` ends that attempt's marker afterwards;
    - ``new_files``: this attempt's data files, deleted when the commit fails
      (None: the caller cleans up, e.g. every worker its own part);
    - ``delete_replaced``: delete the replaced manifest's files (False where the
      replaced files are not this writer's to delete);
    - ``sweep``: remove orphans of dead attempts after the commit;
    - ``end_attempt``: end ``attempt``'s marker at the end, committed or not."""

    store: Store
    path: str
    manifest: Manifest
    attempt: str | None = None
    new_files: list[FileEntry] | None = None
    delete_replaced: bool = True
    sweep: bool = True
    end_attempt: bool = False


def read_previous(store: Store, path: str) -> Manifest | None:
    """The manifest currently committed at path, if any and readable."""
    index = store.join(path, INDEX_NAME)
    try:
        return decode_index(store.read_bytes(index), store.url(index))
    except (FileNotFoundError, ValueError, OSError):
        return None


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


def _delete_replaced(c: Commit, previous: Manifest | None) -> None:
    if previous is None:
        return
    keep = {f.name for f in c.manifest.files if f.at is None}
    try:  # its own files only: references name other checkpoints' files
        c.store.remove(c.path, (c.store.join(c.path, f.name) for f in previous.files
                                 if f.at is None and f.name not in keep))
    except OSError as e:
        warnings.warn(f"could not delete old data files under {c.store.url(c.path)}: {e}")


def sweep_orphans(store: Store, path: str) -> None:
    """Best-effort ``attempts.sweep`` (step 5), for commits whose sweep waits for
    more than the index (node-local commit records: once every worker committed)."""
    try:
        attempts.sweep(store, path)
    except OSError as e:
        warnings.warn(f"could not remove orphaned data files under {store.url(path)}: {e}")


def commit_checkpoint(c: Commit) -> Manifest | None:
    """Commits ``c.manifest`` (the module doc's steps); returns the manifest it
    replaced, if any. Raises the index write's error when the index did not land
    (after deleting ``c.new_files``)."""
    try:
        previous = read_previous(c.store, c.path)
        try:
            check_not_referenced(c.store, c.path, previous, c.attempt)
        except ValueError:
            if c.new_files is not None:
                discard(c.store, c.path, c.new_files)
            raise
        try:
            c.store.write_atomic(c.store.join(c.path, INDEX_NAME), encode_index(c.manifest))
        except BaseException:
            if not _landed(c.store, c.path, c.attempt):
                if c.new_files is not None:
                    abandon(c.store, c.path, c.new_files, c.attempt)
                raise
            previous = None  # committed though its answer was lost: what it replaced is unknown
        if c.delete_replaced:
            _delete_replaced(c, previous)
        if c.sweep:
            sweep_orphans(c.store, c.path)
        return previous
    finally:
        if c.end_attempt and c.attempt is not None:
            attempts.end(c.store, c.path, c.attempt)
