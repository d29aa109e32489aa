"""``pyckpt.dcp.StorageWriter``: DCP's StorageWriter over pyckpt's writers and commit.

DCP's call sequence, and what each step does here (docs/PROTOCOL.md section 8):

 - ``reset`` / ``set_up_storage_writer`` (every rank): the path, the role;
 - ``prepare_global_plan`` (coordinator): starts the attempt (its marker, before
   any data) and hands every rank the attempt id and its rank inside its plan;
 - ``write_data`` (every rank): its items into its own shard files, each chunk
   checksummed (the C++ writers, GIL released; ``planned_save.write_blocks``): CPU
   tensors are written from their own memory; CUDA tensors are copied into the
   pinned staging buffers of every save of device values, and into local files
   the writers start on each as soon as its copy landed (``StagedWrite``, as
   ``pyckpt.save``); the results say where each block landed, and carry the
   bytes of the non-tensor items;
 - ``finish`` (coordinator, once every rank succeeded): the index, last.

Writing and committing each take the rank's turn among the saves to the same
place (``ordering.py``): each waits for every save to that place called before.
They are two turns, not one held from ``write_data`` to ``finish``: DCP calls
``finish`` on the coordinator only, and not at all once a rank failed (it raises
instead), so a turn held across the two calls would stay open after a failed
save until the writer is reset or collected, and every later save to the place
would wait for it. What that costs: a save to the same place called (in another
thread) while this one writes may commit between this save's writes and its
commit, and is then replaced by this one.

No progress is reported: DCP's StorageWriter has no progress channel, and
``dcp.save`` takes no ``progress=`` as ``pyckpt.save`` does.
"""

from __future__ import annotations

import base64
import dataclasses
import io
import os
import weakref
from typing import Any

import numpy as np
from torch.distributed.checkpoint import StorageWriter as _Base
from torch.distributed.checkpoint.metadata import BytesStorageMetadata, Metadata, StorageMeta
from torch.distributed.checkpoint.planner import SavePlan, SavePlanner, WriteItemType
from torch.distributed.checkpoint.storage import WriteResult
from torch.futures import Future

from .. import ordering
from ..adapters.torch_support import to_numpy
from ..device.array import DeviceArray
from ..storage import resolve
from ..workers import planned_save
from ..workers.planned_save import PlannedTensor, StoredBlock
from .names import host_dtype_name, json_planner_data

__all__ = ["StorageWriter"]


@dataclasses.dataclass(frozen=True)
class _Part:
    """What the coordinator tells each rank in its plan: the attempt and its rank."""
    attempt: str
    rank: int


@dataclasses.dataclass(frozen=True)
class _Bytes:
    """A non-tensor item's bytes, carried to the coordinator in its WriteResult."""
    data: bytes


def _live_block(item: Any, value: Any) -> np.ndarray | DeviceArray:
    """The value of one tensor item as a save sees it (``to_numpy``, the torch leaf
    hook): a numpy view of a CPU tensor (made contiguous first), a DeviceArray of a
    CUDA tensor (staged through pinned buffers by ``write_blocks``, not copied here)."""
    t = value.detach() if value.requires_grad else value
    want = item.tensor_data.chunk.sizes
    if t.shape != want and tuple(t.shape) != tuple(want):
        raise ValueError(f"DCP item {item.index.fqn!r} at {tuple(item.index.offset or ())}: the "
                         f"planner resolved a tensor of shape {tuple(t.shape)}, its plan says "
                         f"{tuple(want)}")
    if t.is_cpu and not t.is_contiguous():
        t = t.contiguous()
    arr = to_numpy(t)
    assert arr is not None  # a tensor
    return arr


