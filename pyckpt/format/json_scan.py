"""A streaming reader of a JSON object's top-level members, for the manifest.

``scan_members`` parses the members of a top-level object one at a time and
hands each value on as soon as it is parsed (to be converted to a compact
form), so that a large document never exists as Python objects all at once;
members named to be kept as text become ``LazyJSON`` and are parsed when first
used. Errors are ``json.JSONDecodeError`` (and ``RecursionError``), as from
``json.loads``.

``loads_untrusted`` parses a small JSON document of another program (a
safetensors header, a Hugging Face index) with a bound on nesting and no
duplicate member names; its only error is ``ValueError``.
"""

from __future__ import annotations

import contextlib
import gc
import json
import re
from dataclasses import dataclass
from typing import Any, Callable, Collection, Iterator

import numpy as np

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


#: nesting depth ``loads_untrusted`` accepts (serde_json's own limit, which the
#: safetensors library parses with, is 128)
MAX_UNTRUSTED_DEPTH = 128
_ESCAPE = re.compile(rb"\\.", re.DOTALL)
_STRING = re.compile(rb'"[^"]*"')  # once escapes are gone: no backtracking, no rescans
_NOT_STRUCTURAL = bytes(sorted(set(range(256)) - set(b'"[]{}')))
_STEP = np.zeros(256, dtype=np.int8)
_STEP[list(b"[{")], _STEP[list(b"]}")] = 1, -1
_DEPTH_CHUNK = 1 << 22


def nesting_depth(data: bytes) -> int:
    """The deepest nesting of arrays and objects in the JSON text ``data`` (brackets
    inside strings not counted), in time linear in its length and memory bounded by
    a chunk: a document too deep for ``json.loads`` (RecursionError) is measured
    without parsing it."""
    if b"\\" in data:
        data = _ESCAPE.sub(b"", data)
    text = _STRING.sub(b"", data.translate(None, _NOT_STRUCTURAL))
    depth, deepest = 0, 0
    for at in range(0, len(text), _DEPTH_CHUNK):
        steps = _STEP[np.frombuffer(text, np.uint8, min(_DEPTH_CHUNK, len(text) - at), at)]
        steps = steps[steps != 0]
        if steps.size:
            levels = np.cumsum(steps, dtype=np.int64) + depth
            deepest, depth = max(deepest, int(levels.max())), int(levels[-1])
    return deepest


def _unique_members(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    doc = dict(pairs)
    if len(doc) != len(pairs):
        seen: set[str] = set()
        for name, _ in pairs:
            if name in seen:
                raise ValueError(f"the member name {name!r} appears twice in one object")
            seen.add(name)
    return doc


def loads_untrusted(data: bytes) -> Any:
    """Parses the UTF-8 JSON text ``data`` written by another program: nesting deeper
    than ``MAX_UNTRUSTED_DEPTH`` and an object naming a member twice (``json.loads``
    keeps the last silently) are refused. Raises ``ValueError`` (a JSONDecodeError,
    UnicodeDecodeError, or a ValueError saying what is wrong), never RecursionError."""
    text = bytes(data)
    depth = nesting_depth(text) if text.count(b"[") + text.count(b"{") > MAX_UNTRUSTED_DEPTH else 0
    if depth > MAX_UNTRUSTED_DEPTH:
        raise ValueError(f"nested {depth} levels deep (at most {MAX_UNTRUSTED_DEPTH})")
    with no_cyclic_gc():
        return json.loads(text.decode("utf-8"), object_pairs_hook=_unique_members)


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
