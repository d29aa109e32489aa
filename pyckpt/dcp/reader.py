"""``pyckpt.dcp.StorageReader``: DCP's StorageReader over pyckpt's verified reads.

``read_metadata`` opens the checkpoint (any pyckpt checkpoint, or another format
pyckpt reads) and declares each tensor to DCP as one chunk covering it, so DCP's
planner asks every rank for boxes of whole tensors; ``read_data`` reads each box
through the checkpoint source, which reads only the stored blocks the box touches
and checks every chunk's CRC-32C, straight into the target tensor where it is a
contiguous CPU tensor of the stored dtype (else into a buffer copied into it, as
DCP's own reader does, casting to the target's dtype). Bytes entries (DCP's
non-tensor values) are handed to DCP's planner, which unpickles them: pyckpt
never does.
"""

from __future__ import annotations

import io
import os
import uuid
from typing import Any

import numpy as np
import torch
from torch.distributed.checkpoint import StorageReader as _Base
from torch.distributed.checkpoint.metadata import (BytesStorageMetadata, ChunkStorageMetadata,
                                                   Metadata, StorageMeta, TensorProperties,
                                                   TensorStorageMetadata)
from torch.distributed.checkpoint.planner import LoadItemType, LoadPlan, LoadPlanner
from torch.futures import Future

from ..adapters.torch_support import _tensor, writable
from ..sharded import ShardedArray
from ..sources import CheckpointSource, open_source
from ..tree import static_values
from .names import planner_data_of, torch_dtype_of

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
        for i, key in enumerate(src.keys):
            shape = torch.Size(src.shape(i))
            sdm[key] = TensorStorageMetadata(
                properties=TensorProperties(dtype=torch_dtype_of(src.dtype(i))), size=shape,
                chunks=[ChunkStorageMetadata(offsets=torch.Size([0] * len(shape)), sizes=shape)])
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
        batch: list[_Box] = []
        held = 0
        for ri in plan.items:
            if ri.type == LoadItemType.BYTE_IO:
                planner.load_bytes(ri, io.BytesIO(self._bytes[ri.storage_index.fqn]))
                continue
            box = _Box(src, ri, planner)
            batch.append(box)
            held += 0 if box.in_place else box.array.nbytes
            if held >= _BATCH_BYTES:
                _run(src, batch, planner)
                batch, held = [], 0
        _run(src, batch, planner)
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
            self._source = src
        return self._source


class _Box:
    """One tensor ReadItem: its target tensor and the array read into (the target's
    own memory when it is a contiguous CPU tensor of the stored dtype, else a buffer
    copied into the target afterwards)."""

    __slots__ = ("item", "index", "target", "array", "in_place")

    def __init__(self, src: CheckpointSource, ri: Any, planner: LoadPlanner) -> None:
        self.item = ri
        self.index = i = src.index_of(ri.storage_index.fqn)
        self.target = target = planner.resolve_tensor(ri).detach()
        lengths = tuple(int(n) for n in ri.lengths)
        if tuple(target.shape) != lengths:
            raise ValueError(f"DCP asked to read a box of shape {lengths} of "
                             f"{ri.storage_index.fqn!r} into a tensor of shape "
                             f"{tuple(target.shape)}")
        dtype = src.dtype(i)
        view = None
        if target.device.type == "cpu" and target.is_contiguous() \
                and target.dtype == torch_dtype_of(dtype):
            w = writable(target)
            if isinstance(w, tuple) and w[1] is None and w[0].dtype == dtype:
                view = w[0]
        self.in_place = view is not None
        self.array = view if view is not None else np.empty(lengths, dtype=dtype)

    def destination(self, src: CheckpointSource) -> Any:
        """The read target: the whole array, or the box as a ShardedArray block."""
        shape = src.shape(self.index)
        if self.array.shape == tuple(shape):
            return self.array
        return ShardedArray(self.array, shape, tuple(int(o) for o in self.item.storage_offsets))


def _run(src: CheckpointSource, batch: list[_Box], planner: LoadPlanner) -> None:
    """Reads a batch of boxes (in parallel, verified), then hands each to DCP."""
    if not batch:
        return
    src.read([b.index for b in batch], [b.destination(src) for b in batch])
    for b in batch:
        if not b.in_place:
            b.target.copy_(_tensor(torch, b.array, copy=False))
        planner.commit_tensor(b.item, b.target)