class StorageWriter(_Base):
    """Writes a DCP save as a pyckpt checkpoint at ``path`` (a local path or fsspec URL;
    ``storage_options`` go to fsspec). A checkpoint already at ``path`` is replaced
    atomically when the new one commits."""

    def __init__(self, path: str | os.PathLike, *, storage_options: dict | None = None) -> None:
        super().__init__()
        self.path = os.fspath(path)
        self.storage_options = storage_options
        self._coordinator = False
        self._attempt: planned_save.Attempt | None = None
        self._release: Any = None
        self._rank = 0  # this rank's place in the order of saves (ordering.py)

    # -- DCP's interface ---------------------------------------------------------------
    def reset(self, checkpoint_id: str | os.PathLike | None = None) -> None:
        if checkpoint_id:
            self.path = os.fspath(checkpoint_id)
        self._give_up()

    def set_up_storage_writer(self, is_coordinator: bool, *args: Any, **kwargs: Any) -> None:
        if kwargs.get("use_collectives", True) is False:
            raise ValueError("pyckpt.dcp.StorageWriter writes one checkpoint per save, committed "
                             "by the coordinator: it needs DCP's collectives (use_collectives=True)")
        self._coordinator = is_coordinator

    def storage_meta(self) -> StorageMeta | None:
        return StorageMeta(checkpoint_id=self.path)

    @classmethod
    def validate_checkpoint_id(cls, checkpoint_id: str | os.PathLike) -> bool:
        return isinstance(checkpoint_id, (str, os.PathLike))

    def prepare_local_plan(self, plan: SavePlan) -> SavePlan:
        return plan

    def prepare_global_plan(self, plans: list[SavePlan]) -> list[SavePlan]:
        self._give_up()
        store, p = resolve(self.path, self.storage_options)
        attempt = planned_save.begin(store, p)
        self._attempt = attempt
        # a save that fails on some rank never reaches finish(): ending the attempt
        # with this writer (or the next reset) lets the next commit sweep its files
        self._release = weakref.finalize(self, attempt.end)
        return [dataclasses.replace(plan, storage_data=_Part(attempt.id, i))
                for i, plan in enumerate(plans)]

    def write_data(self, plan: SavePlan, planner: SavePlanner) -> Future[list[WriteResult]]:
        part = plan.storage_data
        if not isinstance(part, _Part):
            raise RuntimeError("pyckpt.dcp.StorageWriter: the plan carries no pyckpt attempt "
                               "(prepare_global_plan of this writer class did not run)")
        store, p = resolve(self.path, self.storage_options)
        self._rank = part.rank
        tensors, blocks, results = [], [], []
        byte_io = WriteItemType.BYTE_IO
        for item in plan.items:
            data = planner.resolve_data(item)
            if item.type == byte_io:
                raw = data.getvalue() if isinstance(data, io.BytesIO) else bytes(data)
                results.append(WriteResult(item.index, len(raw), _Bytes(raw)))
            else:
                tensors.append(item)
                blocks.append((item.index.fqn, _live_block(item, data),
                               item.tensor_data.chunk.offsets))
        # this rank's writes wait for its earlier saves to the same place (ordering.py)
        with ordering.take(ordering.place(store, p, part.rank), blocking=True).held():
            stored = planned_save.write_blocks(store, p, part.attempt, part.rank, blocks)
        results += [WriteResult(item.index, b.nbytes, b) for item, b in zip(tensors, stored)]
        fut: Future[list[WriteResult]] = Future()
        fut.set_result(results)
        return fut

    def finish(self, metadata: Metadata, results: list[list[WriteResult]]) -> None:
        if self._attempt is None:
            raise RuntimeError("pyckpt.dcp.StorageWriter.finish without a started save")
        store, p = resolve(self.path, self.storage_options)
        attempt, self._attempt = self._attempt, None
        if self._release is not None:
            self._release.detach()
        tensors, tree = _layout(metadata, [r for rs in results for r in rs])
        extra = {"dcp": {"version": metadata.version,
                         "planner_data": json_planner_data(metadata.planner_data)}}
        # the commit in its turn too: an earlier save to this place commits first
        with ordering.take(ordering.place(store, p, self._rank), blocking=True).held():
            planned_save.commit_blocks(store, p, attempt, tensors, world_size=len(results),
                                       tree={"d": tree}, extra_info=extra)

    # -- helpers -----------------------------------------------------------------------
    def _give_up(self) -> None:
        """Ends an attempt that never reached finish() (a failed save)."""
        if self._release is not None:
            self._release()
            self._release = None
        self._attempt = None


def _layout(metadata: Metadata, results: list[WriteResult]) -> tuple[list[PlannedTensor], list]:
    """The checkpoint's tensors (blocks from the results) and its tree entries, in
    DCP's metadata order; a key DCP declared but no rank wrote is an error."""
    by_key: dict[str, list] = {}
    for r in results:
        got = by_key.get(r.index.fqn)
        if got is None:
            by_key[r.index.fqn] = [r.storage_data]
        else:
            got.append(r.storage_data)
    tensors, tree = [], []
    for key, md in metadata.state_dict_metadata.items():
        got = by_key.pop(key, [])
        if type(md) is BytesStorageMetadata or isinstance(md, BytesStorageMetadata):
            if len(got) != 1 or not isinstance(got[0], _Bytes):
                raise ValueError(f"DCP entry {key!r}: expected one bytes item, the ranks "
                                 f"wrote {len(got)}")
            tree.append([key, {"b": base64.b64encode(got[0].data).decode("ascii")}])
            continue
        for b in got:
            if type(b) is not StoredBlock:
                raise ValueError(f"DCP tensor {key!r}: a rank wrote it as bytes")
        dtype = host_dtype_name(md.properties.dtype)
        tensors.append(PlannedTensor(key, dtype, tuple(md.size), got))
        tree.append([key, {"s": key, "as": "torch"}])
    if by_key:
        raise ValueError(f"DCP wrote items its metadata does not declare: {sorted(by_key)[:5]}")
    return tensors, tree
