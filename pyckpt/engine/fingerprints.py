"""128-bit fingerprints of stored blocks, chunk by chunk: what an incremental save
compares to decide that a block is unchanged (docs/FORMAT.md section 12).

The fingerprint of a chunk (the same ``chunk_size`` chunks as the CRC-32C, counted
from the block's first byte) is the first 16 bytes of its SHA-256. A block's
fingerprints are one lowercase hex string, 32 digits per chunk. SHA-256 runs in
OpenSSL through ``hashlib`` (SHA-NI or AVX2 where the CPU has them, dispatched at
run time), which releases the GIL: the chunks are hashed on a pool of threads,
batched into pieces of at least ``PIECE`` bytes.

Why SHA-256 truncated to 128 bits: two different chunks get the same fingerprint
with probability 2^-128 (no structure of training data makes SHA-256 collide;
finding a collision on purpose is beyond reach even at 128 bits, about 2^64
work per chunk for a generic birthday attack). A save compares each chunk with
the one chunk of the same key and position in its base, so over a run of
10^12 chunk comparisons the odds of one silent wrong value are below 10^-26.
"""

from __future__ import annotations

import concurrent.futures
import hashlib
import threading
from typing import Sequence

import numpy as np

from .._native import core as _core

__all__ = ["DIGEST_BYTES", "PIECE", "block_hashes", "HashJob"]

DIGEST_BYTES = 16
#: the least work one hashing task gets (small tensors are batched together)
PIECE = 8 << 20

_POOL: concurrent.futures.ThreadPoolExecutor | None = None
_POOL_LOCK = threading.Lock()


def _pool(threads: int) -> concurrent.futures.ThreadPoolExecutor:
    global _POOL
    with _POOL_LOCK:
        if _POOL is None:
            _POOL = concurrent.futures.ThreadPoolExecutor(
                max_workers=max(2, threads), thread_name_prefix="pyckpt-hash")
        return _POOL


def _bytes_of(a: np.ndarray) -> memoryview:
    """The array's bytes in C order (a copy only for a non-contiguous array)."""
    if not a.flags.c_contiguous:
        a = np.ascontiguousarray(a)
    return memoryview(a.reshape(-1).view(np.uint8).data)


def _hash_piece(views: list[memoryview], work: list[tuple[int, int, int]]) -> list[bytes]:
    out = []
    for i, lo, hi in work:
        out.append(hashlib.sha256(views[i][lo:hi]).digest()[:DIGEST_BYTES])
    return out


class HashJob:
    """Fingerprinting of ``arrays`` started on the pool; ``result()`` waits for the
    hex strings (one per array, in order). Runs while the caller writes the same
    arrays (a full save hashes its data on the side)."""

    def __init__(self, arrays: Sequence[np.ndarray], chunk_size: int, threads: int = 0) -> None:
        self.n = len(arrays)
        self.views = [_bytes_of(a) if a.nbytes else memoryview(b"") for a in arrays]
        pieces: list[list[tuple[int, int, int]]] = []
        current: list[tuple[int, int, int]] = []
        size = 0
        for i, v in enumerate(self.views):
            for lo in range(0, len(v), chunk_size):
                hi = min(len(v), lo + chunk_size)
                current.append((i, lo, hi))
                size += hi - lo
                if size >= PIECE:
                    pieces.append(current)
                    current, size = [], 0
        if current:
            pieces.append(current)
        self.pieces = pieces
        pool = _pool(threads if threads > 0 else _core.default_threads())
        self.futures = [pool.submit(_hash_piece, self.views, p) for p in pieces]

    def result(self) -> list[str]:
        parts: list[list[bytes]] = [[] for _ in range(self.n)]
        for piece, fut in zip(self.pieces, self.futures):
            for (i, _, _), digest in zip(piece, fut.result()):
                parts[i].append(digest)
        self.views = []
        return [b"".join(p).hex() for p in parts]


def block_hashes(arrays: Sequence[np.ndarray], chunk_size: int, threads: int = 0) -> list[str]:
    """The fingerprints of each array (module doc), computed on ``threads`` threads."""
    return HashJob(arrays, chunk_size, threads).result()
