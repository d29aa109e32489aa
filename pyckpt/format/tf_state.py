"""TensorFlow's ``checkpoint`` state file (docs/TF_FORMAT.md section 6): the text
format of the ``CheckpointState`` protobuf that ``tf.train.CheckpointManager``
and ``tf.compat.v1.train.Saver`` keep beside their checkpoints::

    model_checkpoint_path: "ckpt-5"
    all_model_checkpoint_paths: "ckpt-3"
    all_model_checkpoint_paths: "ckpt-4"
    all_model_checkpoint_paths: "ckpt-5"
    all_model_checkpoint_timestamps: 1763776000.5
    ...
    last_preserved_timestamp: 1763775000.25

Paths in it are input from storage. ``checkpoint_name`` reduces each to the
last component of the path, which must be a plain name: the checkpoint it
names is always ``<directory>/<name>``, never a path outside the directory
(an absolute path written by the TF1 Saver in a directory that was moved
since resolves to the checkpoint of that name in the directory).
"""

from __future__ import annotations

import dataclasses
import math

from ..errors import CorruptCheckpointError, StateFileSyntaxError

__all__ = ["STATE_NAME", "TFState", "parse_state", "format_state", "checkpoint_name"]

STATE_NAME = "checkpoint"
MAX_STATE_BYTES = 16 << 20

_ESCAPES = {"n": "\n", "t": "\t", "r": "\r", "a": "\a", "b": "\b", "f": "\f", "v": "\v",
            "\\": "\\", "'": "'", '"': '"', "?": "?"}


@dataclasses.dataclass
class TFState:
    """The fields of a CheckpointState (paths as written, unresolved)."""

    model_checkpoint_path: str | None = None
    all_model_checkpoint_paths: list[str] = dataclasses.field(default_factory=list)
    all_model_checkpoint_timestamps: list[float] = dataclasses.field(default_factory=list)
    last_preserved_timestamp: float | None = None


def _tokens(text: str) -> list[tuple[str, object]]:
    """(kind, value) tokens: ident, string, number, ':', '{', '}', ...; comments dropped."""
    out: list[tuple[str, object]] = []
    i, n = 0, len(text)
    while i < n:
        c = text[i]
        if c in " \t\r\n\f\v,;":
            i += 1
        elif c == "#":
            j = text.find("\n", i)
            i = n if j < 0 else j + 1
        elif c in ":{}[]<>":
            out.append((c, c))
            i += 1
        elif c in "\"'":
            value, i = _string(text, i)
            if out and out[-1][0] == "string":  # adjacent literals concatenate
                out[-1] = ("string", str(out[-1][1]) + value)
            else:
                out.append(("string", value))
        else:
            j = i
            while j < n and (text[j].isalnum() or text[j] in "_.+-"):
                j += 1
            if j == i:
                raise StateFileSyntaxError(f"unexpected character {c!r} at offset {i}")
            word = text[i:j]
            out.append(("ident" if word[0].isalpha() or word[0] == "_" else "number", word))
            i = j
    return out


def _string(text: str, i: int) -> tuple[str, int]:
    quote = text[i]
    i += 1
    raw = bytearray()
    n = len(text)
    while True:
        if i >= n or text[i] == "\n":
            raise StateFileSyntaxError("unterminated string")
        c = text[i]
        if c == quote:
            break
        if c != "\\":
            raw += c.encode("utf-8")
            i += 1
            continue
        if i + 1 >= n:
            raise StateFileSyntaxError("unterminated escape")
        e = text[i + 1]
        if e in _ESCAPES:
            raw += _ESCAPES[e].encode()
            i += 2
        elif e in "01234567":
            j = i + 1
            while j < min(n, i + 4) and text[j] in "01234567":
                j += 1
            raw.append(int(text[i + 1:j], 8) & 0xFF)
            i = j
        elif e in "xX":
            j = i + 2
            while j < min(n, i + 4) and text[j] in "0123456789abcdefABCDEF":
                j += 1
            if j == i + 2:
                raise StateFileSyntaxError("bad \\x escape")
            raw.append(int(text[i + 2:j], 16))
            i = j
        else:
            raise StateFileSyntaxError(f"unknown escape \\{e}")
    try:
        return raw.decode("utf-8"), i + 1
    except UnicodeDecodeError:
        raise StateFileSyntaxError("a path is not UTF-8") from None


