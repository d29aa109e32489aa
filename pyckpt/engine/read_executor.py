"""Executing block reads: the one place where stored tensor bytes are read and
their checksums verified (every chunk, in the C++ core, ``_core.read_shards``).

``BlockReads`` names, per item, a byte range of a shard file and the masked
CRC-32C of each chunk of it. ``execute`` asks the store once for its fast
path and runs the plan one of three ways:

- the store has native paths for the files (``Store.native_path``, a local
  disk): the C++ core reads the files itself, in parallel;
- the caller passes buffers of the files (memory maps): the core verifies the
  items in memory and copies them out;
- otherwise the plan becomes ``ByteRange`` requests of at most the store's
  ``request_max`` bytes, filled in file order: items of one file closer than
  ``gap`` share a request, and an item that does not fit is split at one of its
  chunk boundaries, its rest going to the next request.
  Requests go to ``Store.fetch`` in batches of ``batch_bytes`` (the next batch
  is fetched while the current one is verified), and the core verifies every
  chunk of a batch before it copies the bytes into the destinations. Where the
  store can (``Store.fetch(into=)``, S3), a request's bytes are received straight
  into the destinations of its pieces (``_Landing``): the core then verifies them
  in place, and no buffer of the request's size is made.
"""

from __future__ import annotations

import concurrent.futures
import mmap
from typing import Any, Mapping, Sequence

import numpy as np

from .. import progress
from .._native import core as _core
from ..errors import CorruptCheckpointError
from ..storage import ByteRange, Store, buffer_size
from ..storage.local import map_file
from .options import IOOptions

__all__ = ["BlockReads", "execute", "map_files", "read_window", "verify"]


class BlockReads:
    """Items to read: ``keys[i]`` (for messages) is bytes [offset[i], offset[i] +
    nbytes[i]) of file ``file[i]``, whose chunk CRCs are
    ``crcs[crc_begin[i]:crc_begin[i + 1]]``."""

    __slots__ = ("keys", "file", "offset", "nbytes", "crcs", "crc_begin")

    def __init__(self, keys: list[str], file: np.ndarray, offset: np.ndarray, nbytes: np.ndarray,
                 crcs: np.ndarray, crc_begin: np.ndarray) -> None:
        self.keys = keys
        self.file = file
        self.offset = offset
        self.nbytes = nbytes
        self.crcs = crcs
        self.crc_begin = crc_begin


def verify(names: Sequence[str], buffers: Sequence[Any], bases: Sequence[int], keys: Sequence[str],
           sources: Any, offsets: Any, nbytes: Any, crcs: Any, crc_begin: Any,
           dsts: Sequence[Any], chunk_size: int, options: IOOptions) -> None:
    """The C++ reader: item i is bytes [offsets[i], offsets[i] + nbytes[i]) of source
    ``sources[i]`` (the file ``names[s]``, or ``buffers[s]`` holding that file's bytes
    from ``bases[s]`` on); every chunk is checked against its CRC, then copied into
    ``dsts[i]`` (None: check only). Raises CorruptCheckpointError naming the key, the
    file and the byte range of the first mismatch."""
    _core.read_shards(names=list(names), buffers=list(buffers), bases=list(bases), keys=list(keys),
                      sources=sources, offsets=offsets, nbytes=nbytes, crcs=crcs,
                      crc_begin=crc_begin, dsts=list(dsts),
                      options=_core.ReadOptions(chunk_size=chunk_size, threads=options.threads,
                                                piece_size=options.piece_size,
                                                progress=progress.counter()))




def execute(store: Store, paths: Mapping[int, str], plan: BlockReads, dsts: Sequence[Any],
            chunk_size: int, options: IOOptions,
            buffers: Mapping[int, Any] | None = None) -> None:
    """Reads and verifies ``plan`` into ``dsts`` (None: verify only). ``paths``: the
    store path of every file the plan reads (by file number); ``buffers``: the
    whole bytes of those files, when the caller has them (memory maps)."""
    if len(plan.keys) == 0:
        return
    files = sorted(paths)
    names = store.native_paths([paths[f] for f in files])
    if names is None and buffers is None:
        _fetch_and_verify(store, paths, plan, dsts, chunk_size, options)
        return
    if names is None:
        names = [store.url(paths[f]) for f in files]
    used = np.asarray(files, dtype=np.int64)
    source = np.searchsorted(used, plan.file).astype(np.uint32) if len(used) else \
        np.zeros(len(plan.keys), dtype=np.uint32)
    bufs = [None if buffers is None else buffers[f] for f in files]
    verify(names, bufs, [0] * len(files), plan.keys, source, plan.offset, plan.nbytes, plan.crcs,
           plan.crc_begin, dsts, chunk_size, options)


