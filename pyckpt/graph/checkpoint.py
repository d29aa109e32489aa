"""``pyckpt.Checkpoint``: the root of an object-based checkpoint (docs/API.md section 2)."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any, Callable

import numpy as np

from .. import saving
from ..sources import open_source
from ..tree import describe_value
from ..variables import Variable
from .keys import SAVE_COUNTER, SAVE_COUNTER_KEY, unescape
from .nodes import is_node
from .object_graph import MISSING, get_child, traverse
from .stateful import is_python_value
from .plan import make_plan
from .restore import LoadStatus, RestoreSession
from .sources import SnapshotSource, StoredValues
from .snapshot import Snapshot, take_snapshot
from .trackable import Trackable

if TYPE_CHECKING:  # for signatures only
    from ..workers.comm import Communicator


def untrackable(name: str, value: Any) -> TypeError:
    """The error for a Checkpoint attribute whose value pyckpt cannot save."""
    head = f"Checkpoint attribute {name!r}: pyckpt cannot save {describe_value(value)}"
    if value is None:
        return TypeError(f"{head}: leave the argument out (None holds no state)")
    if is_python_value(value) and not isinstance(value, (str, bytes, bytearray)):
        return TypeError(f"{head} here: a number given directly cannot be restored into the "
                         f"caller's variable. Wrap it in a Variable ({name}=pyckpt.Variable("
                         f"{value!r})) or put it in a dict ({name}={{'value': {value!r}}}), "
                         "whose entries restore")
    if is_python_value(value):
        return TypeError(f"{head} here: put it in a dict ({name}={{'value': ...}}), whose "
                         "entries restore, or in the save's metadata")
    return TypeError(f"{head}: it holds no state pyckpt knows. pyckpt saves arrays, Variables, "
                     "Trackables, torch modules and optimizers, objects with state_dict() and "
                     "load_state_dict() methods (torch schedulers, samplers, your own "
                     "iterators), random generators (pyckpt.GlobalRNG() for the global ones), "
                     "and lists and dicts of those: give the object state_dict() and "
                     "load_state_dict(), or wrap its arrays in pyckpt.Variable")


def graph_child(graph: Any, node: int, name: str) -> int | None:
    """The stored node reached from ``node`` by the edge ``name``, if any."""
    for edge, child in graph.edges[node]:
        if edge == name:
            return int(child)
    return None


class Checkpoint(Trackable):
    """Groups trackable objects under named edges and saves/restores them.

    ``Checkpoint(model=net, optimizer=opt)``; later attribute assignment adds
    edges too. ``save`` numbers checkpoints with a lazily created
    ``save_counter``; ``write``/``read`` leave it alone. A value pyckpt cannot
    save (a bare number or string, an object without state) raises TypeError
    (docs/API.md section 11).
    """

    def __init__(self, **objects: Any) -> None:
        for name, value in objects.items():
            if name == SAVE_COUNTER:
                raise ValueError("'save_counter' is reserved for the checkpoint's own counter")
            setattr(self, name, value)

    def __setattr__(self, name: str, value: Any) -> None:
        if not name.startswith("_") and not is_node(value):
            raise untrackable(name, value)
        super().__setattr__(name, value)

    # -- save counter ------------------------------------------------------------------
    def _maybe_create_save_counter(self) -> Variable:
        counter = self.__dict__.get("_save_counter")
        if counter is None:
            counter = Variable(np.int64(0), name=SAVE_COUNTER, trainable=False)
            object.__setattr__(self, "_save_counter", counter)
        return counter

    @property
    def save_counter(self) -> Variable:
        """Number of ``save`` calls so far (created on first use, as in TensorFlow)."""
        return self._maybe_create_save_counter()

    def _pyckpt_children(self) -> list[tuple[str, Any]]:
        out = super()._pyckpt_children()
        counter = self.__dict__.get("_save_counter")
        if counter is not None:
            out.append((SAVE_COUNTER, counter))
        return out

    def _pyckpt_get_child(self, name: str) -> Any:
        if name == SAVE_COUNTER:
            counter = self.__dict__.get("_save_counter")
            return MISSING if counter is None else counter
        return super()._pyckpt_get_child(name)

    # -- writing -----------------------------------------------------------------------
    def save(self, file_prefix: Any, *, storage_options: dict | None = None,
             metadata: dict | None = None, comm: Communicator | None = None,
             progress: Callable[[int, int], Any] | None = None) -> str:
        """Increments ``save_counter`` and writes to ``f"{file_prefix}-{save_counter}"``."""
        with saving.numbered(self._maybe_create_save_counter()) as number:
            return self.write(f"{os.fspath(file_prefix)}-{number}",
                              storage_options=storage_options, metadata=metadata, comm=comm,
                              progress=progress)

    def write(self, path: Any, *, storage_options: dict | None = None,
              metadata: dict | None = None, comm: Communicator | None = None,
              progress: Callable[[int, int], Any] | None = None) -> str:
        """Writes every tracked value and the object graph exactly at ``path``.
        ``progress(bytes_done, bytes_total)`` reports this worker's writing."""
        saving.write(graph_plan(self, path, storage_options=storage_options, comm=comm,
                                progress=progress, metadata=metadata))
        return os.fspath(path)

    # -- reading -----------------------------------------------------------------------
    def _source(self, save_path: Any, storage_options: dict | None) -> Any:
        if isinstance(save_path, Snapshot):
            return SnapshotSource(save_path)
        return StoredValues(open_source(save_path, storage_options))

    def restore(self, save_path: Any, *, storage_options: dict | None = None,
                prefix_map: dict[str, str] | None = None) -> LoadStatus:
        """Restores every matching value (and the save counter); values whose objects
        do not exist yet are restored when they are created. ``None`` restores nothing.

        ``prefix_map`` ({checkpoint key prefix: object key prefix}, as suggested by
        ``restore_plan``) restores only those subtrees, each into the object at the
        other path: e.g. ``{"model/": "net/encoder/"}``."""
        if save_path is None:
            return LoadStatus(None, "restore(None): no checkpoint was given, nothing restored")
        source = self._source(save_path, storage_options)
        counter = self._maybe_create_save_counter()
        # A checkpoint written by write() has no counter: then the counter is not
        # reported as an unmatched object (use read() to leave it alone entirely).
        has_counter = SAVE_COUNTER_KEY in source.graph.value
        session = RestoreSession(source, self, exclude_objects=() if has_counter else (counter,))
        if prefix_map or not isinstance(save_path, Snapshot) or not session.restore_kept():
            self._run(session, prefix_map)  # (restore_kept: a snapshot through a kept walk)
        return LoadStatus(session)

    def _run(self, session: RestoreSession, prefix_map: dict[str, str] | None) -> None:
        if not prefix_map:
            session.restore_subtree(self, 0)
            return
        graph = session.graph
        counter = graph_child(graph, 0, SAVE_COUNTER)
        if counter is not None and SAVE_COUNTER_KEY not in session.exclude_keys:
            live = self.__dict__.get("_save_counter")
            if live is not None and id(live) not in session.exclude_objects:
                session.restore_subtree(live, counter)
        for src, dst in prefix_map.items():
            node: int | None = 0
            for part in (p for p in src.split("/") if p):
                node = graph_child(graph, node, unescape(part)) if node is not None else None
            if node is None:
                raise KeyError(f"prefix_map: no {src!r} in the checkpoint's object graph")
            obj: Any = self
            for part in (p for p in dst.split("/") if p):
                obj = get_child(obj, unescape(part))
                if obj is MISSING:
                    raise KeyError(f"prefix_map: no object at {dst!r}")
            session.restore_subtree(obj, node)

    def read(self, save_path: Any, *, storage_options: dict | None = None,
             prefix_map: dict[str, str] | None = None) -> LoadStatus:
        """Like restore, but neither creates nor restores ``save_counter``."""
        if save_path is None:
            return LoadStatus(None, "read(None): no checkpoint was given, nothing restored")
        source = self._source(save_path, storage_options)
        counter = self.__dict__.get("_save_counter")
        session = RestoreSession(source, self,
                                 exclude_objects=(counter,) if counter is not None else (),
                                 exclude_keys=(SAVE_COUNTER_KEY,))
        self._run(session, prefix_map)
        return LoadStatus(session)

    def restore_plan(self, save_path: Any, *, storage_options: dict | None = None) -> Any:
        """A dry run of ``restore``: what would match, what would not, what conflicts.
        The save counter is planned as ``restore`` treats it (without creating it)."""
        source = self._source(save_path, storage_options)
        has_counter = SAVE_COUNTER_KEY in source.graph.value
        counter = self.__dict__.get("_save_counter")
        if counter is None:  # restore creates it and fills it from the checkpoint's
            return make_plan(source, self, exclude_keys=(SAVE_COUNTER_KEY,) if has_counter
                             else ())
        return make_plan(source, self, exclude_objects=() if has_counter else (counter,))

    def snapshot(self, into: Snapshot | None = None, *, host: bool = False) -> Snapshot:
        """An in-memory copy of every tracked value, made in parallel.

        ``restore(snapshot)`` puts it back. With ``into`` (an earlier snapshot of
        the same structure) its buffers are reused instead of allocating new ones.

        Values in device memory (CUDA tensors, also inside torch modules and
        optimizers) are copied on their device into buffers of the same device,
        queued in order with the caller's work: nothing crosses PCIe, and
        ``restore(snapshot)`` copies them back on the device. ``host=True`` keeps
        those copies in page-locked host memory instead (to spare device memory),
        waiting until they landed. ``snapshot[key]`` of a device copy is the
        framework's object (the torch tensor), to be read, not written."""
        return take_snapshot(self, into, host=host)

    def __repr__(self) -> str:
        names = [n for n, _ in self._pyckpt_children()]
        return f"<pyckpt.Checkpoint {names}>"


def graph_items(root: Any) -> tuple[list[saving.Item], dict]:
    """The values tracked from ``root`` as ``saving.Item`` s, and the object graph (the
    JSON the index records)."""
    live = traverse(root)
    items = [saving.Item(key, live.array_of(n), live.objects[n])
             for key, n in zip(live.value_keys(), live.values)]
    return items, live.to_json()


def graph_plan(root: Any, path: Any, **options: Any) -> saving.SavePlan:
    """The plan of a save of every value tracked from ``root`` and the object graph at
    ``path`` (``Checkpoint.write``, a manager's saves; ``options``: those of
    ``saving.SavePlan.build``)."""
    items, graph = graph_items(root)
    return saving.SavePlan.build(items, path, graph=graph, **options)
