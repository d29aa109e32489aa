"""``pyckpt.dcp.StorageReader``: DCP's StorageReader over pyckpt's verified reads.

``read_metadata`` opens the checkpoint (any pyckpt checkpoint, or another format
pyckpt reads) and declares each tensor to DCP as one chunk covering it, so DCP's
planner asks every rank for boxes of whole tensors; ``read_data`` reads each box
through the checkpoint source, which reads only the stored blocks the box touches
and checks every chunk's CRC-32C, straight into the tensors DCP's planner resolves
(one ``format.read_plan.ReadPlan`` per batch, landed by its ``execute`` as
``load(into=)``'s, through ``CheckpointSource.fill``): a contiguous CPU tensor of the
stored dtype in place, a CUDA tensor through pinned bounce buffers and a copy on
its device (no host copy of it); other targets through a buffer copied into them,
as DCP's own reader does, casting to the target's dtype. Bytes entries (DCP's
non-tensor values) are handed to DCP's planner, which unpickles them: pyckpt
never does.
"""

from __future__ import annotations

import io
import os
import uuid
from typing import Any, Callable

import numpy as np
import torch
from torch.distributed.checkpoint import StorageReader as _Base
from torch.distributed.checkpoint.metadata import (BytesStorageMetadata, ChunkStorageMetadata,
                                                   Metadata, StorageMeta, TensorProperties,
                                                   TensorStorageMetadata)
from torch.distributed.checkpoint.planner import LoadItemType, LoadPlan, LoadPlanner
from torch.futures import Future

from ..adapters.torch_support import _tensor, writable
from ..device.array import DeviceArray
from ..format.read_plan import ReadPlan
from ..sources import CheckpointSource, open_source
from ..tree import static_values
from .names import planner_data_of, stored_dtypes

__all__ = ["StorageReader"]

#: host memory for the buffers of boxes that cannot be read in place, per batch
_BATCH_BYTES = 256 << 20


class StorageReader(_Base):
    """Reads the pyckpt checkpoint at ``path`` (a local path or fsspec URL, or a run
    directory: its latest checkpoint) for ``dcp.load``."""

    def __init__(self, path: str | os.PathLike, *, storage_options: dict | None = None) -> None:
        super().__init__()
        self.path = os.fspath(path)
        self.storage_options = storage_options
        self._source: CheckpointSource | None = None
        self._bytes: dict[str, bytes] = {}
        self._types: list[tuple[np.dtype, Any]] = []  # per tensor: numpy and torch dtype
        self._sizes: list[Any] = []  # per tensor: its shape as a torch.Size

    # -- DCP's interface ---------------------------------------------------------------
    def reset(self, checkpoint_id: str | os.PathLike | None = None) -> None:
        if checkpoint_id:
            self.path = os.fspath(checkpoint_id)
        self._source, self._bytes = None, {}

    @classmethod
    def validate_checkpoint_id(cls, checkpoint_id: str | os.PathLike) -> bool:
        return isinstance(checkpoint_id, (str, os.PathLike))

    def read_metadata(self, *args: Any, **kwargs: Any) -> Metadata:
        src = self._open()
        sdm: dict[str, Any] = {}
        origins: dict[int, torch.Size] = {}  # rank -> the zero offsets (a tuple: shared)
        for key, size, (_, tdt) in zip(src.keys, self._sizes, self._types):
            origin = origins.get(len(size))
            if origin is None:
                origin = origins[len(size)] = torch.Size((0,) * len(size))
            sdm[key] = TensorStorageMetadata(properties=TensorProperties(dtype=tdt), size=size,
                                             chunks=[ChunkStorageMetadata(origin, size)])
        for key in self._bytes:
            sdm[key] = BytesStorageMetadata()
        dcp_info = src.info.get("dcp") if isinstance(src.info, dict) else None
        dcp_info = dcp_info if isinstance(dcp_info, dict) else {}
        return Metadata(state_dict_metadata=sdm,
                        planner_data=planner_data_of(dcp_info.get("planner_data")),
                        storage_meta=StorageMeta(checkpoint_id=self.path,
                                                 load_id=uuid.uuid4().hex))

    def set_up_storage_reader(self, metadata: Metadata, is_coordinator: bool, *args: Any,
                              **kwargs: Any) -> None:
        self._open()

    def prepare_local_plan(self, plan: LoadPlan) -> LoadPlan:
        return plan

    def prepare_global_plan(self, plans: list[LoadPlan]) -> list[LoadPlan]:
        return plans

    def read_data(self, plan: LoadPlan, planner: LoadPlanner) -> Future[None]:
        src = self._open()
        batch = _Batch(src, self._types, self._sizes)
        for ri in plan.items:
            if ri.type == LoadItemType.BYTE_IO:
                planner.load_bytes(ri, io.BytesIO(self._bytes[ri.storage_index.fqn]))
                continue
            batch.add(ri, planner.resolve_tensor(ri))
            if batch.held >= _BATCH_BYTES:
                batch.run(planner)
        batch.run(planner)
        fut: Future[None] = Future()
        fut.set_result(None)
        return fut

    # -- helpers -----------------------------------------------------------------------
    def _open(self) -> CheckpointSource:
        if self._source is None:
            src = open_source(self.path, self.storage_options)
            tree = src.tree
            values = static_values(tree) if tree is not None else {}
            self._bytes = {k: v for k, v in values.items() if isinstance(v, bytes)}
            self._types = stored_dtypes(src)
            self._sizes = [torch.Size(src.shape(i)) for i in range(len(self._types))]
            self._source = src
        return self._source


