"""Copying a committed checkpoint between any two stores, verifying every
chunk on the way (``pyckpt cp``).

The data files are streamed in windows of at most ``WINDOW`` bytes: each
window is read (a ranged read) and every block piece inside it checked against
its CRC-32C (``read_executor.read_window``), and the bytes (padding included)
are appended to the destination file. The destination gets new file names (a new attempt id)
and its index is written last, so a copy is committed atomically like a save,
and a corrupt source fails the copy before anything is committed.

A file an incremental checkpoint references in another checkpoint's directory holds
that checkpoint's data too: the copy takes only the blocks the checkpoint reads,
packed into a new file (``_packed``), and the copied index gives their new offsets.
"""

from __future__ import annotations

import functools
from typing import Any, Callable, Iterator

import numpy as np

from ..format import Manifest
from ..errors import CheckpointError, CorruptCheckpointError
from ..format.manifest import FileEntry
from ..format.records import BlockTable
from ..storage import LeftoverUploads, resolve
from ..storage.streamed import earlier_uploads_of, write_stream
from . import naming
from .read_executor import read_window
from .write_executor import leftovers
from .reader import OpenCheckpoint, open_checkpoint
from . import commit, writer
from .commit import discard, read_previous
from .incremental import Base, Matcher, assemble, damaged, plan_mode, record, usable_files

WINDOW = 64 << 20


