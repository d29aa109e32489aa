"""Writing TensorFlow checkpoints (docs/TF_FORMAT.md): one data file
``<prefix>.data-00000-of-00001``, the ``<prefix>.index`` table, and
optionally TensorFlow's ``checkpoint`` state file naming the new checkpoint
as the latest. TensorFlow's ``tf.train.load_checkpoint`` and
``tf.train.Checkpoint.restore`` read the result.

Commit order, as pyckpt's own writer: a checkpoint being replaced is
un-committed first (its index deleted), the data file is written whole and
durably, then the index (TensorFlow's commit record) atomically, then the
state file. A failure at any point leaves no index that names missing bytes.
"""

from __future__ import annotations

import time
from typing import Any, Callable, Iterable, Sequence

import numpy as np

from ..._dtypes import dtype_name, little_endian
from ..._native import core as _core
from ...engine import run
from ...format import tf_state
from ...storage import Store
from .bundle import DTYPES, STRING, data_file_name
from .messages import encode_entry, encode_header, encode_object_graph
from .object_graph import OBJECT_GRAPH_KEY, from_pyckpt_graph
from .strings import encode_strings
from .table import build_table

__all__ = ["TF_CODES", "tf_dtype_code", "write_bundle", "update_state", "graph_tensor",
           "ALIGNMENT", "BATCH_BYTES"]

#: pyckpt dtype name -> TensorFlow DataType (quantized types are not written)
TF_CODES: dict[str, int] = {name: code for code, name in DTYPES.items()
                            if code not in (11, 12, 13, 15, 16)}
ALIGNMENT = 64            # tensors start at multiples of this in the data file
BATCH_BYTES = 256 << 20   # a conversion reads its source in batches of about this size


def tf_dtype_code(dtype: np.dtype, key: str) -> int:
    """TensorFlow's DataType for a numpy dtype (bytes, str and object arrays are
    strings); TypeError naming the key for dtypes TensorFlow has no type for."""
    if dtype.kind in "SUO":
        return STRING
    try:
        return TF_CODES[dtype_name(dtype)]
    except (KeyError, TypeError):
        raise TypeError(f"tensor {key!r}: TensorFlow has no dtype for {dtype}") from None


def graph_tensor(graph: dict) -> np.ndarray:
    """A pyckpt object graph as the scalar string tensor ``_CHECKPOINTABLE_OBJECT_GRAPH``."""
    nodes, has_values = from_pyckpt_graph(graph)
    out = np.empty((), dtype=object)
    out[()] = encode_object_graph(nodes, has_values)
    return out


def _stored(arr: np.ndarray, code: int) -> tuple[Any, int]:
    """The bytes of one tensor as TensorFlow stores them, and their masked CRC-32C."""
    if code == STRING:
        return encode_strings(np.asarray(arr, dtype=object))
    a = little_endian(np.ascontiguousarray(arr))
    raw = a.reshape(-1).view(np.uint8) if a.size else np.zeros(0, np.uint8)
    return raw, _core.crc32c_mask(_core.crc32c(raw.data))


def write_bundle(store: Store, prefix: str,
                 tensors: Sequence[tuple[str, int, tuple[int, ...]]],
                 read: Callable[[list[int]], Iterable[np.ndarray]],
                 progress: Callable[[int, int], Any] | None = None, total: int = 0) -> None:
    """Writes the checkpoint ``prefix``: ``tensors`` are (key, TensorFlow dtype,
    shape); ``read(positions)`` returns the values of those tensors (called in
    batches of about BATCH_BYTES, in key order)."""
    order = sorted(range(len(tensors)), key=lambda i: tensors[i][0].encode("utf-8"))
    for a, b in zip(order, order[1:]):
        if tensors[a][0] == tensors[b][0]:
            raise ValueError(f"two tensors share the key {tensors[a][0]!r}")
    head, _, name = prefix.rpartition("/")
    run.check_checkpoint_name(name, "checkpoint prefix")

    def join(n: str) -> str:
        return store.join(head, n) if head else n

    index_path = prefix + ".index"
    data_name = data_file_name(name, 0, 1)
    if store.exists(index_path):  # replacing: un-commit the old checkpoint first
        store.delete([index_path])
        store.sync_dir(head or ".")
    elif head:
        store.makedirs(head)
    entries: list[tuple[bytes, bytes]] = []
    pos = done = 0
    batches: list[list[int]] = [[]]
    size = 0
    for i in order:
        n = int(np.prod(tensors[i][2], dtype=np.int64)) if tensors[i][2] else 1
        if batches[-1] and size + n > BATCH_BYTES:
            batches.append([])
            size = 0
        batches[-1].append(i)
        size += n
    with store.open_write(join(data_name)) as f:
        for batch in batches:
            for i, arr in zip(batch, read(batch) if batch else []):
                key, code, shape = tensors[i]
                if tuple(np.shape(arr)) != tuple(shape):
                    raise ValueError(f"tensor {key!r}: shape {np.shape(arr)} != {shape}")
                raw, crc = _stored(arr, code)
                n = memoryview(raw).nbytes
                pad = -pos % ALIGNMENT if n else 0
                if pad:
                    f.write(bytes(pad))
                    pos += pad
                entries.append((key.encode("utf-8"), encode_entry(code, tuple(shape), 0, pos, n, crc)))
                if n:
                    f.write(raw)
                pos += n
                done += n
                if progress is not None:
                    progress(done, max(total, done))
    store.write_atomic(index_path, build_table([(b"", encode_header(1))] + entries))
    stale = [join(e) for e in store.listdir(head or ".")
             if e.startswith(name + ".data-") and "-of-" in e and e != data_name]
    store.delete(stale)  # shards of a replaced checkpoint written in more files


def update_state(store: Store, directory: str, name: str, clock: Callable[[], float] = time.time) -> None:
    """Names checkpoint ``name`` (directly in directory) the latest in TensorFlow's
    ``checkpoint`` state file, keeping the others it lists (relative names, as
    ``tf.train.CheckpointManager`` writes them)."""
    old = run.read_tensorflow_state(store, directory)
    state = tf_state.TFState()
    now = clock()
    if old is not None:
        stamps = old.all_model_checkpoint_timestamps
        keep_stamps = len(stamps) == len(old.all_model_checkpoint_paths)
        for k, p in enumerate(old.all_model_checkpoint_paths):
            if tf_state.checkpoint_name(p) != name:
                state.all_model_checkpoint_paths.append(p)
                if keep_stamps:
                    state.all_model_checkpoint_timestamps.append(stamps[k])
        if not keep_stamps:
            state.all_model_checkpoint_timestamps = []
        state.last_preserved_timestamp = old.last_preserved_timestamp
    state.model_checkpoint_path = name
    state.all_model_checkpoint_paths.append(name)
    if state.all_model_checkpoint_timestamps or old is None:
        state.all_model_checkpoint_timestamps.append(now)
    if state.last_preserved_timestamp is None:
        # before the first checkpoint: TensorFlow's manager keeps tracking (for
        # retention) only the checkpoints saved after this time
        state.last_preserved_timestamp = now - 1.0
    store.write_atomic(store.join(directory, tf_state.STATE_NAME) if directory
                       else tf_state.STATE_NAME, tf_state.format_state(state))


__all__ += ["OBJECT_GRAPH_KEY"]
