"""A streaming reader of a JSON object's top-level members, for the manifest.

``scan_members`` parses the members of a top-level object one at a time and
hands each value on as soon as it is parsed (to be converted to a compact
form), so that a large document never exists as Python objects all at once;
members named to be kept as text become ``LazyJSON`` and are parsed when first
used. Errors are ``json.JSONDecodeError`` (and ``RecursionError``), as from
``json.loads``.
"""

from __future__ import annotations

import contextlib
import gc
import json
import re
from dataclasses import dataclass
from typing import Any, Callable, Collection, Iterator

_WS = re.compile(r"[ \t\n\r]*")
_scanstring: Callable[[str, int], tuple[str, int]] = getattr(json.decoder, "scanstring")

#: ``convert(name, value)``: what to keep of a member's parsed value
ConvertFn = Callable[[str, Any], Any]


@dataclass(slots=True)
class LazyJSON:
    """The text of a validated JSON object, parsed when first used."""

    text: str


@contextlib.contextmanager
def no_cyclic_gc() -> Iterator[None]:
    """Pauses the cyclic garbage collector (process-wide; re-enabled only by the caller
    that paused it): parsing allocates millions of containers, none in a cycle."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


def skip_ws(text: str, pos: int) -> int:
    """The position of the first non-whitespace character at or after ``pos``."""
    return _WS.match(text, pos).end()  # type: ignore[union-attr]


def scan_members(text: str, convert: ConvertFn, as_text: Collection[str] = ()) -> Any:
    """Parses ``text``: a top-level object member by member into a dict, where each
    member's value is replaced by ``convert(name, value)`` as soon as it is parsed,
    and the members named in ``as_text`` whose value is an object are kept as
    ``LazyJSON`` instead. Any other document is parsed whole (``json.loads``).
    The cyclic garbage collector is paused meanwhile (JSON makes no cycles;
    collections would double the time)."""
    with no_cyclic_gc():
        return _scan(text, convert, as_text)


def _scan(text: str, convert: ConvertFn, as_text: Collection[str]) -> Any:
    scan: Callable[[str, int], tuple[Any, int]] = getattr(json.JSONDecoder(), "scan_once")
    pos = skip_ws(text, 0)
    if not text.startswith("{", pos):
        return json.loads(text)  # not an object: the caller reports it
    doc: dict[str, Any] = {}
    pos = skip_ws(text, pos + 1)
    if text.startswith("}", pos):
        pos += 1
    else:
        while True:
            name, start = _member_name(text, pos)
            obj, pos = _value(scan, text, start)
            if name in as_text and isinstance(obj, dict):
                obj = LazyJSON(text[start:pos])
            else:
                obj = convert(name, obj)
            doc[name] = obj
            del obj  # converted: the parsed value is freed now
            pos = skip_ws(text, pos)
            if text.startswith(",", pos):
                pos = skip_ws(text, pos + 1)
                continue
            if text.startswith("}", pos):
                pos += 1
                break
            raise json.JSONDecodeError("Expecting ',' delimiter", text, pos)
    if skip_ws(text, pos) != len(text):
        raise json.JSONDecodeError("Extra data", text, pos)
    return doc


def _member_name(text: str, pos: int) -> tuple[str, int]:
    """The name of the member at ``pos`` and where its value starts (past the
    quoted name, the ':' and the whitespace around it)."""
    if not text.startswith('"', pos):
        raise json.JSONDecodeError("Expecting property name enclosed in double "
                                   "quotes", text, pos)
    name, pos = _scanstring(text, pos + 1)
    pos = skip_ws(text, pos)
    if not text.startswith(":", pos):
        raise json.JSONDecodeError("Expecting ':' delimiter", text, pos)
    return name, skip_ws(text, pos + 1)


def _value(scan: Callable[[str, int], tuple[Any, int]], text: str, at: int) -> tuple[Any, int]:
    """The JSON value at ``at`` and the position after it."""
    try:
        return scan(text, at)
    except StopIteration:
        raise json.JSONDecodeError("Expecting value", text, at) from None
