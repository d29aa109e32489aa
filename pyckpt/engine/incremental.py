"""Incremental saves: write the tensors that changed since a base checkpoint and
reference the base's data for the rest (docs/FORMAT.md section 12, docs/PROTOCOL.md
section 9). An incremental ``CheckpointManager`` (``options=CheckpointManagerOptions(
incremental=IncrementalOptions())``) names its newest kept checkpoint as the base of
each save, and ``saving`` reads it (``base_at``).

A tensor is reused only when the base stores it as one whole block of the same key,
dtype and shape whose chunk fingerprints (fingerprints.py: 128 bits of SHA-256 per
chunk) all equal the new value's: a changed byte is never taken for unchanged. The
new index then names the base's file (``"at"``: the directory holding it; a file the
base itself references keeps its own directory, so references never chain) with the
block's offset and CRCs, and restores read each byte where it lies, in one pass.

Two ways to save, chosen per save (``plan_mode``):

- *selective*: fingerprint every tensor first, then write only the changed ones;
- *full*: write every tensor, fingerprinting on the side while the writers run
  (no reference; the next save's base): the first save, one save in every
  ``full_every`` (the ``full_every``-th after the last full one: saves 1, 11, 21...
  with 10; bounds how far back references reach), and whenever the base's own save
  found more than ``FULL_ABOVE`` of its bytes changed (there, hashing before writing
  would only add time to a save that writes nearly everything anyway).
"""

from __future__ import annotations

import dataclasses
import threading
import warnings
from typing import Any, Iterable, Sequence

import numpy as np

from ..errors import CorruptCheckpointError
from ..format import Manifest
from ..format.manifest import FileEntry
from ..storage import Store
from . import commit
from .fingerprints import HashJob, block_hashes
from .options import DEFAULT, IOOptions
from .reader import OpenCheckpoint, data_file_path
from .writer import PreparedTensor, WrittenData, _prepare_dir, check_metadata, info, \
    prepare_tensors, write_data

__all__ = ["Base", "FULL_ABOVE", "Matcher", "assemble", "base_at", "damaged", "plan_mode",
           "record", "reference", "save_incremental", "stats", "usable_files"]

#: a base whose save found more than this fraction of its bytes changed makes the
#: next save a full one (module doc)
FULL_ABOVE = 0.75


@dataclasses.dataclass(frozen=True)
class Base:
    """The checkpoint an incremental save compares with: ``name``, a committed sibling
    directory of the checkpoint being written (same run directory), its ``path`` and
    ``manifest``. ``full_every``: every how many saves one is full (None: only when
    the base has no fingerprints or changed mostly)."""

    name: str
    path: str
    manifest: Manifest
    full_every: int | None = 10


def base_at(store: Store, path: str, full_every: int | None = 10) -> Base | None:
    """The ``Base`` of the checkpoint at ``path`` (its manifest read now), for an
    incremental save of a sibling directory; None where no pyckpt checkpoint is
    committed there (the save is then a full one)."""
    manifest = commit.read_previous(store, path)
    if manifest is None:
        return None
    return Base(path.rstrip("/").rpartition("/")[2], path, manifest, full_every)


def stats(manifest: Manifest) -> dict:
    """``info.incremental`` of a checkpoint (empty for one saved otherwise)."""
    got = manifest.info.get("incremental")
    return got if isinstance(got, dict) else {}


def plan_mode(base: Base | None) -> str:
    """"selective" or "full" (module doc). A full save and the selective ones after it
    form a chain; the base is save ``since_full + 1`` of its chain (``record``), and the
    next save starts a new chain once this one holds ``full_every`` saves: one save in
    every ``full_every`` is full (saves 1, 11, 21... with 10)."""
    if base is None or base.manifest.blocks.hashes is None:
        return "full"
    st = stats(base.manifest)
    since = st.get("since_full")
    if not isinstance(since, int) or (base.full_every is not None
                                      and since + 1 >= base.full_every):
        return "full"
    changed, total = st.get("changed_bytes"), st.get("total_bytes")
    if isinstance(changed, int) and isinstance(total, int) and total > 0 \
            and changed > FULL_ABOVE * total:
        return "full"
    return "selective"


