"""Storage backends. ``resolve(path, storage_options)`` picks one for a path or URL."""

from __future__ import annotations

import os
from typing import Any

from .base import ByteRange, FetchPolicy, LeftoverUploads, NewFile, Store, buffer_size
from .local import LocalStore

__all__ = ["ByteRange", "FetchPolicy", "LeftoverUploads", "LocalStore", "NewFile", "Store", "buffer_size",
           "resolve"]

_LOCAL = LocalStore()


def resolve(path: Any, storage_options: dict | None = None) -> tuple[Store, str]:
    """(store, path inside the store) for a local path, ``file://`` URL or fsspec URL."""
    if isinstance(path, os.PathLike):
        path = os.fspath(path)
    if not isinstance(path, str):
        raise TypeError(f"a checkpoint path must be a str or os.PathLike, got {type(path).__name__}")
    if not path:
        raise ValueError("empty checkpoint path")
    if path.startswith("file://"):
        path = path[len("file://"):]
    if "://" not in path:
        local = os.path.abspath(os.path.expanduser(path))
        if os.path.islink(local) and os.path.isfile(local):
            # a file the user named through a link (one safetensors file, say): the
            # user asked for it; links inside a checkpoint are never followed
            local = os.path.realpath(local)
        return _LOCAL, local
    # loaded with the first URL: it brings asyncio and fsspec's machinery (~90 ms),
    # which local checkpoints never need
    from .fsspec_store import FsspecStore

    return FsspecStore.for_url(path, storage_options)
