"""Opening a path as a checkpoint source: the one way in for every read
(``load``, ``load_checkpoint``, ``Checkpoint.restore``, the CLI).

A run directory is resolved to its latest checkpoint first (``run_directory.latest``:
pyckpt's or TensorFlow's, by the directory's state), so that formats only ever
see checkpoint paths. Then a format registers a detector and an opener;
``open_source`` asks the registered formats in order and falls back to pyckpt's
own format. Formats implement ``pyckpt.format.source.CheckpointSource``::

    register_format("safetensors", detect=..., open=...)

``detect(store, path)`` must be cheap (a name test or one small read) and must
not raise for paths of other formats.

A directory holding pyckpt's index and DCP's ``.metadata`` (DCP's own writer saved
into a pyckpt checkpoint's directory, or pyckpt into DCP's) is read as the one
whose commit record was written last, with a warning (``_dcp_saved_later``).
"""

from __future__ import annotations

import datetime
import os
import warnings
from typing import Any, Callable, NamedTuple

from . import run_directory
from .engine.options import DEFAULT, IOOptions
from .engine.reader import OpenCheckpoint
from .errors import CheckpointError, CorruptCheckpointError, add_note
from .format import INDEX_NAME
from .format.source import CheckpointSource
from .codecs import distcp, hf_folder, safetensors, tensorflow
from .storage import Store, resolve

__all__ = ["CheckpointSource", "open_source", "register_format", "checkpoint_path"]


class _Format(NamedTuple):
    name: str
    detect: Callable[[Store, str], bool]
    open: Callable[[Store, str], CheckpointSource]


_FORMATS: list[_Format] = []


def register_format(name: str, detect: Callable[[Store, str], bool],
                    open: Callable[[Store, str], CheckpointSource]) -> None:
    """Adds a checkpoint format that ``open_source`` recognises (replacing one of
    the same name). pyckpt's own format needs no registration: it is the default."""
    _FORMATS[:] = [f for f in _FORMATS if f.name != name]
    _FORMATS.append(_Format(name, detect, open))


def open_source(path: Any, storage_options: dict | None = None,
                options: IOOptions = DEFAULT) -> CheckpointSource:
    """The checkpoint at ``path`` (a local path or fsspec URL; a directory resolves
    to its latest checkpoint), opened and validated, whatever its format."""
    if isinstance(path, CheckpointSource):
        return path
    plain = os.fspath(path) if isinstance(path, os.PathLike) else path
    store, p = resolve(plain, storage_options)
    own = OpenCheckpoint.at(store, p, options)  # the common case: its index, one probe more
    if own is None:
        p = checkpoint_path(store, p)
        for fmt in _FORMATS:
            if fmt.detect(store, p):
                return fmt.open(store, p)
        own = OpenCheckpoint.open(store, p, options)
    if not _dcp_saved_later(own):
        return own
    try:
        return distcp.DCPCheckpoint(own.store, own.path)
    except CheckpointError as e:
        add_note(e, f"{own.url} also holds pyckpt's checkpoint, committed before this "
                    f"{distcp.METADATA_NAME} was written: remove {distcp.METADATA_NAME} to read it")
        raise


def _dcp_saved_later(own: OpenCheckpoint) -> bool:
    """Whether DCP's own writer committed a checkpoint in pyckpt checkpoint ``own``'s
    directory after pyckpt did (the directory holds DCP's ``.metadata`` beside pyckpt's
    index; docs/API.md section 17): the commit record written last is read, with a
    warning naming both. Costs one existence check when there is no ``.metadata``;
    raises CorruptCheckpointError when the two cannot be told apart (a store without
    modification times, or equal ones)."""
    store, path = own.store, own.path
    meta = store.join(path, distcp.METADATA_NAME)
    if not store.exists(meta):
        return False
    index = store.join(path, INDEX_NAME)
    own_t, dcp_t = store.mtime(index), store.mtime(meta)
    own_name = f"pyckpt's index {store.url(index)} ({_when(own_t)})"
    dcp_name = f"torch.distributed.checkpoint's {store.url(meta)} ({_when(dcp_t)})"
    both = f"{store.url(path)} holds two checkpoints: {own_name} and {dcp_name}"
    if own_t is None or dcp_t is None or own_t == dcp_t:
        raise CorruptCheckpointError(
            f"{both}, and their modification times do not tell which was saved last: "
            "remove the other one's files (pyckpt's: pyckpt.index and data-*.bin files; "
            "DCP's: .metadata and *.distcp files)")
    later = dcp_t > own_t
    warnings.warn(f"{both}; reading {'DCP' if later else 'pyckpt'}'s, saved last. Remove "
                  "the other one's files to silence this", stacklevel=3)
    return later


def _when(t: float | None) -> str:
    return "no time" if t is None else \
        datetime.datetime.fromtimestamp(t).isoformat(timespec="microseconds")


def checkpoint_path(store: Store, path: str) -> str:
    """``path`` itself, or for a run directory (a directory that is no pyckpt checkpoint)
    its latest checkpoint of any format; a directory without one stays as it is (the
    opener says what it holds)."""
    if store.exists(store.join(path, INDEX_NAME)) or not store.isdir(path):
        return path
    latest = run_directory.latest(store, path)
    return path if latest is None else latest


register_format("safetensors", safetensors.detect, safetensors.SafetensorsFile)
register_format("tensorflow", tensorflow.detect, tensorflow.open_path)
register_format("hf-safetensors", hf_folder.detect, hf_folder.HFFolder)
register_format("dcp", distcp.detect, distcp.DCPCheckpoint)
