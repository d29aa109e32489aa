"""Where a restore reads values from: an opened checkpoint (any format) or a Snapshot."""

from __future__ import annotations

from typing import Any, Protocol, Sequence

import numpy as np

from ..device.array import DeviceArray
from ..device.copies import copy_values
from ..errors import CorruptCheckpointError
from ..format.read_plan import ReadPlan
from ..format.source import CheckpointSource
from .object_graph import StoredGraph


class ValueSource(Protocol):
    """What a restore reads from: the stored graph, each value's shape and dtype by key,
    and a batched read into given arrays."""

    graph: StoredGraph

    def describe(self) -> str:
        """The source as messages name it (a URL, or "snapshot")."""

    def shape_dtype(self, key: str) -> tuple[tuple[int, ...], np.dtype]:
        """``(shape, dtype)`` of the value under ``key``."""

    def read(self, keys: Sequence[str], dsts: Sequence[Any]) -> None:
        """Fills each of ``dsts`` (host arrays, or ``DeviceArray``s filled on their
        device) with the verified value of the matching key."""


class StoredValues:
    """Values of an opened checkpoint (any format), read on demand (lazily for
    deferred restores). Flat checkpoints act as a graph through their split keys."""

    def __init__(self, src: CheckpointSource) -> None:
        self.src = src
        if src.graph is not None:
            def bad(what: str) -> Exception:
                return CorruptCheckpointError(f"checkpoint {src.url}: object graph: {what}")

            self.graph = StoredGraph.from_json(src.graph, src.index, bad)
        else:
            self.graph = StoredGraph.from_keys(src.keys)

    def describe(self) -> str:
        """The checkpoint's URL."""
        return self.src.url

    def shape_dtype(self, key: str) -> tuple[tuple[int, ...], np.dtype]:
        """``(shape, dtype)`` of ``key`` as stored."""
        i = self.src.index[key]  # graph values were validated against the keys
        return self.src.shape(i), self.src.dtype(i)

    def read(self, keys: Sequence[str], dsts: Sequence[np.ndarray]) -> None:
        """Reads the values of ``keys`` into ``dsts`` (host arrays, or DeviceArrays
        filled on their device) in one verified batch: one ReadPlan."""
        index = self.src.index
        ReadPlan(self.src, [index[k] for k in keys], dsts).execute()


class SnapshotSource:
    """Values of a Snapshot, copied out of its buffers: device to device where the
    snapshot's copy and the target share a device (queued in order with the
    caller's work), through the copy engine between host and device memory."""

    def __init__(self, snapshot: Any) -> None:
        self.snapshot = snapshot
        self.graph = snapshot.graph

    def describe(self) -> str:
        """``"snapshot"``."""
        return "snapshot"

    def shape_dtype(self, key: str) -> tuple[tuple[int, ...], np.dtype]:
        """``(shape, dtype)`` of the snapshot's array under ``key``."""
        arr = self.snapshot.arrays[key]
        return arr.shape, arr.dtype

    def read(self, keys: Sequence[str], dsts: Sequence[Any]) -> None:
        """Copies the snapshot's values of ``keys`` into ``dsts`` (host arrays or
        DeviceArrays; ``device.copies.copy_values``)."""
        copy_values([self.snapshot.arrays[k] for k in keys], dsts)

    def device_copies(self, keys: Sequence[str]) -> dict[str, DeviceArray]:
        """New arrays on the device, holding copies of the values of ``keys`` whose
        copy lies in device memory (``engine.clones``, ordered with the caller's
        work: nothing crosses to the host), by key; an engine that makes none (JAX's
        arrays cannot be filled) leaves its keys out, to be read to the host."""
        arrays = self.snapshot.arrays
        by_engine: dict[Any, list[str]] = {}
        for k in keys:
            a = arrays[k]
            if isinstance(a, DeviceArray):
                by_engine.setdefault(a.engine, []).append(k)
        out: dict[str, DeviceArray] = {}
        for eng, ks in by_engine.items():
            try:
                made = eng.clones(eng.batch([arrays[k] for k in ks]))
            except (NotImplementedError, TypeError):
                continue
            out.update(zip(ks, made.arrays))
        return out
