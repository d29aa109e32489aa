"""What a run directory (or bucket prefix) holds, for ``pyckpt ls`` and ``pyckpt verify
--fix``: a row per checkpoint, pyckpt's, TensorFlow's, DCP's and Hugging Face
folders, and the removal of data files no committed index names. The commands reach storage formats only through
this module and the public API (docs/ARCHITECTURE.md, "commands never look inside
a format")."""

from __future__ import annotations

import datetime
import re
from typing import Any

from .engine import attempts, naming
from .engine.run import step_of
from .errors import CheckpointError
from .format import INDEX_NAME, decode_index
from .codecs.dcp import METADATA_NAME, DCPCheckpoint
from .codecs.hf_folder import HFFolder, weights_file
from .codecs.tensorflow import TensorFlowCheckpoint
from .storage import resolve

__all__ = ["list_checkpoints", "sweep_orphans", "natural_key"]


def natural_key(text: str) -> tuple:
    """Sort key that orders the numbers inside strings by value: ``w/2`` before ``w/10``."""
    parts = re.split(r"(\d+)", text)
    return tuple(int(p) if i % 2 else p for i, p in enumerate(parts)), text


def _describe(store: Any, path: str, name: str) -> dict | None:
    """A row for the pyckpt (or DCP) checkpoint directory ``path`` (None: it holds none)."""
    entries = store.listdir(path)
    row = {"name": name, "path": store.url(path), "step": step_of(name)}
    if METADATA_NAME in entries and INDEX_NAME not in entries:
        return _describe_dcp(store, path, name)
    hf = weights_file(entries)  # model.safetensors, or the index of a sharded folder
    if hf is not None and INDEX_NAME not in entries:
        return _describe_foreign(store, path, name, "hf-safetensors", HFFolder, hf)
    if INDEX_NAME in entries:
        try:
            m = decode_index(store.read_bytes(store.join(path, INDEX_NAME)), store.url(path))
        except ValueError as e:
            return {**row, "status": "corrupt", "error": str(e)}
        created = m.info.get("created")
        own, referenced = m.own_and_referenced_bytes()
        refs = sorted({f.at for f in m.files if f.at is not None})
        return {**row, "status": "committed", "bytes": own + referenced,
                **({"referenced_bytes": referenced, "references": refs} if refs else {}),
                "tensors": len(m.keys),
                "created": datetime.datetime.fromtimestamp(created).isoformat(timespec="seconds")
                if isinstance(created, (int, float)) else None}
    if any(naming.is_data_file(e) for e in entries):
        return {**row, "status": "uncommitted"}  # or held: see list_checkpoints
    return None


def _describe_tensorflow(store: Any, prefix: str, name: str) -> dict:
    """A row for the TensorFlow checkpoint ``prefix`` (``<prefix>.index`` exists)."""
    row = {"name": name, "path": store.url(prefix), "step": step_of(name), "format": "tensorflow"}
    try:
        ck = TensorFlowCheckpoint(store, prefix)
    except CheckpointError as e:
        return {**row, "status": "corrupt", "error": str(e)}
    files = ck.describe()["files"]
    created = store.mtime(prefix + ".index")
    return {**row, "status": "committed", "bytes": sum(f["bytes"] or 0 for f in files),
            "tensors": len(ck.keys),
            "created": datetime.datetime.fromtimestamp(created).isoformat(timespec="seconds")
            if isinstance(created, (int, float)) else None}


def _describe_dcp(store: Any, path: str, name: str) -> dict:
    """A row for the torch.distributed.checkpoint directory ``path`` (its ``.metadata``,
    written last by DCP, exists)."""
    return _describe_foreign(store, path, name, "dcp", DCPCheckpoint, METADATA_NAME)


def _describe_foreign(store: Any, path: str, name: str, fmt: str, opener: Any,
                      last: str) -> dict:
    """A row for the directory ``path`` of another program's format ``fmt`` (``last``:
    the file it writes last, which exists), opened by ``opener(store, path)``."""
    row = {"name": name, "path": store.url(path), "step": step_of(name), "format": fmt}
    try:
        ck = opener(store, path)
    except CheckpointError as e:
        return {**row, "status": "corrupt", "error": str(e)}
    created = store.mtime(store.join(path, last))
    return {**row, "status": "committed",
            "bytes": sum(f["bytes"] or 0 for f in ck.describe()["files"]), "tensors": len(ck.keys),
            "created": datetime.datetime.fromtimestamp(created).isoformat(timespec="seconds")
            if isinstance(created, (int, float)) else None}


def list_checkpoints(path: Any, storage_options: dict | None = None) -> tuple[str, list[dict] | None]:
    """(URL of ``path``, its rows by step) where a row says name, path, step, status
    (committed, uncommitted, held: data of a retired checkpoint that committed ones
    reference, or corrupt) and, when readable, bytes, tensors, created;
    ``path`` itself when it is a checkpoint; rows None when ``path`` does not exist."""
    store, p = resolve(path, storage_options)
    tf_prefix = not store.isdir(p) and store.exists(p + ".index")  # dir/ckpt-5
    if not store.exists(p) and not tf_prefix:
        return store.url(p), None
    rows: list[dict] = []
    here = p.rstrip("/").rsplit("/", 1)[-1]
    entries = [] if tf_prefix else store.listdir(p)
    if tf_prefix:
        rows.append(_describe_tensorflow(store, p, here))
    elif INDEX_NAME in entries or METADATA_NAME in entries or weights_file(entries):  # one
        row = _describe(store, p, here)
        assert row is not None  # a directory holding an index is always described
        rows.append(row)
    else:
        for name in entries:
            if name.endswith(".index") and name != INDEX_NAME:  # TensorFlow's <prefix>.index
                rows.append(_describe_tensorflow(store, store.join(p, name[:-6]), name[:-6]))
                continue
            row = _describe(store, store.join(p, name), name)
            if row is not None:
                rows.append(row)
    held = {at for r in rows for at in r.get("references", ())}
    for r in rows:  # a retired checkpoint's files that committed ones still reference
        if r["status"] == "uncommitted" and r["name"] in held:
            r["status"] = "held"
    rows.sort(key=lambda r: (r["step"] is None, r["step"] or 0, natural_key(r["name"])))
    return store.url(p), rows


def sweep_orphans(path: Any, storage_options: dict | None = None) -> list[str]:
    """Removes the data files in the checkpoint directory ``path`` that its index does
    not name (left by interrupted saves); returns what it removed."""
    return attempts.sweep(*resolve(path, storage_options))
