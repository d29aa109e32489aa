"""The one save path. ``pyckpt.save``, ``Checkpoint.write``/``save`` and
``CheckpointManager.save`` all end here (docs/ARCHITECTURE.md, "Walk of a save").

``write`` resolves the store and the communicator, reports progress, and picks
single-process (engine/writer.py) or multi-worker (dist/save.py) saving.
``stage`` is the background variant: it copies the values aside and returns the
work that writes them. ``numbered`` bumps a save counter and gives the number
back if the save fails.
"""

from __future__ import annotations

import contextlib
from typing import Any, Callable, Iterator, Sequence

import numpy as np

from . import progress as _progress
from ._native import core as _core
from .dist.comm import Communicator, SingleComm, resolve_comm
from .dist.save import distributed_save
from .engine.writer import StagedSave, save_tensors
from .sharded import ShardedArray
from .storage import Store, resolve
from .variables import Variable

__all__ = ["Item", "write", "stage", "numbered"]


class Item:
    """One value to save: its key, the host array written by a single process,
    and the object a multi-worker save plans with (a ShardedArray block, or the
    array itself)."""

    __slots__ = ("key", "array", "obj")

    def __init__(self, key: str, array: np.ndarray, obj: Any = None) -> None:
        self.key, self.array = key, array
        self.obj = array if obj is None else obj


def write(items: Sequence[Item], path: Any, *, storage_options: dict | None = None,
          comm: Communicator | None = None,
          progress: Callable[[int, int], Any] | None = None, tree: Any = None,
          graph: dict | None = None, metadata: dict | None = None) -> None:
    """Writes and commits one checkpoint at ``path`` (returns once it is durable,
    on every worker)."""
    store, p = resolve(path, storage_options)
    comm = resolve_comm(comm)
    sharded = any(isinstance(it.obj, ShardedArray) for it in items)
    if comm is None and sharded:
        comm = SingleComm()  # blocks must be checked and assembled like a multi-worker save
    with _progress.reporting(progress, sum(it.array.nbytes for it in items)):
        if comm is not None and (comm.world_size > 1 or sharded):
            distributed_save(comm, store, p, [(it.key, it.obj if isinstance(it.obj, ShardedArray)
                                                else it.array) for it in items],
                             tree=tree, graph=graph, metadata=metadata)
        else:
            save_tensors(store, p, [(it.key, it.array) for it in items], tree=tree, graph=graph,
                         metadata=metadata, keys_checked=True)


def stage(store: Store, path: str, keys: list[str], live: list[np.ndarray],
          staging: list[np.ndarray], *, graph: dict | None) -> Callable[[], Any]:
    """Background saves: copies ``live`` into ``staging`` (arrays of the same shapes
    and dtypes, reused across saves) and returns, once the live values may change
    again, the work that writes and commits the checkpoint from the copies. Where the
    store can write local files, writing starts while the copy runs."""
    native = all(a.dtype.byteorder in "=<|" for a in live)
    if native and store.native_path(path) is not None:  # the C++ core writes the files
        staged = StagedSave(store, path, keys, live, staging, graph=graph, metadata=None)
        staged.stage()
        return staged.finish
    _core.copy_arrays(list(live), list(staging), 0)
    return lambda: save_tensors(store, path, list(zip(keys, staging)), graph=graph,
                                keys_checked=True)


@contextlib.contextmanager
def numbered(counter: Variable) -> Iterator[int]:
    """Increments a save counter for one save and gives the number back if the
    save fails (a failed save does not use up a number)."""
    counter.assign_add(1)
    try:
        yield int(counter)
    except BaseException:
        counter.assign_sub(1)
        raise
