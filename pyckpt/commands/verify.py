"""``pyckpt verify PATH``: read every byte, check every checksum (exit 1 on failure).
With ``--fix``, a checkpoint that verifies is also cleaned of orphaned data files
(files no committed index names, left by racing or killed saves)."""

from __future__ import annotations

import argparse

from .. import progress as _progress
from .._dtypes import INSTALL_HINT, undecodable
from ..checkpoint_reader import load_checkpoint
from ..runs import sweep_orphans
from ..errors import CheckpointError
from .common import (StoreProblem, add_output_options, add_storage_options, describe_error,
                     emit_json, parse_options, progress_bar, reach, report_error)


def run(args: argparse.Namespace) -> int:
    """Runs ``pyckpt verify``: reads every byte and checks every checksum, then with
    ``--fix`` removes orphaned data files (``runs.sweep_orphans``); returns 0, or 1 after
    reporting the first failure."""
    removed: list[str] = []
    try:
        options = parse_options(args.storage_option)
        reach(args, args.path, options)
        reader = load_checkpoint(args.path, storage_options=options)
        callback, close = progress_bar(args, "verify")
        try:
            with _progress.reporting(callback, reader.nbytes()):
                reader.verify()
        finally:
            close()
        if args.fix and reader.source.format == "pyckpt":  # attempts are pyckpt's only
            removed = sweep_orphans(reader.path, options)
    except (CheckpointError, OSError, StoreProblem) as e:
        if args.json:
            emit_json({"path": args.path, "ok": False, "error": describe_error(e, args)})
            return 1
        return report_error(args, e, "FAILED: ")
    src = reader.source
    undecoded = {k: name for i, k in enumerate(src.keys)
                 if (name := undecodable(src.dtype(i))) is not None}
    if args.json:
        out = {"path": reader.path, "ok": True, "tensors": len(reader.keys()),
               "bytes": reader.nbytes(), "checksums": src.checksums,
               "undecodable": undecoded}
        if args.fix:
            out["removed"] = removed
        emit_json(out)
    else:
        print(f"OK: {reader.path}: {len(reader.keys())} tensors, "
              + ("every checksum matches" if src.checksums else
                 f"every tensor read within its bounds ({src.format} stores no "
                 "checksums: changed bytes cannot be detected)"))
        if undecoded:
            print(_undecodable_note(undecoded))
        if args.fix:
            print(f"removed {len(removed)} orphaned file(s)" + "".join(f"\n  {n}" for n in removed))
    return 0


def _undecodable_note(undecoded: dict[str, str]) -> str:
    """The note under OK for tensors whose dtype this Python cannot decode: their bytes
    were checked, their values cannot be loaded here until ml_dtypes is installed."""
    by_dtype: dict[str, list[str]] = {}
    for key, name in undecoded.items():
        by_dtype.setdefault(name, []).append(key)
    listed = "; ".join(f"{name}: {len(keys)} tensor(s), e.g. {keys[0]!r}"
                       for name, keys in by_dtype.items())
    return (f"note: dtypes this Python cannot decode ({listed}): their bytes were checked; "
            f"loading their values needs ml_dtypes: {INSTALL_HINT}")


def register(sub: argparse._SubParsersAction) -> None:
    """Adds the ``verify`` subcommand to the command line's subparsers."""
    p = sub.add_parser("verify", help="check every checksum (exit status 1 on any failure)",
                       description="Reads every byte of a checkpoint and checks every checksum; "
                       "exit status 1 on any failure, naming the key, file and byte range.")
    p.add_argument("path", help="checkpoint, run directory (its latest checkpoint), "
                                ".safetensors file or TensorFlow checkpoint prefix (dir/ckpt-5): "
                                "a local path or an fsspec URL")
    p.add_argument("--fix", action="store_true",
                   help="then remove orphaned data files (of racing or killed saves) that no "
                        "committed index references")
    add_storage_options(p)
    add_output_options(p)
    p.set_defaults(fn=run)
