"""The ``pyckpt`` command line (docs/API.md section 8): ls, inspect, verify, diff, cp, demo."""

from __future__ import annotations

import argparse
import contextlib
import logging
import sys
import warnings
from typing import Any, Iterator

from ._version import __version__
from . import demo
from .commands import cp, diff, inspect_cmd, ls, verify
from .commands.common import add_debug_option, report_error

#: the loggers of the storage clients: their warnings and retry tracebacks are shown
#: only with --debug (a failure is reported as one line of cause and fix)
_CLIENT_LOGGERS = ("gcsfs", "s3fs", "fsspec", "aiobotocore", "botocore", "boto3", "google",
                   "google_auth_httplib2", "urllib3", "grpc", "aiohttp", "asyncio", "adlfs",
                   "azure")


def _cmd_demo(args: argparse.Namespace) -> int:
    return demo.run(args.dir, keep=args.keep)


def build_parser() -> argparse.ArgumentParser:
    """The parser of the ``pyckpt`` command, every subcommand registered; each sets
    ``fn``, the function that runs it and returns the exit status."""

    parser = argparse.ArgumentParser(
        prog="pyckpt", description="Inspect, verify, compare and copy pyckpt checkpoints "
        "(local paths or any fsspec URL: s3://, gs://, memory://...).",
        epilog="Remote stores: credentials come from the environment as their clients read them "
        "(AWS_ACCESS_KEY_ID..., GOOGLE_APPLICATION_CREDENTIALS) or from --storage-option; a "
        "store that does not answer within --timeout seconds (default 10) is reported as "
        "unreachable. A failure prints one line; --debug adds the traceback.")
    parser.add_argument("--version", action="version", version=f"pyckpt {__version__}")
    add_debug_option(parser)
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND",
                                title="commands", help="run `pyckpt COMMAND --help` for its options")
    for module in (ls, inspect_cmd, verify, diff, cp):
        module.register(sub)
    p = sub.add_parser("demo", help="save, inspect, verify and load a small state on local disk",
                       description="Saves a small model-like training state, inspects, verifies "
                       "and loads it back, printing each step. Without --dir it works in a "
                       "temporary directory that it removes at the end, unless --keep.")
    p.add_argument("--dir", help="directory to write into (kept; default: a temporary one)")
    p.add_argument("--keep", action="store_true",
                   help="keep the temporary directory (and print where it is)")
    add_debug_option(p, default=argparse.SUPPRESS)
    p.set_defaults(fn=_cmd_demo)
    return parser


def _quiet_clients(debug: bool) -> None:
    if debug:
        logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
        logging.getLogger("pyckpt").setLevel(logging.INFO)
        return
    for name in _CLIENT_LOGGERS:
        logging.getLogger(name).setLevel(logging.CRITICAL + 1)


@contextlib.contextmanager
def _warnings_as_lines() -> Iterator[None]:
    """pyckpt's warnings (values a conversion leaves out, a skipped checkpoint...) as
    ``pyckpt: warning: ...`` lines on stderr, each shown once."""
    def show(message: Any, category: Any, filename: str, lineno: int, file: Any = None,
             line: Any = None) -> None:
        print(f"pyckpt: warning: {message}", file=sys.stderr)

    with warnings.catch_warnings():
        warnings.simplefilter("default")
        warnings.showwarning = show
        yield


def main(argv: list[str] | None = None) -> int:
    """Runs the ``pyckpt`` command line on ``argv`` (default ``sys.argv[1:]``); returns
    the exit status. A failure is printed to stderr as one line (status 1): for a
    remote store, its cause and fix (credentials, endpoint, network); ``--debug``
    adds the full traceback. A closed output pipe ends quietly (status 0)."""
    args = build_parser().parse_args(argv)
    _quiet_clients(args.debug)
    try:
        with _warnings_as_lines():
            return int(args.fn(args))
    except BrokenPipeError:  # `pyckpt inspect ... | head`
        return 0
    except KeyboardInterrupt:
        print("pyckpt: interrupted", file=sys.stderr)
        return 130
    except Exception as e:  # noqa: BLE001 - every failure becomes one line (--debug: all)
        return report_error(args, e)


if __name__ == "__main__":
    sys.exit(main())
