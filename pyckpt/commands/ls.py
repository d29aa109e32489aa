"""``pyckpt ls PATH``: the checkpoints in a directory or bucket prefix."""

from __future__ import annotations

import argparse

from ..runs import list_checkpoints
from .common import (add_output_options, add_storage_options, emit_json, fail, human,
                     parse_options, reach)


def run(args: argparse.Namespace) -> int:
    """Runs ``pyckpt ls``: the checkpoints in PATH (or PATH itself when it is one), by
    step, with size, tensor count, creation time and status (committed, uncommitted
    or corrupt); returns the exit status: 0 when PATH holds a committed checkpoint,
    1 when it holds none or does not exist."""
    options = parse_options(args.storage_option)
    reach(args, args.path, options)
    url, rows = list_checkpoints(args.path, options)
    if rows is None:
        if args.json:
            emit_json([])
        return fail(f"{url} does not exist")
    status = 0 if any(r["status"] == "committed" for r in rows) else 1
    if args.json:
        emit_json(rows)
        return status
    if not rows:
        return fail(f"no checkpoints in {url}")
    print(f"{'NAME':24s} {'STEP':>8s} {'SIZE':>10s} {'TENSORS':>8s} {'CREATED':20s} STATUS")
    for r in rows:
        print(f"{r['name']:24s} {'' if r['step'] is None else r['step']:>8} "
              f"{human(r['bytes']) if 'bytes' in r else '-':>10s} {r.get('tensors', '-'):>8} "
              f"{r.get('created') or '-':20s} {r['status']}")
    if status:
        fail(f"no committed checkpoint in {url}")
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
