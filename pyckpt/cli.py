"""The ``pyckpt`` command line (API.md section 8): ls, inspect, verify, diff, cp, demo."""

from __future__ import annotations

import argparse
import sys

from ._version import __version__
from . import demo
from .commands import cp, diff, inspect_cmd, ls, verify


def _cmd_demo(args: argparse.Namespace) -> int:
    return demo.run(args.dir)


def build_parser() -> argparse.ArgumentParser:
    """The parser of the ``pyckpt`` command, every subcommand registered; each sets
    ``fn``, the function that runs it and returns the exit status."""

    parser = argparse.ArgumentParser(
        prog="pyckpt", description="Inspect, verify, compare and copy pyckpt checkpoints "
        "(local paths or any fsspec URL: s3://, gs://, memory://...).")
    parser.add_argument("--version", action="version", version=f"pyckpt {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)
    for module in (ls, inspect_cmd, verify, diff, cp):
        module.register(sub)
    p = sub.add_parser("demo", help="save, inspect, verify and load a small state on local disk")
    p.add_argument("--dir", help="directory to write into (default: a temporary one)")
    p.set_defaults(fn=_cmd_demo)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Runs the ``pyckpt`` command line on ``argv`` (default ``sys.argv[1:]``); returns
    the exit status. OSError, ValueError and KeyError are printed to stderr as one
    line (status 1); a closed output pipe ends quietly (status 0)."""
    args = build_parser().parse_args(argv)
    try:
        return int(args.fn(args))
    except BrokenPipeError:  # `pyckpt inspect ... | head`
        return 0
    except (OSError, ValueError, KeyError) as e:
        print(f"pyckpt: {e}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
