"""Tuning knobs of the engine, with the defaults documented in docs/FORMAT.md."""

from __future__ import annotations

import dataclasses
import os


def _env_int(name: str, default: int) -> int:
    try:
        return int(os.environ.get(name, default))
    except ValueError:
        return default


@dataclasses.dataclass(frozen=True)
class IOOptions:
    #: Worker threads of the C++ core (0: PYCKPT_THREADS, else the CPU count, at least 2).
    threads: int = dataclasses.field(default_factory=lambda: _env_int("PYCKPT_THREADS", 0))
    #: Checksum granularity: one CRC32C per chunk of each tensor.
    chunk_size: int = 1 << 20
    #: Unit of parallel work (a multiple of chunk_size).
    piece_size: int = 8 << 20
    #: fsync data files and the index before a save returns.
    sync: bool = True
    #: Tensor byte alignment inside shard files.
    alignment: int = 64
    #: Shard files are at least this large unless the checkpoint is smaller...
    min_file_bytes: int = 64 << 20
    #: ...and at most this large (object stores prefer few, large objects).
    max_file_bytes: int = 2 << 30


DEFAULT = IOOptions()
