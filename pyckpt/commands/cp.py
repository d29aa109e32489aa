"""``pyckpt cp SRC DST``: copy a checkpoint between any two fsspec URLs, streaming
and verifying every chunk; ``.safetensors`` on either side converts."""

from __future__ import annotations

import argparse

from ..engine.copy import copy_checkpoint
from ..errors import CheckpointError
from ..interop import safetensors as st
from .common import add_output_options, add_storage_options, emit_json, fail, parse_options, progress_bar


def run(args: argparse.Namespace) -> int:
    """Runs ``pyckpt cp``: copies SRC to DST, or converts when either is a ``.safetensors``
    file; returns the exit status (1 on failure). ``--src-storage-option`` and
    ``--dst-storage-option`` add to (and override) ``--storage-option`` on their side."""
    both = parse_options(args.storage_option) or {}
    src_opts = {**both, **(parse_options(args.src_storage_option) or {})} or None
    dst_opts = {**both, **(parse_options(args.dst_storage_option) or {})} or None
    callback, close = progress_bar(args, "copy")
    try:
        if st.is_safetensors_path(args.src) and st.is_safetensors_path(args.dst):
            return fail("copy safetensors files with any file tool; pyckpt cp converts formats")
        if st.is_safetensors_path(args.src):
            st.to_checkpoint(args.src, args.dst, src_options=src_opts, dst_options=dst_opts,
                             progress=callback)
        elif st.is_safetensors_path(args.dst):
            st.from_checkpoint(args.src, args.dst, src_options=src_opts, dst_options=dst_opts,
                               progress=callback)
        else:
            copy_checkpoint(args.src, args.dst, src_options=src_opts, dst_options=dst_opts,
                            progress=callback)
    except (CheckpointError, OSError, TypeError, ValueError) as e:
        return fail(f"cp failed: {e}")
    finally:
        close()
    if args.json:
        emit_json({"src": args.src, "dst": args.dst, "ok": True})
    elif not args.quiet:
        print(f"copied {args.src} -> {args.dst} (every chunk verified)")
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    """Adds the ``cp`` subcommand to the command line's subparsers."""
    p = sub.add_parser("cp", help="copy (or convert to/from .safetensors) between any two URLs")
    p.add_argument("src")
    p.add_argument("dst")
    add_storage_options(p)
    p.add_argument("--src-storage-option", action="append", metavar="KEY=VALUE")
    p.add_argument("--dst-storage-option", action="append", metavar="KEY=VALUE")
    add_output_options(p)
    p.set_defaults(fn=run)
