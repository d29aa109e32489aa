"""``pyckpt verify PATH``: read every byte, check every checksum (exit 1 on failure)."""

from __future__ import annotations

import argparse

from .. import progress as _progress
from ..checkpoint_reader import load_checkpoint
from ..errors import CheckpointError
from .common import add_output_options, add_storage_options, emit_json, fail, parse_options, progress_bar


def run(args: argparse.Namespace) -> int:
    try:
        reader = load_checkpoint(args.path, storage_options=parse_options(args.storage_option))
        callback, close = progress_bar(args, "verify")
        try:
            with _progress.reporting(callback, reader.nbytes()):
                reader.verify()
        finally:
            close()
    except (CheckpointError, OSError) as e:
        if args.json:
            emit_json({"path": args.path, "ok": False, "error": str(e)})
            return 1
        return fail(f"FAILED: {e}")
    if args.json:
        emit_json({"path": reader.path, "ok": True, "tensors": len(reader.keys()),
                   "bytes": reader.nbytes()})
    else:
        print(f"OK: {reader.path}: {len(reader.keys())} tensors, every checksum matches")
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("verify", help="check every checksum (exit status 1 on any failure)")
    p.add_argument("path")
    add_storage_options(p)
    add_output_options(p)
    p.set_defaults(fn=run)
