"""``pyckpt ls PATH``: the checkpoints in a directory or bucket prefix."""

from __future__ import annotations

import argparse
import datetime

from ..engine import naming
from ..engine.run import step_of
from ..errors import CheckpointError
from ..format import INDEX_NAME, decode_index
from ..interop.tensorflow import TensorFlowCheckpoint
from ..storage import resolve
from .common import (add_output_options, add_storage_options, emit_json, fail, human,
                     natural_key, parse_options, reach)


def _describe(store, path: str, name: str) -> dict | None:
    entries = store.listdir(path)
    row = {"name": name, "path": store.url(path), "step": step_of(name)}
    if INDEX_NAME in entries:
        try:
            m = decode_index(store.read_bytes(store.join(path, INDEX_NAME)), store.url(path))
        except ValueError as e:
            return {**row, "status": "corrupt", "error": str(e)}
        created = m.info.get("created")
        return {**row, "status": "committed", "bytes": sum(f.size for f in m.files),
                "tensors": len(m.keys),
                "created": datetime.datetime.fromtimestamp(created).isoformat(timespec="seconds")
                if isinstance(created, (int, float)) else None}
    if any(naming.is_data_file(e) for e in entries):
        return {**row, "status": "uncommitted"}
    return None


def _describe_tensorflow(store, prefix: str, name: str) -> dict:
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


def run(args: argparse.Namespace) -> int:
    """Runs ``pyckpt ls``: the checkpoints in PATH (or PATH itself when it is one), by
    step, with size, tensor count, creation time and status (committed, uncommitted
    or corrupt); returns the exit status: 0 when PATH holds a committed checkpoint,
    1 when it holds none or does not exist."""
    options = parse_options(args.storage_option)
    reach(args, args.path, options)
    store, path = resolve(args.path, options)
    tf_prefix = not store.isdir(path) and store.exists(path + ".index")  # dir/ckpt-5
    if not store.exists(path) and not tf_prefix:
        if args.json:
            emit_json([])
        return fail(f"{store.url(path)} does not exist")
    rows: list[dict] = []
    if tf_prefix:
        rows.append(_describe_tensorflow(store, path, path.rstrip("/").rsplit("/", 1)[-1]))
    elif INDEX_NAME in store.listdir(path):
        here = _describe(store, path, path.rstrip("/").rsplit("/", 1)[-1])
        assert here is not None  # a directory holding an index is always described
        rows.append(here)
    else:
        for name in sorted(store.listdir(path), key=natural_key):
            if name.endswith(".index") and name != INDEX_NAME:  # TensorFlow's <prefix>.index
                rows.append(_describe_tensorflow(store, store.join(path, name[:-6]), name[:-6]))
                continue
            row = _describe(store, store.join(path, name), name)
            if row is not None:
                rows.append(row)
    rows.sort(key=lambda r: (r["step"] is None, r["step"] or 0, natural_key(r["name"])))
    status = 0 if any(r["status"] == "committed" for r in rows) else 1
    if args.json:
        emit_json(rows)
        return status
    if not rows:
        return fail(f"no checkpoints in {store.url(path)}")
    print(f"{'NAME':24s} {'STEP':>8s} {'SIZE':>10s} {'TENSORS':>8s} {'CREATED':20s} STATUS")
    for r in rows:
        print(f"{r['name']:24s} {'' if r['step'] is None else r['step']:>8} "
              f"{human(r['bytes']) if 'bytes' in r else '-':>10s} {r.get('tensors', '-'):>8} "
              f"{r.get('created') or '-':20s} {r['status']}")
    if status:
        fail(f"no committed checkpoint in {store.url(path)}")
    return status


def register(sub: argparse._SubParsersAction) -> None:
    """Adds the ``ls`` subcommand to the command line's subparsers."""
    p = sub.add_parser("ls", help="list the checkpoints in a directory or bucket",
                       description="Lists the checkpoints in a run directory or bucket prefix "
                       "(or PATH itself when it is one), pyckpt's and TensorFlow's: step, size, "
                       "tensors, creation time, status. Exit status 1 when PATH does not exist "
                       "or holds no committed checkpoint.")
    p.add_argument("path", help="run directory, checkpoint or bucket prefix: a local path or "
                                "an fsspec URL (s3://bucket/run, gs://..., memory://...)")
    add_storage_options(p)
    add_output_options(p)
    p.set_defaults(fn=run)
