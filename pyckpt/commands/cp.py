"""``pyckpt cp SRC DST``: copy a checkpoint between any two fsspec URLs, streaming
and verifying every chunk; ``.safetensors`` on either side converts, and so do
TensorFlow checkpoints: a TensorFlow SRC (a prefix ``dir/ckpt-5``, or a run
directory whose latest checkpoint is TensorFlow's) becomes a pyckpt checkpoint,
and DST is written as a TensorFlow checkpoint with ``--format tf`` (or when DST
ends in ``.index``: its prefix). An existing committed checkpoint (or file) at
DST is replaced only with ``--force``."""

from __future__ import annotations

import argparse

from ..errors import CheckpointError
from ..transfer import (is_safetensors_path, occupied, target_format, tensorflow_source,
                        transfer)
from .common import (StoreProblem, add_output_options, add_storage_options, emit_json, fail,
                     parse_options, progress_bar, reach, report_error)


def run(args: argparse.Namespace) -> int:
    """Runs ``pyckpt cp``: copies SRC to DST, or converts when either is a ``.safetensors``
    file or a TensorFlow checkpoint (``transfer.target_format``: how DST's format is chosen); refuses to replace a committed checkpoint (or a file) at DST unless
    ``--force``; returns the exit status (1 on failure). ``--src-storage-option`` and
    ``--dst-storage-option`` add to (and override) ``--storage-option`` on their side."""
    both = parse_options(args.storage_option) or {}
    src_opts = {**both, **(parse_options(args.src_storage_option) or {})} or None
    dst_opts = {**both, **(parse_options(args.dst_storage_option) or {})} or None
    fmt, dst = target_format(args.dst, args.format)
    if is_safetensors_path(args.src) and fmt == "safetensors":
        return fail("copy safetensors files with any file tool; pyckpt cp converts formats")
    try:
        reach(args, args.src, src_opts)
        reach(args, dst, dst_opts)
        if not args.force:
            there = occupied(dst, dst_opts, fmt)
            if there is not None:
                return fail(f"cp: {there}; pass --force to replace it")
        # a TensorFlow SRC (a prefix, or a run directory whose latest is one) converts
        source = tensorflow_source(args.src, src_opts)
        if source is not None and fmt == "safetensors":
            return fail("cp: safetensors cannot hold a TensorFlow checkpoint's string tensors "
                        "and object graph: convert it to pyckpt's format (or --format tf)")
    except (CheckpointError, OSError, TypeError, ValueError, StoreProblem) as e:
        return report_error(args, e, "cp failed: ")
    callback, close = progress_bar(args, "copy")
    try:
        transfer(args.src, dst, fmt, source=source, src_options=src_opts,
                 dst_options=dst_opts, progress=callback, max_shard_size=args.max_shard_size,
                 config=args.config)
    except (CheckpointError, OSError, TypeError, ValueError) as e:
        return report_error(args, e, "cp failed: ")
    finally:
        close()
    if args.json:
        emit_json({"src": args.src, "dst": dst, "format": fmt, "ok": True})
    elif not args.quiet:
        print(f"copied {args.src} -> {dst} (every chunk verified)" if fmt == "pyckpt"
              and source is None else f"converted {args.src} -> {dst} ({fmt}, every tensor "
                                      "verified on read)")
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    """Adds the ``cp`` subcommand to the command line's subparsers."""
    p = sub.add_parser("cp", help="copy (or convert to/from .safetensors and TensorFlow "
                              "checkpoints) between any two URLs",
                       description="Copies a checkpoint between any two locations (local "
                       "paths or fsspec URLs), verifying every chunk and committing the copy "
                       "last; a .safetensors file or a TensorFlow checkpoint on either side "
                       "converts (--format tf writes TensorFlow's format). An existing "
                       "committed checkpoint (or file) at DST is replaced only with --force.")
    p.add_argument("src", help="the checkpoint to copy (a run directory means its latest) or "
                               "a .safetensors file: a local path or an fsspec URL")
    p.add_argument("dst", help="where to write the copy (a checkpoint directory, or a "
                               ".safetensors file to convert to): a local path or an fsspec URL")
    p.add_argument("--force", "-f", action="store_true",
                   help="replace a committed checkpoint (or a file) already at DST")
    p.add_argument("--format", choices=("auto", "pyckpt", "tf", "safetensors", "hf"),
                   default="auto",
                   help="what to write at DST: tf writes a TensorFlow checkpoint with DST as "
                        "its prefix (DST.index, DST.data-00000-of-00001, and the directory's "
                        "`checkpoint` state file); hf writes a Hugging Face safetensors folder "
                        "(model-0000i-of-0000N.safetensors and model.safetensors.index.json, "
                        "as transformers' save_pretrained); auto (default): safetensors for a "
                        "*.safetensors DST, tf for a DST ending in .index (its prefix), else "
                        "pyckpt. A TensorFlow SRC is read as such whatever the target")
    p.add_argument("--max-shard-size", default="5GB", metavar="SIZE",
                   help="with --format hf: the most tensor bytes per file (default 5GB; "
                        "decimal units as in transformers, 200KB = 200,000 bytes; KiB, MiB, "
                        "GiB are binary); a larger tensor gets a file of its own")
    p.add_argument("--config", metavar="PATH",
                   help="with --format hf: a folder whose config.json, generation_config.json "
                        "and tokenizer files are copied beside the weights (or a config.json "
                        "file), so that transformers' from_pretrained(DST) works; read with "
                        "SRC's storage options")
    add_storage_options(p)
    p.add_argument("--src-storage-option", action="append", metavar="KEY=VALUE",
                   help="storage option for SRC only (repeatable), added to and overriding "
                        "--storage-option; e.g. reading from one bucket, writing to another")
    p.add_argument("--dst-storage-option", action="append", metavar="KEY=VALUE",
                   help="storage option for DST only (repeatable), added to and overriding "
                        "--storage-option")
    add_output_options(p)
    p.set_defaults(fn=run)
