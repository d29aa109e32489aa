"""Conversions between TensorFlow checkpoints and pyckpt's (``pyckpt cp``), and
``save``: a pyckpt checkpoint, any opened source or a tree of arrays written as
a TensorFlow checkpoint (docs/API.md, "TensorFlow checkpoints").
"""

from __future__ import annotations

import os
import warnings
from typing import Any, Callable

import numpy as np

from ... import saving
from ...format import INDEX_NAME
from ...format.read_plan import ReadPlan
from ...format.source import CheckpointSource
from ...format.values import left_out_warning, text_values
from ...storage import Store, resolve
from ...tree import flatten, path_trie, validate_keys
from ...codecs.tensorflow.bundle import DTYPES, STRING, TensorFlowCheckpoint
from ...codecs.tensorflow.object_graph import OBJECT_GRAPH_KEY
from ...codecs.tensorflow.writer import graph_tensor, tf_dtype_code, update_state, write_bundle
from ...sources import open_source
from ...workers.comm import SingleComm

__all__ = ["save", "to_checkpoint", "from_checkpoint", "open_any", "is_prefix"]

_VALUE_SUFFIX = "/.ATTRIBUTES/VARIABLE_VALUE"


def is_prefix(store: Store, path: str) -> bool:
    """Whether ``path`` is a TensorFlow checkpoint prefix (``<path>.index`` exists
    and ``path`` is not a pyckpt checkpoint)."""
    if not path or path.endswith("/"):
        return False
    return store.exists(path + ".index") and not store.exists(store.join(path, INDEX_NAME))


def open_any(path: Any, storage_options: dict | None = None) -> CheckpointSource:
    """A checkpoint source for a path of any format this module converts (a
    TensorFlow prefix, a ``.safetensors`` file, a pyckpt checkpoint, a run
    directory's latest): ``sources.open_source``."""
    return open_source(path, storage_options)


def _escape(name: str) -> str:
    return name.replace(".", "..").replace("/", ".S")


def _trie(keys: list[str]) -> tuple[dict, list[str]]:
    """An object graph whose paths are the '/'-split keys, and the object-based key
    (``a/b/.ATTRIBUTES/VARIABLE_VALUE``) each key gets in it."""
    parts = [k.split("/") for k in keys]
    edges, ends = path_trie(parts)
    value: list[str | None] = [None] * len(edges)
    new = ["/".join(_escape(p) for p in ps) + _VALUE_SUFFIX for ps in parts]
    for node, k in zip(ends, new):
        value[node] = k
    return {"children": [[[p, c] for p, c in es] for es in edges], "value": value,
            "kind": [""] * len(value)}, new


def _readable(src: CheckpointSource, i: int) -> bool:
    if isinstance(src, TensorFlowCheckpoint):
        code = src.tf_dtypes[i]
        return i not in src.sliced and (code == STRING or code in DTYPES)
    return True


def _from_tree(src: Any) -> tuple:
    """What ``save`` writes of a tree: keys, shapes, dtypes, no graph, its text
    values, and the reader of its arrays."""
    leaves, skeleton = flatten(src, caller="pyckpt.interop.tensorflow.save")
    arrays = []
    for leaf in leaves:
        if not isinstance(leaf.array, np.ndarray):
            raise TypeError(f"{leaf.key!r}: only host arrays can be written to a TensorFlow "
                            "checkpoint (copy device values to the host first)")
        arrays.append(leaf.array)

    def read_values(positions: list[int]) -> list[np.ndarray]:
        return [arrays[i] for i in positions]

    return ([leaf.key for leaf in leaves], [a.shape for a in arrays], [a.dtype for a in arrays],
            None, text_values(skeleton, None), read_values)


def _from_source(source: CheckpointSource, object_graph: bool | None) -> tuple:
    """What ``save`` writes of an opened checkpoint: its readable tensors (warning
    about the others), their graph unless ``object_graph`` is False, its text values,
    and the reader of its tensors."""
    keep = [i for i in range(len(source.keys)) if source.keys[i] != OBJECT_GRAPH_KEY
            and _readable(source, i)]
    skipped = [source.keys[i] for i in range(len(source.keys))
               if source.keys[i] != OBJECT_GRAPH_KEY and not _readable(source, i)]
    if skipped:
        warnings.warn(f"not written (unreadable TensorFlow tensors): {', '.join(skipped)}",
                      stacklevel=3)
    graph = source.graph if object_graph is not False else None
    if graph is not None and skipped:
        graph = dict(graph, value=[v if v not in skipped else None for v in graph["value"]])

    def read_values(positions: list[int]) -> list[np.ndarray]:
        return ReadPlan(source, [keep[i] for i in positions]).execute()

    return ([source.keys[i] for i in keep], [source.shape(i) for i in keep],
            [source.dtype(i) for i in keep], graph, text_values(source.tree, source.graph),
            read_values)


