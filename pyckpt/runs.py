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
from .run_directory import step_of
from .errors import CheckpointError
from .format import INDEX_NAME, decode_index
from .codecs.distcp import METADATA_NAME, DCPCheckpoint
from .codecs.hf_folder import HFFolder, weights_file
from .codecs.tensorflow import TensorFlowCheckpoint
from .storage import resolve

__all__ = ["list_checkpoints", "sweep_orphans", "natural_key"]


def natural_key(text: str) -> tuple:
    """Sort key that orders the numbers inside strings by value: ``w/2`` before ``w/10``."""
    parts = re.split(r"(\d+)", text)
    return tuple(int(p) if i % 2 else p for i, p in enumerate(parts)), text


#: ``step=N`` in a name (Lightning's ``epoch=1-step=8.ckpt``, ``global_step=N``)
_STEP_IS = re.compile(r"(?<![A-Za-z])step=([0-9]+)")
#: a number ending a name after a separator or "step" (DCP's ``dcp_step_100``, ``step100``)
_TRAILING = re.compile(r"(?:^|[^A-Za-z0-9]|step)([0-9]+)$")


def _step(name: str, trailing: bool = False) -> int | None:
    """The step a checkpoint's name says: ``<prefix>-<N>``, else ``step=N`` anywhere,
    else (``trailing``: directories of formats that do not number their checkpoints,
    DCP's) a number ending the name; None when it says none."""
    step = step_of(name)
    if step is None:
        m = _STEP_IS.search(name) or (_TRAILING.search(name) if trailing else None)
        step = int(m.group(1)) if m else None
    return step


def _describe(store: Any, path: str, name: str) -> dict | None:
    """A row for the pyckpt (or DCP) checkpoint directory ``path`` (None: it holds none)."""
    entries = store.listdir(path)
    row = {"name": name, "path": store.url(path), "step": _step(name)}
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
                "owned_bytes": sum(f.size for f in m.files if f.at is None),
                **({"referenced_bytes": referenced, "references": refs,
                    _FILES: {(f.at, f.name): f.size for f in m.files if f.at is not None}}
                   if refs else {}),
                "tensors": len(m.keys),
                "created": datetime.datetime.fromtimestamp(created).isoformat(timespec="seconds")
                if isinstance(created, (int, float)) else None}
    data = [e for e in entries if naming.is_data_file(e)]
    if data:  # or held: see list_checkpoints
        sizes = store.sizes([store.join(path, e) for e in data])
        return {**row, "status": "uncommitted", "owned_bytes": sum(n or 0 for n in sizes)}
    return None


def _describe_tensorflow(store: Any, prefix: str, name: str) -> dict:
    """A row for the TensorFlow checkpoint ``prefix`` (``<prefix>.index`` exists)."""
    row = {"name": name, "path": store.url(prefix), "step": _step(name), "format": "tensorflow"}
    try:
        ck = TensorFlowCheckpoint(store, prefix)
    except CheckpointError as e:
        return {**row, "status": "corrupt", "error": str(e)}
    files = ck.describe()["files"]
    created = store.mtime(prefix + ".index")
    size = sum(f["bytes"] or 0 for f in files)
    return {**row, "status": "committed", "bytes": size, "owned_bytes": size,
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
    row = {"name": name, "path": store.url(path), "step": _step(name, trailing=fmt == "dcp"),
           "format": fmt}
    try:
        ck = opener(store, path)
    except CheckpointError as e:
        return {**row, "status": "corrupt", "error": str(e)}
    created = store.mtime(store.join(path, last))
    size = sum(f["bytes"] or 0 for f in ck.describe()["files"])
    return {**row, "status": "committed", "bytes": size, "owned_bytes": size,
            "tensors": len(ck.keys),
            "created": datetime.datetime.fromtimestamp(created).isoformat(timespec="seconds")
            if isinstance(created, (int, float)) else None}


#: a row's (directory, file) -> size of the files it references (list_checkpoints only)
_FILES = "_referenced_files"


def _held_for_others(rows: list[dict]) -> None:
    """Adds to each row of a directory listing the bytes of its files that the others'
    indexes reference (``held_for_others_bytes``) and who they are (``held_for``);
    marks a retired checkpoint's directory that committed ones still read as held."""
    held: dict[str, dict[str, int]] = {}  # directory -> {file: size}
    users: dict[str, set[str]] = {}
    for r in rows:
        for (at, file), size in r.pop(_FILES, {}).items():
            held.setdefault(at, {})[file] = size
            users.setdefault(at, set()).add(r["name"])
    for r in rows:
        if r["name"] in held:
            r["held_for_others_bytes"] = sum(held[r["name"]].values())
            r["held_for"] = sorted(users[r["name"]], key=natural_key)
            if r["status"] == "uncommitted":
                r["status"] = "held"
        elif "owned_bytes" in r:
            r["held_for_others_bytes"] = 0


def list_checkpoints(path: Any, storage_options: dict | None = None) -> tuple[str, list[dict] | None]:
    """(URL of ``path``, its rows by step) where a row says name, path, step, status
    (committed, uncommitted, held: data of a retired checkpoint that committed ones
    reference, or corrupt) and, when readable, bytes (of its data, its own and those
    it references in other directories: what a load reads), tensors, created;
    ``owned_bytes``: of the data files in its own directory (disk it takes), and in
    a listing of a directory, ``held_for_others_bytes``: of those, in files other
    checkpoints reference (``held_for``: their names). ``path`` itself when it is a
    checkpoint (then no ``held_for_others_bytes``: its siblings are not read); rows
    None when ``path`` does not exist."""
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
        row.pop(_FILES, None)
        return store.url(p), [row]
    else:
        for name in entries:
            if name.endswith(".index") and name != INDEX_NAME:  # TensorFlow's <prefix>.index
                rows.append(_describe_tensorflow(store, store.join(p, name[:-6]), name[:-6]))
                continue
            row = _describe(store, store.join(p, name), name)
            if row is not None:
                rows.append(row)
    _held_for_others(rows)
    rows.sort(key=lambda r: (r["step"] is None, r["step"] or 0, natural_key(r["name"])))
    return store.url(p), rows


def sweep_orphans(path: Any, storage_options: dict | None = None) -> list[str]:
    """Removes the data files in the checkpoint directory ``path`` that its index does
    not name (left by interrupted saves); returns what it removed."""
    return attempts.sweep(*resolve(path, storage_options))
