"""The ``pyckpt`` command line (API.md section 8)."""

from __future__ import annotations

import argparse
import sys


def _storage_options(pairs: list[str] | None) -> dict | None:
    if not pairs:
        return None
    out = {}
    for p in pairs:
        k, sep, v = p.partition("=")
        if not sep:
            raise SystemExit(f"--storage-option expects key=value, got {p!r}")
        out[k] = v
    return out


def _cmd_demo(args: argparse.Namespace) -> int:
    from .demo import run

    return run(args.dir)


def _cmd_verify(args: argparse.Namespace) -> int:
    import pyckpt

    try:
        reader = pyckpt.load_checkpoint(args.path, storage_options=_storage_options(args.storage_option))
        reader.verify()
    except pyckpt.CheckpointError as e:
        print(f"FAILED: {e}", file=sys.stderr)
        return 1
    print(f"OK: {reader.path}: {len(reader.keys())} tensors, every checksum matches")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="pyckpt", description="Inspect and manage pyckpt checkpoints.")
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("demo", help="save, inspect, verify and load a small state on local disk")
    p.add_argument("--dir", help="directory to write into (default: a temporary one)")
    p.set_defaults(fn=_cmd_demo)

    p = sub.add_parser("verify", help="check every checksum of a checkpoint (exit 1 on failure)")
    p.add_argument("path")
    p.add_argument("--storage-option", action="append", metavar="KEY=VALUE")
    p.set_defaults(fn=_cmd_verify)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return int(args.fn(args))


if __name__ == "__main__":
    sys.exit(main())