class _Batch:
    """Tensor ReadItems read together: per item its target tensor, the destination
    read into and the box of the stored tensor it holds. A destination is the
    target's own memory wherever the target can be filled in place, as
    ``load(into=)`` fills it (``adapters/torch_support.writable``): a contiguous
    CPU tensor of the stored dtype through a numpy view, a CUDA tensor as a
    DeviceArray (``CheckpointSource.fill`` reads it through pinned bounce buffers
    and copies it on its device: no host copy of it); else a host buffer copied
    into the target afterwards, as DCP's own reader does (casting to the target's
    dtype). ``held``: bytes of those buffers."""

    def __init__(self, src: CheckpointSource, types: list[tuple[np.dtype, Any]],
                 sizes: list[Any]) -> None:
        self.src, self.types, self.sizes = src, types, sizes
        self.held = 0
        self._clear()

    def _clear(self) -> None:
        self.items: list[Any] = []
        self.targets: list[Any] = []
        self.idx: list[int] = []
        self.dsts: list[Any] = []
        self.boxes: list[tuple[int, ...] | None] = []
        self.after: list[Callable[[], None] | None] = []
        self.held = 0

    def add(self, ri: Any, resolved: Any) -> None:
        src = self.src
        i = src.index_of(ri.storage_index.fqn)
        target = resolved.detach() if resolved.requires_grad else resolved
        lengths = ri.lengths
        if target.shape != lengths and tuple(target.shape) != tuple(lengths):
            raise ValueError(f"DCP asked to read a box of shape {tuple(lengths)} of "
                             f"{ri.storage_index.fqn!r} into a tensor of shape "
                             f"{tuple(target.shape)}")
        dtype, tdt = self.types[i]
        dst, after = _in_place(target, dtype, tdt)
        if dst is None:  # read aside, copied into the target once read
            dst = np.empty(tuple(lengths), dtype=dtype)
            after = _copier(target, dst)
            self.held += dst.nbytes
        self.items.append(ri)
        self.targets.append(target)
        self.idx.append(i)
        self.dsts.append(dst)
        self.boxes.append(None if target.shape == self.sizes[i]
                          else tuple(int(o) for o in ri.storage_offsets))
        self.after.append(after)

    def run(self, planner: LoadPlanner) -> None:
        """Reads the batch (in parallel, verified), then hands each tensor to DCP."""
        if not self.items:
            return
        boxes = self.boxes if any(b is not None for b in self.boxes) else None
        ReadPlan(self.src, self.idx, self.dsts, boxes).execute()
        for ri, target, after in zip(self.items, self.targets, self.after):
            if after is not None:
                after()
            planner.commit_tensor(ri, target)
        self._clear()


def _in_place(target: Any, dtype: np.dtype, tdt: Any) -> tuple[Any, Callable[[], None] | None]:
    """(destination, finish) filling ``target`` in place (``writable``: a numpy view
    of a CPU tensor, a DeviceArray of a CUDA one, or a host copy written back by
    finish), or (None, None) when it cannot hold the stored dtype's bytes as they
    are (another dtype, or a non-contiguous CPU view)."""
    if target.dtype != tdt:
        return None, None
    w = writable(target)
    if isinstance(w, DeviceArray):
        return w, None
    if w is not None and w[0].dtype == dtype and w[0].flags.c_contiguous:
        return w
    return None, None


def _copier(target: Any, buf: np.ndarray) -> Callable[[], None]:
    def copy() -> None:
        target.copy_(_tensor(torch, buf, copy=False))
    return copy