#: object stores: (file url, size, mtime) -> (offset, nbytes) of its blocks verified by
#: this process. An object's bytes change only by replacing it (a new mtime), and the
#: store guards what it holds; local files can change in place, so they are not cached.
_VERIFIED: dict[tuple[str, int, float | None], set[tuple[int, int]]] = {}
_VERIFIED_LOCK = threading.Lock()


def damaged(store: Store, base: Base, blocks: Iterable[int],
            options: IOOptions = DEFAULT) -> set[int]:
    """The base blocks among ``blocks`` (those a save is about to reference) whose
    bytes do not match their CRCs now, each reported with a warning naming the key,
    the file and the byte range: they are written anew (docs/PROTOCOL.md section 9).
    A reference is never made to data no one has checked: the state in memory is the
    good copy at save time. Costs one verified read of the referenced bytes (local
    disks: every save, mostly from the page cache; object stores: once per object
    version and process)."""
    b = base.manifest.blocks
    todo = sorted(j for j in set(int(j) for j in blocks) if int(b.nbytes[j]) > 0)
    if not todo:
        return set()
    ck = OpenCheckpoint(store, base.path, base.manifest, options)
    versions: dict[int, tuple[str, int, float | None]] = {}
    if not store.local:
        for f in sorted({int(b.file[j]) for j in todo}):
            p = ck.file_path(f)
            versions[f] = (store.url(p), base.manifest.files[f].size, store.mtime(p))
        with _VERIFIED_LOCK:
            todo = [j for j in todo if (int(b.offset[j]), int(b.nbytes[j]))
                    not in _VERIFIED.get(versions[int(b.file[j])], ())]
    bad = _bisect(ck, todo)
    with _VERIFIED_LOCK:
        if len(_VERIFIED) > 4096:  # a long run's old versions: forget them all
            _VERIFIED.clear()
        for j in todo:
            v = versions.get(int(b.file[j]))
            if v is not None and j not in bad and v[2] is not None:
                _VERIFIED.setdefault(v, set()).add((int(b.offset[j]), int(b.nbytes[j])))
    return bad


