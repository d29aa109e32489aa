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
from typing import Any, Callable, Iterable, Iterator, Sequence

import numpy as np

from ..._dtypes import dtype_from_name, dtype_name, little_endian
from ..._native import core as _core
from ... import run_directory
from ...format import tf_state
from ...storage import Store
from ...storage.streamed import earlier_uploads_of, write_stream
from .bundle import data_file_name
from .dtypes import DTYPES, STRING
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


def _checked(tensor: tuple[str, int, tuple[int, ...]], arr: np.ndarray) -> np.ndarray:
    key, _, shape = tensor
    if tuple(np.shape(arr)) != tuple(shape):
        raise ValueError(f"tensor {key!r}: shape {np.shape(arr)} != {shape}")
    return arr


def _dtype_of(code: int) -> np.dtype:
    return np.dtype(dtype_from_name(DTYPES[code]))


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
    run_directory.check_checkpoint_name(name, "checkpoint prefix")

    def join(n: str) -> str:
        return store.join(head, n) if head else n

    index_path = prefix + ".index"
    data_name = data_file_name(name, 0, 1)
    if store.exists(index_path):  # replacing: un-commit the old checkpoint first
        store.remove(head, [index_path])
        store.sync_dir(head or ".")
    elif head:
        store.makedirs(head)
    data = _DataFile(tensors, order, read, progress, total)
    # through the store's guarded write (retries, stall limits, bounded cleanup)
    write_stream(store, join(data_name), data.size, data.chunks,
                 earlier_uploads_of(join(data_name)))
    store.write_atomic(index_path, build_table([(b"", encode_header(1))] + data.entries()))
    stale = [join(e) for e in store.listdir(head or ".")
             if e.startswith(name + ".data-") and "-of-" in e and e != data_name]
    store.remove(head, stale)  # shards of a replaced checkpoint written in more files


class _DataFile:
    """The one data file of a checkpoint being written: where each tensor lies in it
    (``layout``, in key ``order``), and its bytes (``chunks``), the numeric tensors
    read in batches of about BATCH_BYTES as they are produced."""

    def __init__(self, tensors: Sequence[tuple[str, int, tuple[int, ...]]], order: list[int],
                 read: Callable[[list[int]], Iterable[np.ndarray]],
                 progress: Callable[[int, int], Any] | None, total: int) -> None:
        self.tensors, self.order, self.read = tensors, order, read
        self.progress, self.total = progress, total
        # strings first (small: configs, names): their encoded size fixes the file's size
        strings = [i for i in order if tensors[i][1] == STRING]
        self.encoded = {i: _stored(_checked(tensors[i], arr), STRING)
                        for i, arr in zip(strings, read(strings) if strings else [])}
        self.layout: dict[int, tuple[int, int]] = {}  # tensor -> (offset, bytes) in the file
        pos = 0
        for i in order:
            key, code, shape = tensors[i]
            n = (memoryview(self.encoded[i][0]).nbytes if code == STRING else
                 int(np.prod(shape, dtype=np.int64)) * np.dtype(_dtype_of(code)).itemsize)
            pos += -pos % ALIGNMENT if n else 0
            self.layout[i] = (pos, n)
            pos += n
        self.size = pos
        self.crcs: dict[int, int] = {i: crc for i, (_, crc) in self.encoded.items()}

    def _batches(self) -> list[list[int]]:
        """The numeric tensors in key order, cut into batches of about BATCH_BYTES."""
        batches: list[list[int]] = [[]]
        in_batch = 0
        for i in self.order:
            if self.tensors[i][1] == STRING:
                continue
            n = self.layout[i][1]
            if batches[-1] and in_batch + n > BATCH_BYTES:
                batches.append([])
                in_batch = 0
            batches[-1].append(i)
            in_batch += n
        return batches

    def chunks(self) -> Iterator[Any]:
        """The file's bytes, in order (padding included); may be called again (a retry)."""
        at = done = 0
        todo = iter(self._batches())  # numeric tensors, read a batch at a time in key order
        values: dict[int, np.ndarray] = {}
        for i in self.order:
            code = self.tensors[i][1]
            if code == STRING:
                raw = self.encoded[i][0]
            else:
                if i not in values:
                    batch = next(todo)
                    values = dict(zip(batch, self.read(batch)))
                raw, self.crcs[i] = _stored(_checked(self.tensors[i], values.pop(i)), code)
            off, n = self.layout[i]
            if memoryview(raw).nbytes != n:
                raise ValueError(f"tensor {self.tensors[i][0]!r}: {memoryview(raw).nbytes} "
                                 f"bytes, {n} expected from its shape and dtype")
            if off > at:
                yield bytes(off - at)
            if n:
                yield raw
            at = off + n
            done += n
            if self.progress is not None:
                self.progress(done, max(self.total, done))

    def entries(self) -> list[tuple[bytes, bytes]]:
        """The index entries of the tensors, in key order (once ``chunks`` ran)."""
        return [(self.tensors[i][0].encode("utf-8"),
                 encode_entry(self.tensors[i][1], tuple(self.tensors[i][2]), 0,
                              self.layout[i][0], self.layout[i][1], self.crcs[i]))
                for i in self.order]


def update_state(store: Store, directory: str, name: str, clock: Callable[[], float] = time.time) -> None:
    """Names checkpoint ``name`` (directly in directory) the latest in TensorFlow's
    ``checkpoint`` state file, keeping the others it lists (relative names, as
    ``tf.train.CheckpointManager`` writes them)."""
    old = run_directory.read_tensorflow_state(store, directory)
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
