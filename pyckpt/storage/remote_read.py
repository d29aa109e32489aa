"""Loading tensors from an object store: only the needed byte ranges, verified.

Each tensor's bytes are split at chunk-aligned points into pieces of at most
``read_request_max`` bytes; pieces of one file closer than ``read_gap`` are
merged into one ranged GET. Requests are fetched concurrently in batches of
``read_batch_bytes`` (the next batch is fetched while the current one is
checked), and the C++ core verifies every chunk's CRC and copies the bytes
into the destination arrays.
"""

from __future__ import annotations

import concurrent.futures
from typing import Any, Sequence

import numpy as np

from .. import _core, progress


class _Piece:
    __slots__ = ("file", "start", "end", "key", "c0", "c1", "dst")

    def __init__(self, file: int, start: int, end: int, key: str, c0: int, c1: int,
                 dst: np.ndarray | None) -> None:
        self.file, self.start, self.end, self.key = file, start, end, key
        self.c0, self.c1, self.dst = c0, c1, dst


def _pieces(plan: Any, dsts: Sequence[Any], chunk: int, piece_max: int,
            post: list) -> list[_Piece]:
    out = []
    crc_begin = plan.crc_begin.tolist()
    files, offsets, sizes = plan.file.tolist(), plan.offset.tolist(), plan.nbytes.tolist()
    for i, key in enumerate(plan.keys):
        n = sizes[i]
        if n == 0:
            continue
        dst, flat = dsts[i], None
        if dst is not None:
            target = dst
            if not dst.flags.c_contiguous:
                target = np.empty(dst.shape, dtype=dst.dtype)
                post.append((dst, target))
            flat = target.reshape(-1).view(np.uint8)
        for a in range(0, n, piece_max):
            b = min(n, a + piece_max)
            out.append(_Piece(files[i], offsets[i] + a, offsets[i] + b, key,
                              crc_begin[i] + a // chunk, crc_begin[i] + -(-b // chunk),
                              None if flat is None else flat[a:b]))
    return out


def _requests(pieces: list[_Piece], gap: int, request_max: int) -> list[tuple[int, int, int, list]]:
    pieces.sort(key=lambda p: (p.file, p.start))
    reqs: list[tuple[int, int, int, list]] = []
    for p in pieces:
        if reqs:
            f, s, e, members = reqs[-1]
            if f == p.file and p.start - e <= gap and p.end - s <= request_max:
                members.append(p)
                reqs[-1] = (f, s, max(e, p.end), members)
                continue
        reqs.append((p.file, p.start, p.end, [p]))
    return reqs


def _batches(reqs: list, limit: int) -> list[list]:
    out: list[list] = []
    size = 0
    for r in reqs:
        if not out or size + (r[2] - r[1]) > limit:
            out.append([])
            size = 0
        out[-1].append(r)
        size += r[2] - r[1]
    return out


def read_plan(store: Any, ck: Any, plan: Any, dsts: Sequence[Any], opts: Any) -> None:
    chunk = ck.manifest.chunk_size
    request_max = min(opts.read_request_max, opts.read_batch_bytes // opts.max_concurrency)
    piece_max = max(chunk, request_max // chunk * chunk)
    post: list = []
    pieces = _pieces(plan, dsts, chunk, piece_max, post)
    reqs = _requests(pieces, opts.read_gap, max(request_max, piece_max))
    batches = _batches(reqs, opts.read_batch_bytes)
    paths = {f: ck.file_path(f) for f in {r[0] for r in reqs}}

    def fetch(batch: list) -> list[bytes]:
        return store.fetch([(paths[f], s, e) for f, s, e, _ in batch])

    with concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="pyckpt-prefetch") as pool:
        pending = pool.submit(fetch, batches[0]) if batches else None
        for k, batch in enumerate(batches):
            assert pending is not None
            bufs = pending.result()
            pending = pool.submit(fetch, batches[k + 1]) if k + 1 < len(batches) else None
            _verify_and_scatter(store, paths, plan, batch, bufs, chunk, ck.options.threads)
    for dst, tmp in post:
        np.copyto(dst, tmp)


def _verify_and_scatter(store: Any, paths: dict, plan: Any, batch: list, bufs: list,
                        chunk: int, threads: int) -> None:
    keys, sources, offsets, nbytes, dsts, crc_parts = [], [], [], [], [], []
    for r, (_, _, _, members) in enumerate(batch):
        for p in members:
            keys.append(p.key)
            sources.append(r)
            offsets.append(p.start)
            nbytes.append(p.end - p.start)
            dsts.append(p.dst)
            crc_parts.append(plan.crcs[p.c0:p.c1])
    lens = [len(c) for c in crc_parts]
    crc_begin = np.zeros(len(keys) + 1, dtype=np.uint64)
    np.cumsum(lens, out=crc_begin[1:])
    crcs = np.concatenate(crc_parts) if crc_parts else np.zeros(0, np.uint32)
    _core.read_shards([store.url(paths[f]) for f, _, _, _ in batch], bufs,
                      [s for _, s, _, _ in batch], keys, np.asarray(sources, dtype=np.uint32),
                      np.asarray(offsets, dtype=np.uint64), np.asarray(nbytes, dtype=np.uint64),
                      crcs, crc_begin, dsts, chunk, threads, True, 8 << 20, 64 << 10,
                      progress.counter())
