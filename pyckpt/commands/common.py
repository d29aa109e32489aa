"""Shared pieces of the command line: storage options and the wait for a remote store,
errors as one line of cause and fix, output, natural key order, progress bars."""

from __future__ import annotations

import argparse
import json
import sys
import threading
import traceback
from typing import Any, Callable, Iterable

from ..errors import CheckpointError, StoreProblem
from ..storage import resolve
from ..storage.registry import import_client
from ..storage.diagnose import explain as _explain_store
from ..storage.diagnose import protocol_of as _protocol
from ..storage.diagnose import short as _short
from ..storage.options import RemoteOptions

#: seconds ``--timeout`` waits by default for a remote store's first answer
DEFAULT_TIMEOUT = 10.0


def parse_options(pairs: list[str] | None) -> dict | None:
    """``key=value`` pairs (values parsed as JSON when they can be; dotted keys nest)."""
    if not pairs:
        return None
    out: dict = {}
    for pair in pairs:
        key, sep, raw = pair.partition("=")
        if not sep or not key:
            raise SystemExit(f"pyckpt: --storage-option expects KEY=VALUE, got {pair!r}")
        try:
            value: Any = json.loads(raw)
        except ValueError:
            value = raw
        node = out
        *parents, leaf = key.split(".")
        for p in parents:
            node = node.setdefault(p, {})
        node[leaf] = value
    return out


