"""Where a restore reads values from: a committed checkpoint or a Snapshot."""

from __future__ import annotations

from typing import Any, Protocol, Sequence

import numpy as np

from .. import _core
from .object_graph import StoredGraph


class ValueSource(Protocol):
    graph: StoredGraph

    def describe(self) -> str: ...

    def shape_dtype(self, key: str) -> tuple[tuple[int, ...], np.dtype]: ...

    def read(self, keys: Sequence[str], dsts: Sequence[np.ndarray]) -> None: ...


class CheckpointSource:
    """Values of a committed checkpoint, read on demand (lazily for deferred restores)."""

    def __init__(self, ck: Any) -> None:
        from ..errors import CorruptCheckpointError

        self.ck = ck
        m = ck.manifest
        if m.graph is not None:
            def bad(what: str) -> Exception:
                return CorruptCheckpointError(f"checkpoint {ck.url}: object graph: {what}")

            self.graph = StoredGraph.from_json(m.graph, m.index, bad)
        else:
            self.graph = StoredGraph.from_keys(m.keys)

    def describe(self) -> str:
        return self.ck.url

    def shape_dtype(self, key: str) -> tuple[tuple[int, ...], np.dtype]:
        m = self.ck.manifest
        i = m.index[key]  # graph values were validated against the keys
        return m.shapes[i], m.dtype(i)

    def read(self, keys: Sequence[str], dsts: Sequence[np.ndarray]) -> None:
        m = self.ck.manifest
        index = m.index
        idx = [index[k] for k in keys]
        if m.all_plain:
            self.ck.read(idx, dsts)
            return
        plain = [(i, d) for i, d in zip(idx, dsts) if m.is_plain(i)]
        self.ck.read([i for i, _ in plain], [d for _, d in plain])
        sharded = [(i, d) for i, d in zip(idx, dsts) if not m.is_plain(i)]
        if sharded:
            from ..engine.sharded_read import read_into_targets

            read_into_targets(self.ck, sharded)


class SnapshotSource:
    def __init__(self, snapshot: Any) -> None:
        self.snapshot = snapshot
        self.graph = snapshot.graph

    def describe(self) -> str:
        return "snapshot"

    def shape_dtype(self, key: str) -> tuple[tuple[int, ...], np.dtype]:
        arr = self.snapshot.arrays[key]
        return arr.shape, arr.dtype

    def read(self, keys: Sequence[str], dsts: Sequence[np.ndarray]) -> None:
        _core.copy_arrays([self.snapshot.arrays[k] for k in keys], list(dsts), 0)
