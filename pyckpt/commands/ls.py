"""``pyckpt ls PATH``: the checkpoints in a directory or bucket prefix."""

from __future__ import annotations

import argparse

from ..runs import list_checkpoints
from .common import (add_output_options, add_storage_options, emit_json, fail, human,
                     parse_options, printable, reach)


def run(args: argparse.Namespace) -> int:
    """Runs ``pyckpt ls``: the checkpoints in PATH (or PATH itself when it is one), by
    step, with size, bytes owned and held for others, tensor count, creation time and
    status (committed, uncommitted, held or corrupt), and the disk taken by incremental
    saves (``_print_rows``); returns the exit status: 0 when PATH holds a committed
    checkpoint, 1 when it holds none or does not exist."""
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
    _print_rows(rows)
    if status:
        fail(f"no committed checkpoint in {url}")
    return status


def _size(row: dict, field: str) -> str:
    return human(row[field]) if field in row else "-"


def _status(row: dict) -> str:
    """The STATUS column: held data says for whom."""
    users = row.get("held_for") or []
    if row["status"] != "held" or not users:
        return row["status"]
    shown = ", ".join(printable(u) for u in users[:3])
    return f"held for {shown}" + (f" and {len(users) - 3} more" if len(users) > 3 else "")


def _print_rows(rows: list[dict]) -> None:
    """The table of ``ls`` (SIZE: the data a load reads; OWNED: the data files in the
    checkpoint's directory; HELD-FOR-OTHERS: of those, the files other checkpoints
    read), and where checkpoints read others' data, the disk they take together."""
    names = [printable(r["name"]) for r in rows]
    width = max([24] + [len(n) for n in names])
    print(f"{'NAME':{width}s} {'STEP':>8s} {'SIZE':>10s} {'OWNED':>10s} {'HELD-FOR-OTHERS':>15s} "
          f"{'TENSORS':>8s} {'CREATED':20s} STATUS")
    for r, name in zip(rows, names):
        print(f"{name:{width}s} {'' if r['step'] is None else r['step']:>8} "
              f"{_size(r, 'bytes'):>10s} {_size(r, 'owned_bytes'):>10s} "
              f"{_size(r, 'held_for_others_bytes'):>15s} {r.get('tensors', '-'):>8} "
              f"{r.get('created') or '-':20s} {_status(r)}")
    owned = [r for r in rows if "owned_bytes" in r]
    held = sum(r.get("held_for_others_bytes", 0) for r in owned)
    if held:  # incremental saves: where the disk went
        print(f"on disk: {human(sum(r['owned_bytes'] for r in owned))} in {len(owned)} "
              f"directories, {human(held)} of it held for other checkpoints")


def register(sub: argparse._SubParsersAction) -> None:
    """Adds the ``ls`` subcommand to the command line's subparsers."""
    p = sub.add_parser("ls", help="list the checkpoints in a directory or bucket",
                       description="Lists the checkpoints in a run directory or bucket prefix "
                       "(or PATH itself when it is one), pyckpt's, TensorFlow's, DCP's and Hugging "
                       "Face folders: step, SIZE (the bytes of data a load reads, referenced ones "
                       "included), OWNED (the bytes of data files in its own directory: the disk "
                       "it takes), HELD-FOR-OTHERS (of those, the bytes other checkpoints "
                       "reference: incremental saves), tensors, creation time, status; then, "
                       "where checkpoints read others' data, the disk they take together. Exit "
                       "status 1 when PATH does not exist or holds no committed checkpoint.")
    p.add_argument("path", help="run directory, checkpoint or bucket prefix: a local path or "
                                "an fsspec URL (s3://bucket/run, gs://..., memory://...)")
    add_storage_options(p)
    add_output_options(p)
    p.set_defaults(fn=run)