def _positive(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number of seconds, got {text!r}") from None
    if not value > 0:
        raise argparse.ArgumentTypeError(f"expected a positive number of seconds, got {text!r}")
    return value


STORAGE_OPTION_HELP = ("fsspec storage option for remote URLs (repeatable; values are JSON "
                       "where they parse, dotted keys nest), e.g. endpoint_url=http://127.0.0.1:9000, "
                       "key=..., secret=..., anon=true, or pyckpt.deadline=120 (seconds an "
                       "operation may go without progress, default 60)")


def add_storage_options(p: argparse.ArgumentParser) -> None:
    """Adds the repeatable ``--storage-option KEY=VALUE`` argument (see ``parse_options``)
    and ``--timeout SECONDS`` (see ``reach``)."""
    p.add_argument("--storage-option", action="append", metavar="KEY=VALUE",
                   help=STORAGE_OPTION_HELP)
    p.add_argument("--timeout", type=_positive, default=DEFAULT_TIMEOUT, metavar="SECONDS",
                   help=f"seconds to wait for a remote store's first answer before giving up "
                        f"(default {DEFAULT_TIMEOUT:g}); raise it for a slow endpoint. Once the "
                        "store has answered, an operation gives up after pyckpt.deadline "
                        "seconds without progress (--storage-option pyckpt.deadline=SECONDS)")


def add_debug_option(p: argparse.ArgumentParser, default: Any = False) -> None:
    """Adds ``--debug``: the full traceback of a failure, and the storage clients' logs.
    (A subcommand's copy has ``default=argparse.SUPPRESS``, so that it does not undo a
    ``--debug`` given before the subcommand.)"""
    p.add_argument("--debug", action="store_true", default=default,
                   help="on failure, print the full traceback (and the storage clients' "
                        "warnings) besides the one-line message")


def add_output_options(p: argparse.ArgumentParser) -> None:
    """Adds ``--json`` (machine-readable output), ``--quiet``/``-q`` (no progress bar) and
    the subcommand's ``--debug``."""
    p.add_argument("--json", action="store_true", help="machine-readable output on stdout")
    p.add_argument("--quiet", "-q", action="store_true", help="no progress bar")
    add_debug_option(p, default=argparse.SUPPRESS)


# -- remote stores: the first answer, and errors as cause and fix --------------------------

def is_remote(url: Any) -> bool:
    """Whether ``url`` names a remote (fsspec) store rather than a local path."""
    return isinstance(url, str) and "://" in url and not url.startswith("file://")


def reach(args: argparse.Namespace, url: str, options: dict | None) -> None:
    """Makes sure the store of a remote ``url`` answers, within ``args.timeout`` seconds
    (a cheap existence check whose operation has that deadline), so that a command
    against an endpoint that does not answer fails quickly; the command's own
    operations then have the storage options' limits. A failure with a known cause
    raises StoreProblem; local paths are not checked."""
    if not is_remote(url):
        return
    timeout = float(getattr(args, "timeout", DEFAULT_TIMEOUT))
    so = dict(options or {})
    mine = so.get("pyckpt")
    if mine is None or isinstance(mine, dict):  # anything else: resolve reports it
        defaults = RemoteOptions()
        mine = dict(mine or {})
        mine["deadline"] = timeout
        for name in ("stall_timeout", "cleanup_timeout"):
            mine[name] = min(float(mine.get(name, getattr(defaults, name))), timeout)
        so["pyckpt"] = mine
    outcome: list[BaseException | None] = []

    def check() -> None:
        try:
            store, path = resolve(url, so)
            store.exists(path)
            outcome.append(None)
        except BaseException as e:  # noqa: BLE001 - reported by the caller's thread
            outcome.append(e)

    # the whole check, the client's own search for credentials included (gcsfs asks
    # a metadata server before any request), is bounded by --timeout; the client's
    # modules are imported first (not waiting for the store), and the store's own
    # verdict (refused, no answer...) gets a grace of 2 s to come first
    import_client(url)
    worker = threading.Thread(target=check, name="pyckpt-reach", daemon=True)
    worker.start()
    worker.join(timeout + 2.0)
    if not outcome:
        raise StoreProblem(
            f"cannot reach the store of {url} (no answer within --timeout {timeout:g} s, the "
            "client's search for credentials included): check the endpoint URL "
            "(--storage-option endpoint_url=URL), the credentials and the network; a slow "
            "endpoint may need a longer --timeout")
    if outcome[0] is not None:
        e = outcome[0]
        message = explain(e, url=url, options=options, timeout=timeout)
        if message is None:
            raise e
        raise StoreProblem(message) from e


def explain(exc: BaseException, *, url: str | None = None, options: dict | None = None,
            timeout: float | None = None, proto: str | None = None) -> str | None:
    """``storage.diagnose.explain`` with the command line's fixes (``--storage-option``,
    ``--timeout``)."""
    return _explain_store(exc, url=url, options=options, timeout=timeout, proto=proto, cli=True)


def describe_error(exc: BaseException, args: argparse.Namespace | None = None) -> str:
    """The one line that reports a command's failure: the cause and fix of a remote
    store's failure (``explain``), else the error's own message (its class too when it
    is not one of the errors commands expect)."""
    if isinstance(exc, StoreProblem):
        return str(exc)
    remote = [u for u in _urls(args) if is_remote(u)]
    message = explain(exc, url=remote[0] if len(set(remote)) == 1 else None,
                      options=_options_of(args) if remote else None,
                      proto=_protocol(remote[0]) if remote else None)
    if message is not None:
        return message
    if isinstance(exc, (CheckpointError, OSError, ValueError, ImportError)):
        return str(exc) or type(exc).__name__
    if isinstance(exc, KeyError):
        return str(exc.args[0]) if exc.args else "KeyError"
    return f"{_short(exc, 400)} (--debug shows the traceback)"


def _urls(args: argparse.Namespace | None) -> Iterable[Any]:
    for name in ("path", "a", "b", "src", "dst"):
        value = getattr(args, name, None)
        if value is not None:
            yield value


def _options_of(args: argparse.Namespace | None) -> dict | None:
    out: dict = {}
    for name in ("storage_option", "src_storage_option", "dst_storage_option"):
        out.update(parse_options(getattr(args, name, None)) or {})
    return out or None


def report_error(args: argparse.Namespace | None, exc: BaseException, prefix: str = "") -> int:
    """Prints a failure as one line on stderr (``pyckpt: <prefix><describe_error>``),
    after its full traceback with ``--debug``; returns exit status 1."""
    if getattr(args, "debug", False):
        traceback.print_exception(type(exc), exc, exc.__traceback__, file=sys.stderr)
    print(f"pyckpt: {prefix}{describe_error(exc, args)}", file=sys.stderr)
    return 1


# -- output -----------------------------------------------------------------------------

def printable(text: Any) -> str:
    """``text`` for one line of a terminal: unchanged when every character prints;
    else newlines, tabs and other control or unprintable characters are escaped as in
    Python literals (``\\n``, ``\\x1b``), and backslashes doubled."""
    text = str(text)
    if text.isprintable():
        return text
    return "".join("\\\\" if c == "\\" else c if c.isprintable() else repr(c)[1:-1]
                   for c in text)


def progress_bar(args: argparse.Namespace, desc: str) -> tuple[Callable[[int, int], None] | None,
                                                                 Callable[[], None]]:
    """(callback, close) for a byte progress bar on stderr, or (None, no-op) when
    stderr is not a terminal, with --quiet or --json."""
    if getattr(args, "quiet", False) or getattr(args, "json", False) or not sys.stderr.isatty():
        return None, lambda: None
    from tqdm import tqdm  # optional dependency: only drawn on a terminal

    bar = tqdm(total=None, desc=desc, unit="B", unit_scale=True, unit_divisor=1024, leave=True,
               file=sys.stderr)

    def update(done: int, total: int) -> None:
        if bar.total != total:
            bar.total = total
        bar.update(done - bar.n)

    def close() -> None:
        bar.refresh()  # the final state, however fast the operation was
        bar.close()

    return update, close


def emit_json(obj: Any) -> None:
    """Writes ``obj`` to stdout as indented JSON (``str()`` of what JSON cannot hold)."""
    json.dump(obj, sys.stdout, indent=2, default=str)
    sys.stdout.write("\n")


def human(n: float) -> str:
    """A byte count for people: ``512 B``, ``1.5 KiB`` ... ``TiB`` (powers of 1024)."""
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TiB"


def fail(msg: str) -> int:
    """Prints ``pyckpt: <msg>`` to stderr; returns exit status 1."""
    print(f"pyckpt: {msg}", file=sys.stderr)
    return 1