def _number(token: tuple[str, object]) -> float:
    kind, value = token
    if kind not in ("number", "ident"):
        raise StateFileSyntaxError(f"expected a number, got {value!r}")
    word = str(value).lower().rstrip("f") if str(value).lower() not in ("inf", "-inf") else str(value)
    try:
        x = float(word)
    except ValueError:
        raise StateFileSyntaxError(f"bad number {value!r}") from None
    return x


def parse_state(data: bytes, url: str = "checkpoint") -> TFState:
    """Decodes the text of a ``checkpoint`` file; CorruptCheckpointError naming the
    file when it is not a CheckpointState in text format. Unknown fields are skipped."""
    if len(data) > MAX_STATE_BYTES:
        raise CorruptCheckpointError(f"TensorFlow state file {url} has {len(data)} bytes, "
                                     f"more than {MAX_STATE_BYTES}")
    state = TFState()
    try:
        toks = _tokens(data.decode("utf-8"))
        k = 0
        while k < len(toks):
            kind, name = toks[k]
            if kind != "ident":
                raise StateFileSyntaxError(f"expected a field name, got {name!r}")
            k += 1
            if k < len(toks) and toks[k][0] == ":":
                k += 1
            if k >= len(toks):
                raise StateFileSyntaxError(f"field {name} has no value")
            if toks[k][0] in ("{", "<"):  # a message value: skip it, balanced
                depth = 0
                while k < len(toks):
                    depth += toks[k][0] in ("{", "<")
                    depth -= toks[k][0] in ("}", ">")
                    k += 1
                    if depth == 0:
                        break
                if depth:
                    raise StateFileSyntaxError(f"unbalanced braces in field {name}")
                continue
            values = []
            if toks[k][0] == "[":
                k += 1
                while k < len(toks) and toks[k][0] != "]":
                    values.append(toks[k])
                    k += 1
                if k >= len(toks):
                    raise StateFileSyntaxError(f"unterminated list in field {name}")
                k += 1
            else:
                values.append(toks[k])
                k += 1
            for tok in values:
                if name in ("model_checkpoint_path", "all_model_checkpoint_paths"):
                    if tok[0] != "string":
                        raise StateFileSyntaxError(f"{name} must be a string, got {tok[1]!r}")
                    if name == "model_checkpoint_path":
                        state.model_checkpoint_path = str(tok[1])
                    else:
                        state.all_model_checkpoint_paths.append(str(tok[1]))
                elif name == "all_model_checkpoint_timestamps":
                    state.all_model_checkpoint_timestamps.append(_number(tok))
                elif name == "last_preserved_timestamp":
                    state.last_preserved_timestamp = _number(tok)
    except (StateFileSyntaxError, UnicodeDecodeError) as e:
        raise CorruptCheckpointError(f"TensorFlow state file {url} is not a CheckpointState in "
                                     f"text format: {e}") from None
    return state


def _quote(s: str) -> str:
    out = []
    for b in s.encode("utf-8"):
        c = chr(b)
        if c in "\"\\":
            out.append("\\" + c)
        elif 32 <= b < 127:
            out.append(c)
        else:
            out.append(f"\\{b:03o}")
    return '"' + "".join(out) + '"'


def _float(x: float) -> str:
    return repr(float(x)) if math.isfinite(x) else ("inf" if x > 0 else "-inf" if x < 0 else "nan")


def format_state(state: TFState) -> bytes:
    """The text TensorFlow writes for a CheckpointState."""
    lines = []
    if state.model_checkpoint_path is not None:
        lines.append(f"model_checkpoint_path: {_quote(state.model_checkpoint_path)}")
    lines += [f"all_model_checkpoint_paths: {_quote(p)}" for p in state.all_model_checkpoint_paths]
    lines += [f"all_model_checkpoint_timestamps: {_float(t)}"
              for t in state.all_model_checkpoint_timestamps]
    if state.last_preserved_timestamp is not None:
        lines.append(f"last_preserved_timestamp: {_float(state.last_preserved_timestamp)}")
    return ("\n".join(lines) + "\n").encode("utf-8")


def checkpoint_name(path: str, url: str = "checkpoint") -> str:
    """The plain name of the checkpoint a state file path designates: its last
    component (``ckpt-5``, ``/old/place/model.ckpt-100`` -> ``model.ckpt-100``).
    CorruptCheckpointError when there is none (``""``, ``..``, ``a/``, NUL)."""
    name = path.replace("\\", "/").rsplit("/", 1)[-1]
    if not name or name in (".", "..") or "\0" in name:
        raise CorruptCheckpointError(f"TensorFlow state file {url} names {path!r}, which is not "
                                     "a checkpoint inside its directory")
    return name
