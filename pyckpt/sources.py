"""Opening a path as a checkpoint source: the one way in for every read
(``load``, ``load_checkpoint``, ``Checkpoint.restore``, the CLI).

A run directory is resolved to its latest checkpoint first (``engine.run.latest``:
pyckpt's or TensorFlow's, by the directory's state), so that formats only ever
see checkpoint paths. Then a format registers a detector and an opener;
``open_source`` asks the registered formats in order and falls back to pyckpt's
own format. Formats implement ``pyckpt.format.source.CheckpointSource``::

    register_format("safetensors", detect=..., open=...)

``detect(store, path)`` must be cheap (a name test or one small read) and must
not raise for paths of other formats.
"""

from __future__ import annotations

import os
from typing import Any, Callable, NamedTuple

from .engine import run
from .engine.options import DEFAULT, IOOptions
from .engine.reader import OpenCheckpoint
from .format import INDEX_NAME
from .format.source import CheckpointSource
from .codecs import dcp, hf_folder, safetensors, tensorflow
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
    own = OpenCheckpoint.at(store, p, options)  # the common case: no probe of any kind
    if own is not None:
        return own
    p = checkpoint_path(store, p)
    for fmt in _FORMATS:
        if fmt.detect(store, p):
            return fmt.open(store, p)
    return OpenCheckpoint.open(store, p, options)


def checkpoint_path(store: Store, path: str) -> str:
    """``path`` itself, or for a run directory (a directory that is no pyckpt checkpoint)
    its latest checkpoint of any format; a directory without one stays as it is (the
    opener says what it holds)."""
    if store.exists(store.join(path, INDEX_NAME)) or not store.isdir(path):
        return path
    latest = run.latest(store, path)
    return path if latest is None else latest


register_format("safetensors", safetensors.detect, safetensors.SafetensorsFile)
register_format("tensorflow", tensorflow.detect, tensorflow.open_path)
register_format("hf-safetensors", hf_folder.detect, hf_folder.HFFolder)
register_format("dcp", dcp.detect, dcp.DCPCheckpoint)