def _bisect(ck: OpenCheckpoint, blocks: list[int]) -> set[int]:
    """The damaged blocks among ``blocks``: one verified read of them all, halved
    around a failure (k damaged blocks of n cost O(k log n) reads)."""
    try:
        _verify(ck, blocks)
        return set()
    except (CorruptCheckpointError, OSError) as e:
        if len(blocks) > 1:
            return _bisect(ck, blocks[:len(blocks) // 2]) | _bisect(ck, blocks[len(blocks) // 2:])
        warnings.warn(f"incremental save: the base checkpoint {ck.url} is damaged ({e}); that "
                      "tensor is written anew instead of referenced", stacklevel=2)
        return set(blocks)


def _verify(ck: OpenCheckpoint, blocks: list[int]) -> None:
    b = ck.manifest.blocks
    js = np.asarray(blocks, dtype=np.int64)
    tensor = np.searchsorted(b.tensor_begin, js, side="right") - 1
    keys = [ck.manifest.keys[int(i)] for i in tensor]
    plan = ck.plan_ranges(keys, js, np.zeros(len(js), np.int64), b.nbytes[js])
    ck.read_blocks(plan, [None] * len(js))


def usable_files(store: Store, base: Base) -> list[bool]:
    """Per file of the base: whether it is there with its size (a reference to a file
    that is not would commit a checkpoint that cannot be read). Tensors in the others
    are written anew, with a warning."""
    out = []
    for f in base.manifest.files:
        p = data_file_path(store, base.path, f)
        try:
            ok = store.size(p) == f.size
        except (FileNotFoundError, OSError):
            ok = False
        if not ok:
            warnings.warn(f"incremental save: {store.url(p)} of the base checkpoint "
                          f"{store.url(base.path)} is missing or has the wrong size; the "
                          "tensors stored there are written again", stacklevel=4)
        out.append(ok)
    return out


class Matcher:
    """Finds the base block a new block may reference: same key, dtype, global shape
    and box (None: a tensor stored whole), every chunk fingerprint equal, stored in a
    file that is there (``usable``, per base file; None: not checked). Nothing matches
    when the base was checksummed in other chunks than ``chunk_size`` (its CRCs could
    not be copied into the new index)."""

    def __init__(self, base: Base, usable: list[bool] | None, chunk_size: int) -> None:
        self.base, self.usable = base, usable
        self.same_chunks = base.manifest.chunk_size == chunk_size
        self._boxes: dict[int, dict[Any, int]] = {}

    def _blocks_of(self, i: int) -> dict[Any, int]:
        got = self._boxes.get(i)
        if got is None:
            b = self.base.manifest.blocks
            got = {}
            for j in range(int(b.tensor_begin[i]), int(b.tensor_begin[i + 1])):
                box = None if b.box is None or b.box[j] is None else \
                    (tuple(b.box[j][0]), tuple(b.box[j][1]))
                got[box] = j
            self._boxes[i] = got
        return got

    def block(self, key: str, dtype_name: str, shape: Sequence[int], box: Any, h: str) -> int:
        """The base block index, or -1 (write it)."""
        m = self.base.manifest
        b = m.blocks
        i = m.index.get(key)
        if i is None or not h or b.hashes is None or not self.same_chunks \
                or m.dtype_names[i] != dtype_name \
                or tuple(m.shapes[i]) != tuple(shape):
            return -1
        j = self._blocks_of(i).get(box, -1)
        if j < 0 or b.hashes[j] != h or (self.usable is not None
                                          and not self.usable[int(b.file[j])]):
            return -1
        return j


def _matches(tensors: Sequence[PreparedTensor], hashes: Sequence[str], base: Base,
             usable: list[bool] | None, chunk_size: int) -> list[int]:
    """Per tensor (stored whole): the base block it can reference (-1: write it)."""
    match = Matcher(base, usable, chunk_size)
    return [match.block(t.key, t.dtype_name, t.array.shape, None, h)
            for t, h in zip(tensors, hashes)]


def record(base: Base | None, mode: str, changed: int | None, total: int) -> dict:
    """``info.incremental`` of a new checkpoint (docs/FORMAT.md section 12)."""
    since = 0 if mode == "full" or base is None else int(stats(base.manifest)["since_full"]) + 1
    return {"base": None if base is None or mode == "full" else base.name, "since_full": since,
            "changed_bytes": changed, "total_bytes": int(total)}


def reference(base: Base, j: int, files: list[FileEntry],
              where: dict[tuple[str, str], int]) -> tuple[int, int, int, np.ndarray]:
    """(file index, offset, nbytes, chunk CRCs) of a new index's block that references
    base block ``j``; appends the referenced file to ``files`` on first use (``where``:
    (directory, name) -> index). A file the base itself references keeps its directory:
    references never chain."""
    b = base.manifest.blocks
    src = base.manifest.files[int(b.file[j])]
    ref = (src.at or base.name, src.name)
    if ref not in where:
        where[ref] = len(files)
        files.append(FileEntry(src.name, src.size, ref[0]))
    return (where[ref], int(b.offset[j]), int(b.nbytes[j]),
            b.crcs[b.crc_begin[j]:b.crc_begin[j + 1]])


def _changed_bytes(tensors: Sequence[PreparedTensor], reuse: Sequence[int]) -> int:
    return sum(t.array.nbytes for t, j in zip(tensors, reuse) if j < 0)


def assemble(reuse: Sequence[int], data: WrittenData, base: Base | None,
             chunk_size: int) -> tuple[list[FileEntry], dict]:
    """Files and block columns of a new index of whole tensors (``reuse``: per tensor,
    the base block it references, or -1): written tensors from ``data`` (in the order
    of the tensors with ``reuse < 0``), reused ones from the base's blocks."""
    files = list(data.files)
    where: dict[tuple[str, str], int] = {}
    cols: dict[str, list] = {"file": [], "offset": [], "nbytes": [], "crcs": []}
    k = crc_at = 0
    for j in reuse:
        if j < 0:
            n = int(data.nbytes[k])
            nchunks = -(-n // chunk_size)
            cols["file"].append(int(data.file[k]))
            cols["offset"].append(int(data.offset[k]))
            cols["nbytes"].append(n)
            cols["crcs"].append(data.crcs[crc_at:crc_at + nchunks])
            crc_at += nchunks
            k += 1
            continue
        assert base is not None
        f, off, n, crc = reference(base, j, files, where)
        cols["file"].append(f)
        cols["offset"].append(off)
        cols["nbytes"].append(n)
        cols["crcs"].append(crc)
    crcs = np.concatenate(cols.pop("crcs")) if len(reuse) else np.zeros(0, np.uint32)
    return files, {**{c: np.asarray(v, dtype=np.int64) for c, v in cols.items()}, "crcs": crcs}


def save_incremental(store: Store, path: str, items: Sequence[tuple[str, Any]], base: Base | None,
                     *, tree: Any = None, graph: dict | None = None,
                     metadata: dict | None = None, options: IOOptions = DEFAULT,
                     keys_checked: bool = False) -> Manifest:
    """Saves ``items`` at ``path`` (a sibling of ``base.path``) as one committed
    checkpoint with fingerprints, referencing the base's unchanged tensors when the
    mode is selective (module doc)."""
    metadata = check_metadata(metadata)
    tensors = prepare_tensors(items, keys_checked)
    mode = plan_mode(base)
    _prepare_dir(store, path)
    with commit.Attempt.begin(commit.Kind.SAVE, store, path) as a:
        attempt = a.id
        arrays = [t.array for t in tensors]
        if mode == "selective":
            assert base is not None
            hashes = block_hashes(arrays, options.chunk_size, options.threads)
            reuse = _matches(tensors, hashes, base, usable_files(store, base),
                             options.chunk_size)
            bad = damaged(store, base, (j for j in reuse if j >= 0), options)
            reuse = [-1 if j in bad else j for j in reuse]
            changed: int | None = _changed_bytes(tensors, reuse)
            data = write_data(store, path, [t for t, j in zip(tensors, reuse) if j < 0],
                              attempt=attempt, options=options)
        else:
            job = HashJob(arrays, options.chunk_size, options.threads)
            try:
                data = write_data(store, path, tensors, attempt=attempt, options=options)
            finally:
                hashes = job.result()  # (the hashing threads stop reading the arrays first)
            reuse = [-1] * len(tensors)
            changed = None  # nothing to compare with
            if base is not None and base.manifest.blocks.hashes is not None:
                changed = _changed_bytes(tensors, _matches(tensors, hashes, base, None,
                                                           options.chunk_size))
        files, cols = assemble(reuse, data, base, options.chunk_size)
        inc = record(base, mode, changed, sum(a.nbytes for a in arrays))
        return a.finish(commit.ManifestParts(
            chunk_size=options.chunk_size, files=files, keys=[t.key for t in tensors],
            dtype_names=[t.dtype_name for t in tensors], shapes=[t.array.shape for t in tensors],
            file=cols["file"], offset=cols["offset"], nbytes=cols["nbytes"], crcs=cols["crcs"],
            tree=tree, metadata=metadata, graph=graph,
            info={**info(attempt), "incremental": inc}, hashes=hashes))