def _windows(m: Manifest, f: int,
             window: int = WINDOW) -> list[tuple[int, int, list[tuple[str, int, int, int]]]]:
    """(begin, end, pieces) tiling file f; a piece is (key, block, lo, hi) in block bytes."""
    b = m.blocks
    cs = m.chunk_size
    owner = np.repeat(np.arange(len(m.keys)), np.diff(b.tensor_begin))
    sel = np.nonzero((b.file == f) & (b.nbytes > 0))[0]
    sel = sel[np.argsort(b.offset[sel], kind="stable")]
    step = max(cs, window // cs * cs)
    pieces = []
    for j in sel.tolist():
        off, n = int(b.offset[j]), int(b.nbytes[j])
        for lo in range(0, n, step):
            pieces.append((off + lo, off + min(n, lo + step), m.keys[int(owner[j])], j, lo,
                           min(n, lo + step)))
    out: list = []
    for start, end, key, j, lo, hi in pieces:
        if out and end - out[-1][0] <= window:
            out[-1][1] = end
            out[-1][2].append((key, j, lo, hi))
        else:
            out.append([start, end, [(key, j, lo, hi)]])
    size = m.files[f].size
    tiled: list[tuple[int, int, list[tuple[str, int, int, int]]]] = []
    for k, (start, end, ps) in enumerate(out):  # cover the padding between windows too
        begin = 0 if k == 0 else tiled[-1][1]
        stop = size if k + 1 == len(out) else out[k + 1][0]
        tiled.append((begin, stop, ps))
    if not tiled and size:
        tiled.append((0, size, []))
    return tiled


def _verified(ck: Any, f: int, window: int,
              on_bytes: Callable[[int], Any] | None = None) -> Iterator[np.ndarray]:
    """Data file ``f`` of the open checkpoint ``ck``, ``window`` bytes at a time (padding
    included), every chunk checked against its CRC-32C on the way."""
    m = ck.manifest
    ck.check_files([f])
    src_path = ck.file_path(f)
    for begin, end, pieces in _windows(m, f, window):
        plan = ck.plan_ranges([p[0] for p in pieces], np.array([p[1] for p in pieces]),
                              np.array([p[2] for p in pieces]),
                              np.array([p[3] for p in pieces]))
        data = read_window(ck.store, src_path, begin, end, plan, m.chunk_size, ck.options)
        if on_bytes is not None:
            on_bytes(len(data))
        yield data


def _packed_layout(m: Manifest, f: int, alignment: int) -> tuple[dict[int, int], int]:
    """({block: new offset}, new size) of data file ``f`` (referenced) holding only the
    checkpoint's own blocks of it, in their order, each at ``alignment``."""
    b = m.blocks
    sel = np.nonzero((b.file == f) & (b.nbytes > 0))[0]
    sel = sel[np.argsort(b.offset[sel], kind="stable")]
    out: dict[int, int] = {}
    at = 0
    for j in sel.tolist():
        at = -(-at // alignment) * alignment
        out[j] = at
        at += int(b.nbytes[j])
    return out, at


def _packed(ck: Any, f: int, offsets: dict[int, int], window: int,
            on_bytes: Callable[[int], Any] | None = None) -> Iterator[Any]:
    """The bytes of the packed file ``_packed_layout`` plans: the blocks of ``offsets``
    read from file ``f`` (neighbours together, at most ``window`` bytes a read, gaps of
    other checkpoints' data up to a chunk read along), every chunk checked."""
    m = ck.manifest
    b = m.blocks
    cs = m.chunk_size
    ck.check_files([f])
    src = ck.file_path(f)
    step = max(cs, window // cs * cs)
    pieces = []  # (old begin, old end, key, block, lo, hi, new begin)
    for j, new in offsets.items():
        off, n = int(b.offset[j]), int(b.nbytes[j])
        key = m.keys[int(np.searchsorted(b.tensor_begin, j, side="right")) - 1]
        for lo in range(0, n, step):
            hi = min(n, lo + step)
            pieces.append((off + lo, off + hi, key, j, lo, hi, new + lo))
    groups: list[list] = []
    for p in pieces:
        g = groups[-1] if groups else None
        if g is not None and p[1] - g[0][0] <= window and p[0] - g[-1][1] <= cs:
            g.append(p)
        else:
            groups.append([p])
    at = 0
    for g in groups:
        begin, end = g[0][0], max(p[1] for p in g)
        plan = ck.plan_ranges([p[2] for p in g], np.array([p[3] for p in g]),
                              np.array([p[4] for p in g]), np.array([p[5] for p in g]))
        data = memoryview(read_window(ck.store, src, begin, end, plan, cs, ck.options)).cast("B")
        for p in g:
            if p[6] > at:
                yield bytes(p[6] - at)  # alignment padding
            yield data[p[0] - begin:p[1] - begin]
            at = p[6] + p[1] - p[0]
        if on_bytes is not None:
            on_bytes(end - begin)


def _packed_blocks(m: Manifest, moved: dict[int, int]) -> Any:
    """``m``'s blocks with the offsets of ``moved`` ({block: new offset})."""
    b = m.blocks
    offset = b.offset.copy()
    for j, new in moved.items():
        offset[j] = new
    referenced = np.array([f.at is not None for f in m.files] + [False])
    offset[referenced[np.minimum(b.file, len(m.files))] & (b.nbytes == 0)] = 0
    return BlockTable(b.file, offset, b.nbytes, b.box, b.tensor_begin, b.crcs, m.chunk_size,
                      b.hashes)


def copy_file(ck: Any, f: int, store: Any, dst: str,
              on_bytes: Callable[[int], Any] | None = None, window: int = WINDOW,
              leftovers: LeftoverUploads | None = None,
              packed: tuple[dict[int, int], int] | None = None) -> None:
    """Streams data file ``f`` of the open checkpoint ``ck`` to ``dst`` in ``store``,
    checking every chunk on the way, ``window`` bytes at a time (``on_bytes`` is
    called after each), through the store's guarded write: on failure the caller
    deletes ``dst``. ``leftovers``: what the store may clean up beside it.
    ``packed``: only the blocks a ``_packed_layout`` plans, at its new offsets."""
    # through the store's guarded write (retries, stall limits, bounded cleanup):
    # no streamed file object of a remote store is ever left open
    if packed is not None:
        write_stream(store, dst, packed[1],
                     functools.partial(_packed, ck, f, packed[0], window, on_bytes), leftovers)
        return
    write_stream(store, dst, ck.manifest.files[f].size,
                 lambda: _verified(ck, f, window, on_bytes), leftovers)


def copy_files(source: Any, source_options: dict | None, store: Any, dst: str,
               which: Callable[[str], bool], on_bytes: Callable[[int], Any] | None = None,
               window: int = WINDOW) -> None:
    """Copies the data files of the committed checkpoint ``source`` that ``which(name)``
    picks into the directory ``dst`` of ``store``, under the same names, every chunk
    checked (a multi-worker persist: each worker uploads its own files; the commit is
    ``commit_copied``'s, once all are there)."""
    ck = open_checkpoint(source, source_options)
    store.makedirs(dst)
    for f, file in enumerate(ck.manifest.files):
        if which(file.name):  # a fixed name, maybe written before by a persist that died
            path = store.join(dst, file.name)
            copy_file(ck, f, store, path, on_bytes, window=window,
                      leftovers=earlier_uploads_of(path))


def commit_copied(src_store: Any, src: str, store: Any, dst: str) -> None:
    """Commits at ``dst`` the index of the checkpoint at ``src``, whose data files were
    copied there under their names (``copy_files``)."""
    manifest = read_previous(src_store, src)
    if manifest is None:
        raise CheckpointError(f"the index of {src_store.url(src)} is gone")
    if manifest.has_references:  # its referenced files were not copied with it
        raise CheckpointError(f"{src_store.url(src)} references other checkpoints' files: "
                              "its index cannot be committed elsewhere as it is")
    # a PERSIST commit, whose sweep: every worker's upload is done, so any other data file
    # there, or upload still open, is a failed earlier persist's (nothing marks these
    # copies live)
    commit.finish(commit.Kind.PERSIST, store, dst, manifest)


def read_data_files(store: Any, path: str, manifest: Manifest,
                    names: list[str]) -> list[np.ndarray]:
    """The data files ``names`` of the checkpoint at ``path`` whole, as ``manifest``
    describes them (committed or about to be), every chunk checked like any read:
    a file whose bytes differ raises CorruptCheckpointError naming it and the range."""
    ck = OpenCheckpoint(store, path, manifest)
    where = {f.name: i for i, f in enumerate(manifest.files)}
    out = []
    for name in names:
        if name not in where:
            raise CheckpointError(f"{store.url(store.join(path, name))} is not a data file "
                                  "of its checkpoint's index")
        f = where[name]
        data = np.empty(manifest.files[f].size, np.uint8)
        at = 0
        for piece in _verified(ck, f, WINDOW):
            n = len(piece)
            data[at:at + n] = np.frombuffer(piece, np.uint8)
            at += n
        if at != data.size:
            raise CorruptCheckpointError(f"{store.url(store.join(path, name))}: read {at} of its "
                                         f"{data.size} bytes (bytes [{at}, {data.size}) missing)")
        out.append(data)
    return out


def _fingerprinted_info(m: Manifest, attempt: str, url: str) -> dict:
    """The copy's ``info``: the source's, with a new attempt and where it came from; a
    source with fingerprints makes a full checkpoint that incremental saves (and
    persists) can use as their base."""
    out = {**{k: v for k, v in m.info.items() if k != "incremental"},
           "attempt": attempt, "copied_from": url}
    if m.blocks.hashes is not None:
        out["incremental"] = record(None, "full", None, int(m.blocks.nbytes.sum()))
    return out


def copy_checkpoint(src: Any, dst: Any, *, src_options: dict | None = None,
                    dst_options: dict | None = None,
                    progress: Callable[[int, int], Any] | None = None,
                    base: Base | None = None) -> str:
    """Copies the committed checkpoint ``src`` to ``dst`` (any stores), verifying
    every chunk; commits the copy last; returns its URL. The copy is self-contained
    (of the files an incremental checkpoint references, the blocks it reads are
    copied into it too, packed: ``_packed``), unless
    ``base`` (a checkpoint beside ``dst``: a tier persist of an incremental run) is
    given: then the tensors whose fingerprints equal the base's are referenced there
    and only the others are copied (``copy_referencing``)."""
    ck = open_checkpoint(src, src_options)
    m = ck.manifest
    store, path = resolve(dst, dst_options)
    store.makedirs(path)
    if base is not None and plan_mode(base) == "selective" and m.blocks.hashes is not None \
            and m.all_plain:
        return copy_referencing(ck, store, path, base, progress)
    # a referenced file: only the blocks this checkpoint reads, packed (module doc)
    packed = {f: _packed_layout(m, f, ck.options.alignment)
              for f, entry in enumerate(m.files) if entry.at is not None}
    sizes = [packed[f][1] if f in packed else entry.size for f, entry in enumerate(m.files)]
    total = sum(sizes)
    done = 0
    new_files: list[FileEntry] = []
    # its uploads are its own (stale_uploads.py)
    with commit.Attempt.begin(commit.Kind.COPY, store, path) as a:
        sweep: LeftoverUploads | None = leftovers(store, path, a.id)
        try:
            for f, entry in enumerate(m.files):
                name = naming.data_file_name(a.id, 0, f)
                new_files.append(FileEntry(name, sizes[f]))

                def count(n: int) -> None:
                    nonlocal done
                    done += n
                    if progress is not None:
                        progress(done, total)

                copy_file(ck, f, store, store.join(path, name), count, leftovers=sweep,
                          packed=packed.get(f))
                sweep = None  # one sweep per copy
        except BaseException:  # before the commit: nothing of this attempt can be committed
            discard(store, path, new_files)
            raise
        moves = {j: new for offsets, _ in packed.values() for j, new in offsets.items()}
        a.finish(commit.copied_index(m, new_files,
                                     _packed_blocks(m, moves) if packed else m.blocks,
                                     _fingerprinted_info(m, a.id, ck.url)))
    return store.url(path)


def copy_referencing(ck: OpenCheckpoint, store: Any, path: str, base: Base,
                     progress: Callable[[int, int], Any] | None = None) -> str:
    """Copies the open checkpoint ``ck`` (tensors stored whole, with fingerprints) to
    ``store``/``path`` as an incremental checkpoint of ``base``: tensors whose key,
    dtype, shape and chunk fingerprints equal a base block's are referenced there,
    the others are read (every chunk verified) and written. Memory: the changed
    tensors, read whole."""
    m = ck.manifest
    b = m.blocks
    assert b.hashes is not None
    match = Matcher(base, usable_files(store, base), m.chunk_size)
    reuse = [match.block(m.keys[i], m.dtype_names[i], m.shapes[i], None,
                         b.hashes[int(b.tensor_begin[i])]) for i in range(len(m.keys))]
    bad = damaged(store, base, (j for j in reuse if j >= 0))
    reuse = [-1 if j in bad else j for j in reuse]
    changed = [i for i, j in enumerate(reuse) if j < 0]
    arrays = ck.read_new_plain(changed)
    tensors = [writer.PreparedTensor(m.keys[i], a, m.dtype_names[i])
               for i, a in zip(changed, arrays)]
    with commit.Attempt.begin(commit.Kind.COPY, store, path) as attempt:
        data = writer.write_data(store, path, tensors, attempt=attempt.id)
        total = int(b.nbytes.sum())
        if progress is not None:
            progress(total, total)
        files, cols = assemble(reuse, data, base, m.chunk_size)
        inc = record(base, "selective", sum(a.nbytes for a in arrays), total)
        attempt.finish(commit.ManifestParts(
            chunk_size=m.chunk_size, files=files, keys=m.keys, dtype_names=list(m.dtype_names),
            shapes=list(m.shapes), file=cols["file"], offset=cols["offset"],
            nbytes=cols["nbytes"], crcs=cols["crcs"], tree=m.tree, metadata=m.metadata,
            graph=m.graph, hashes=b.hashes,
            info={**_fingerprinted_info(m, attempt.id, ck.url), "incremental": inc}))
    return store.url(path)