def map_files(store: Store, root: str, paths: Mapping[int, str]) -> dict[int, mmap.mmap] | None:
    """Read-only memory maps of the (non-empty) files of the checkpoint ``root``, or
    None when the store has no native paths there (then there is nothing to map)."""
    files = sorted(paths)
    names = store.native_paths([root] + [paths[f] for f in files])
    if names is None:
        return None
    names = names[1:]
    return {f: map_file(n) for f, n in zip(files, names)}


def read_window(store: Store, path: str, begin: int, end: int, plan: BlockReads,
                chunk_size: int, options: IOOptions) -> Any:
    """Bytes [begin, end) of one file, after verifying the plan's items (which lie
    inside the window) against their CRCs: a verified streaming copy."""
    data = _checked(store, store.fetch([ByteRange(path, begin, end)]), [(path, begin, end)])[0]
    if len(plan.keys):
        verify([store.url(path)], [data], [begin], plan.keys,
               np.zeros(len(plan.keys), np.uint32), plan.offset, plan.nbytes, plan.crcs,
               plan.crc_begin, [None] * len(plan.keys), chunk_size, options)
    return data


def _checked(store: Store, bufs: Sequence[Any], ranges: Sequence[tuple[str, int, int]]) -> list:
    out = list(bufs)
    if len(out) != len(ranges):
        raise CorruptCheckpointError(f"the store returned {len(out)} buffers for "
                                     f"{len(ranges)} ranged reads")
    for data, (path, start, end) in zip(out, ranges):
        n = buffer_size(data)
        if n != end - start:
            raise CorruptCheckpointError(f"'{store.url(path)}' returned {n} bytes for bytes "
                                         f"[{start}, {end}) (truncated object?)")
    return out


# -- ranged reads ------------------------------------------------------------------------

class _Piece:
    __slots__ = ("file", "start", "end", "key", "c0", "c1", "dst")

    def __init__(self, file: int, start: int, end: int, key: str, c0: int, c1: int,
                 dst: np.ndarray | None) -> None:
        self.file, self.start, self.end, self.key = file, start, end, key
        self.c0, self.c1, self.dst = c0, c1, dst