def save(src: Any, prefix: Any, *, object_graph: bool | None = None, state_file: bool = True,
         storage_options: dict | None = None, src_options: dict | None = None,
         progress: Callable[[int, int], Any] | None = None) -> str:
    """Writes a TensorFlow checkpoint at ``prefix`` (``<prefix>.index`` and
    ``<prefix>.data-00000-of-00001``) and returns ``prefix``.

    ``src``: a checkpoint path (pyckpt, TensorFlow or ``.safetensors``), an
    opened CheckpointSource, or a tree (dict / list / tuple of arrays, keys
    ``/``-joined as ``pyckpt.save`` makes them). Keys are kept as they are, and
    an object-based checkpoint's graph is written as TensorFlow's
    ``_CHECKPOINTABLE_OBJECT_GRAPH``, so ``tf.train.Checkpoint(...).restore``
    matches objects as it does for its own checkpoints. ``object_graph``: None
    (default) keeps the source's graph if it has one; True gives a source
    without one the graph of its ``/``-split keys (keys become
    ``a/b/.ATTRIBUTES/VARIABLE_VALUE``, for ``tf.train.Checkpoint(a=...)``);
    False writes a name-based checkpoint (TF1 ``Saver`` style).
    ``state_file``: also name it the latest in the directory's ``checkpoint`` file.
    Tensors TensorFlow cannot hold raise TypeError before anything is written."""
    store, p = resolve(os.fspath(prefix) if isinstance(prefix, os.PathLike) else prefix,
                       storage_options)
    if isinstance(src, (dict, list, tuple)):
        keys, shapes, dtypes, graph, texts, read_values = _from_tree(src)
    else:
        keys, shapes, dtypes, graph, texts, read_values = _from_source(
            open_any(src, src_options), object_graph)
    left_out = left_out_warning(texts, "TensorFlow checkpoint")
    if left_out is not None:
        warnings.warn(left_out, stacklevel=2)
    if graph is None and object_graph:
        graph, keys = _trie(keys)
    tensors = [(k, tf_dtype_code(d, k), tuple(s)) for k, d, s in zip(keys, dtypes, shapes)]
    n_values = len(tensors)
    if graph is not None:
        tensors.append((OBJECT_GRAPH_KEY, STRING, ()))
        blob = graph_tensor(graph)

    def read(positions: list[int]) -> list[np.ndarray]:
        inner = [i for i in positions if i < n_values]
        values = dict(zip(inner, read_values(inner)))
        return [values[i] if i < n_values else blob for i in positions]

    total = sum(int(np.prod(s, dtype=np.int64)) * d.itemsize for s, d in zip(shapes, dtypes))
    write_bundle(store, p, tensors, read, progress, total)
    if state_file:
        head = p.rpartition("/")[0]
        update_state(store, head, p.rpartition("/")[2])
    return os.fspath(prefix)


def from_checkpoint(src: Any, dst: Any, *, src_options: dict | None = None,
                    dst_options: dict | None = None,
                    progress: Callable[[int, int], Any] | None = None) -> None:
    """A checkpoint (pyckpt, safetensors, or an opened source) -> the TensorFlow
    checkpoint prefix ``dst`` (``save``; the directory's state file names it)."""
    save(src, dst, storage_options=dst_options, src_options=src_options, progress=progress)


def _as_fixed(values: np.ndarray) -> np.ndarray:
    """A string tensor (object array of bytes) as fixed-size bytes (``S<n>``)."""
    flat = [bytes(v) for v in values.reshape(-1)]
    if not any(flat):
        return np.zeros(values.shape, dtype="S1")
    return np.array(flat, dtype=bytes).reshape(values.shape)


def to_checkpoint(src: Any, dst: Any, *, src_options: dict | None = None,
                  dst_options: dict | None = None,
                  progress: Callable[[int, int], Any] | None = None) -> None:
    """A TensorFlow checkpoint (a prefix, or an opened TensorFlowCheckpoint) -> a
    pyckpt checkpoint at ``dst``: TensorFlow's keys, its object graph as pyckpt's
    (so ``Checkpoint.restore`` matches the same objects), string tensors as
    fixed-size bytes (``S<n>``: trailing NUL bytes are dropped). Tensors pyckpt
    cannot read (a dataset iterator's variant state, partitioned variables saved
    as slices) are left out with a warning naming them."""
    if not isinstance(src, TensorFlowCheckpoint):
        store, p = resolve(os.fspath(src) if isinstance(src, os.PathLike) else src, src_options)
        src = TensorFlowCheckpoint(store, p)
    keep = [i for i in range(len(src.keys)) if src.keys[i] != OBJECT_GRAPH_KEY and _readable(src, i)]
    skipped = [k for i, k in enumerate(src.keys) if k != OBJECT_GRAPH_KEY and not _readable(src, i)]
    if skipped:
        warnings.warn(f"{src.url}: not converted (pyckpt cannot read them): {', '.join(skipped)}",
                      stacklevel=2)
    graph = src.graph
    if graph is not None and skipped:
        graph = dict(graph, value=[v if v not in skipped else None for v in graph["value"]])
    values = ReadPlan(src, keep).execute()
    items = [(src.keys[i], _as_fixed(v) if src.tf_dtypes[i] == STRING else v)
             for i, v in zip(keep, values)]
    validate_keys([k for k, _ in items])  # a foreign checkpoint's names become stored keys
    saving.write(saving.SavePlan.build([saving.Item(k, v) for k, v in items], dst,
                                       storage_options=dst_options, comm=SingleComm(),
                                       progress=progress, graph=graph))
