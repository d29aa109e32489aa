"""Shared pieces of the command line: storage options, output, progress bars."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any, Callable


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


def add_storage_options(p: argparse.ArgumentParser) -> None:
    """Adds the repeatable ``--storage-option KEY=VALUE`` argument (see ``parse_options``)."""
    p.add_argument("--storage-option", action="append", metavar="KEY=VALUE",
                   help="fsspec storage option (repeatable), e.g. endpoint_url=http://127.0.0.1:9000")


def add_output_options(p: argparse.ArgumentParser) -> None:
    """Adds ``--json`` (machine-readable output) and ``--quiet``/``-q`` (no progress bar)."""
    p.add_argument("--json", action="store_true", help="machine-readable output on stdout")
    p.add_argument("--quiet", "-q", action="store_true", help="no progress bar")


def progress_bar(args: argparse.Namespace, desc: str) -> tuple[Callable[[int, int], None] | None,
                                                                 Callable[[], None]]:
    """(callback, close) for a byte progress bar on stderr, or (None, no-op) when
    stderr is not a terminal, with --quiet or --json."""
    if getattr(args, "quiet", False) or getattr(args, "json", False) or not sys.stderr.isatty():
        return None, lambda: None
    from tqdm import tqdm

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