def _requests(plan: BlockReads, dsts: Sequence[Any], chunk: int, request_max: int, gap: int,
              post: list) -> list[tuple[int, int, int, list[_Piece]]]:
    """The plan's bytes as ranged requests (file, start, end, pieces) of at most
    ``request_max`` bytes (at least one chunk), filled in file order: an item joins
    the request before it when it starts at most ``gap`` bytes after it, and one
    that does not fit whole is split at the last of its chunk boundaries that fits,
    the rest going on to the next requests. Every piece starts at a chunk boundary
    of its item (its CRCs are ``plan.crcs[c0:c1]``); full requests mean fewer of
    them (each costs a round trip and a request charge). A destination that is not
    contiguous gets a contiguous stand-in, copied over at the end (``post``)."""
    crc_begin = plan.crc_begin.tolist()
    files, offsets, sizes = plan.file.tolist(), plan.offset.tolist(), plan.nbytes.tolist()
    step = max(chunk, request_max // chunk * chunk)  # a request's first piece, at most
    reqs: list[tuple[int, int, int, list[_Piece]]] = []
    for i in sorted(range(len(plan.keys)), key=lambda i: (files[i], offsets[i])):
        f, o, n = files[i], offsets[i], sizes[i]
        if n == 0:
            continue
        flat = None
        if dsts[i] is not None:
            target = dsts[i]
            if not target.flags.c_contiguous:
                target = np.empty(target.shape, dtype=target.dtype)
                post.append((dsts[i], target))
            flat = target.reshape(-1).view(np.uint8)
        a = 0
        while a < n:
            s, take = o + a, 0
            if reqs and reqs[-1][0] == f and s - reqs[-1][2] <= gap:
                room = reqs[-1][1] + max(request_max, step) - s
                take = n - a if n - a <= room else max(0, room) // chunk * chunk
            joined = take > 0
            if not joined:
                take = min(n - a, step)
            p = _Piece(f, s, s + take, plan.keys[i], crc_begin[i] + a // chunk,
                       crc_begin[i] + -(-(a + take) // chunk),
                       None if flat is None else flat[a:a + take])
            if joined:
                rf, rs, re, members = reqs[-1]
                members.append(p)
                reqs[-1] = (rf, rs, max(re, s + take), members)
            else:
                reqs.append((f, s, s + take, [p]))
            a += take
    return reqs


#: Bytes received straight into destinations per batch, in batch_bytes: they take
#: no memory of their own, but each batch is verified once it has arrived.
LANDED_PER_BATCH = 4


def _batches(reqs: list, limit: int, lands: bool) -> list[list]:
    """The requests in batches of at most ``limit`` bytes of buffers of their own (the
    store's batch_bytes) and, where the store receives into destinations (``lands``),
    at most ``LANDED_PER_BATCH * limit`` bytes received in place."""
    out: list[list] = []
    own = landed = 0
    for r in reqs:
        size = r[2] - r[1]
        into = sum(p.end - p.start for p in r[3]
                   if p.dst is not None and p.dst.flags.writeable) if lands else 0
        if not out or own + size - into > limit or landed + into > LANDED_PER_BATCH * limit:
            out.append([])
            own = landed = 0
        out[-1].append(r)
        own += size - into
        landed += into
    return out


class _Landing:
    """Where the store may receive a request's bytes (``Store.fetch(into=)``): the
    destination of each piece in turn, and new buffers for the bytes between pieces
    and for pieces without a destination (verify only). ``member[j]`` is the buffer
    of the request's j-th piece, verified in place there."""

    __slots__ = ("segments", "member")

    def __init__(self, segments: list[np.ndarray], member: list[np.ndarray]) -> None:
        self.segments, self.member = segments, member

    @staticmethod
    def of(request: tuple[int, int, int, list]) -> "_Landing | None":
        """None when no piece has a writable destination or the pieces overlap (a
        damaged index: then the plain way, whose checks name it)."""
        _, start, end, members = request
        if not any(p.dst is not None and p.dst.flags.writeable for p in members):
            return None
        segments, member, at = [], [], start
        for p in members:
            if p.start < at:
                return None
            if p.start > at:
                segments.append(np.empty(p.start - at, np.uint8))
            own = p.dst is not None and p.dst.flags.writeable
            buf = p.dst if own else np.empty(p.end - p.start, np.uint8)
            segments.append(buf)
            member.append(buf)
            at = p.end
        return _Landing(segments, member) if at == end else None


def _fetch_and_verify(store: Store, paths: Mapping[int, str], plan: BlockReads,
                      dsts: Sequence[Any], chunk: int, options: IOOptions) -> None:
    policy = store.fetch_policy()
    request_max = min(policy.request_max, policy.batch_bytes // max(1, policy.concurrency))
    post: list = []
    reqs = _requests(plan, dsts, chunk, request_max, policy.gap, post)
    batches = _batches(reqs, policy.batch_bytes, policy.lands)

    def fetch(batch: list) -> tuple[list, list]:
        ranges = [(paths[f], s, e) for f, s, e, _ in batch]
        landings = [_Landing.of(r) if policy.lands else None for r in batch]
        got = store.fetch([ByteRange(*r) for r in ranges],
                          into=[x and x.segments for x in landings])
        # a store that received a request into its segments hands back that very list
        landed = [x if x is not None and b is x.segments else None
                  for x, b in zip(landings, got)]
        return _checked(store, got, ranges), landed

    with concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="pyckpt-prefetch") as pool:
        pending = pool.submit(fetch, batches[0]) if batches else None
        for k, batch in enumerate(batches):
            assert pending is not None
            bufs, landed = pending.result()
            pending = pool.submit(fetch, batches[k + 1]) if k + 1 < len(batches) else None
            _verify_batch(store, paths, plan, batch, bufs, landed, chunk, options)
    for dst, tmp in post:
        np.copyto(dst, tmp)


def _verify_batch(store: Store, paths: Mapping[int, str], plan: BlockReads, batch: list,
                  bufs: list, landed: list, chunk: int, options: IOOptions) -> None:
    names, buffers, bases = [], [], []
    keys, sources, offsets, nbytes, dsts, crc_parts = [], [], [], [], [], []
    for r, (f, start, _, members) in enumerate(batch):
        if landed[r] is None:  # one buffer of the request's bytes, copied out
            names.append(store.url(paths[f]))
            buffers.append(bufs[r])
            bases.append(start)
        for j, p in enumerate(members):
            if landed[r] is not None:  # each piece in its own buffer, checked there
                names.append(store.url(paths[f]))
                buffers.append(landed[r].member[j])
                bases.append(p.start)
            keys.append(p.key)
            sources.append(len(buffers) - 1)
            offsets.append(p.start)
            nbytes.append(p.end - p.start)
            dsts.append(p.dst)
            crc_parts.append(plan.crcs[p.c0:p.c1])
    lens = [len(c) for c in crc_parts]
    crc_begin = np.zeros(len(keys) + 1, dtype=np.uint64)
    np.cumsum(lens, out=crc_begin[1:])
    crcs = np.concatenate(crc_parts) if crc_parts else np.zeros(0, np.uint32)
    verify(names, buffers, bases, keys, np.asarray(sources, dtype=np.uint32),
           np.asarray(offsets, dtype=np.uint64), np.asarray(nbytes, dtype=np.uint64), crcs,
           crc_begin, dsts, chunk, options)
