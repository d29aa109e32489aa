"""Flattening nested containers ("trees") into ``/``-joined keys and back.

A tree is a nested ``dict`` / ``list`` / ``tuple`` whose leaves are arrays
(ndarray, Variable, numpy or Python scalars, and adapter types such as torch
tensors) or small static values (``str``, ``None``, ``bytes``). Keys are the
path of container keys/indices joined by ``/`` (``layers/0/w``).

The structure itself is kept as a JSON "skeleton" (docs/FORMAT.md, "Tree")
so that ``load`` rebuilds exactly what was saved.
"""

from __future__ import annotations

import base64
import re
import sys
from itertools import repeat
from typing import Any, Callable, Iterable, Sequence

import numpy as np

from ._dtypes import refuse_masked
from .device.array import DeviceArray
from .registry import from_host, leaf_adapter
from .sharded import ShardedArray
from .variables import Variable

__all__ = ["validate_key", "check_utf8", "describe_value", "not_a_tree_error", "flatten", "unflatten", "nest_flat",
           "skeleton_leaves", "static_values", "rebuild_leaf", "replacement_scalar", "is_array_kind",
           "SCALAR_KINDS", "Leaf", "keyed_error",
           "path_trie", "paired_leaves"]

_MAX_DEPTH = 512


def validate_key(key: str) -> str:
    """Checks a flat key: ``/``-separated parts, none empty, ``.`` or ``..``.

    Keys are names inside a checkpoint, never file paths, but they are still
    refused when they look like a path escape so that no tool that maps keys
    to files can be tricked.
    """
    if not isinstance(key, str):
        raise TypeError(f"checkpoint keys must be strings, got {type(key).__name__}: {key!r}")
    if not key:
        raise ValueError("empty checkpoint key")
    if key.startswith("/"):
        raise ValueError(f"checkpoint key {key!r} starts with '/'")
    for part in key.split("/"):
        if part in ("", ".", ".."):
            raise ValueError(f"checkpoint key {key!r} has an empty, '.' or '..' component")
    if "\x00" in key:
        raise ValueError(f"checkpoint key {key!r} contains a NUL character")
    if _not_utf8(key):
        raise ValueError(_not_utf8_message("checkpoint key", key))
    return key


def _not_utf8(text: str) -> bool:
    """Whether ``text`` cannot be encoded as UTF-8: it holds a lone surrogate, which no
    file format pyckpt writes or reads can store (its own JSON manifest, safetensors,
    TensorFlow's and DCP's names are UTF-8)."""
    if text.isascii():
        return False
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return True
    return False


def _not_utf8_message(what: str, text: str) -> str:
    return f"{what} {text!r} is not valid UTF-8 text (it holds a lone surrogate)"


def check_utf8(names: Sequence[str], what: str = "checkpoint key") -> None:
    """Raises ValueError naming the first of ``names`` (strings) that does not encode
    as UTF-8: ``validate_key``'s rule, for names held to this rule alone (a
    safetensors tensor name is not a checkpoint key: ``a//b`` is a valid one)."""
    if _not_utf8("".join(names)):
        for name in names:
            if _not_utf8(name):
                raise ValueError(_not_utf8_message(what, name))


def validate_keys(keys: Sequence[str]) -> None:
    """``validate_key`` of every key, and no key twice: the one check of a key list
    (writers, the multi-worker planner and the manifest validator all use it).
    Fast for 10^6 keys: the common all-valid case is checked on the joined text,
    and only a list that fails it is walked key by key to name the culprit.
    Raises TypeError/ValueError naming the key."""
    n = len(keys)
    try:
        blob = "\x00".join(keys)  # NUL is not allowed in keys: a safe separator
    except TypeError:
        blob = None
    if blob is None or blob.count("\x00") != max(n - 1, 0) or _bad_components(blob, n) \
            or _not_utf8(blob):
        for k in keys:
            validate_key(k)
    del blob
    if len(set(keys)) != n:
        seen: set[str] = set()
        for k in keys:
            if k in seen:
                raise ValueError(f"key {k!r} is listed twice")
            seen.add(k)


def _bad_components(blob: str, n: int) -> bool:
    """Whether some key of the NUL-joined ``blob`` of n keys is empty, starts with
    '/', or has an empty, ``.`` or ``..`` component (``validate_key``'s rules, on
    all keys at once)."""
    if n == 0:
        return False
    t = "/" + blob.replace("\x00", "/") + "/"  # key boundaries act as separators
    return "//" in t or "/./" in t or "/../" in t


# ---------------------------------------------------------------------------
# Leaves
# ---------------------------------------------------------------------------


class Leaf:
    """A leaf found while flattening: its key, the array to store and how to rebuild it."""

    __slots__ = ("key", "array", "kind", "obj")

    def __init__(self, key: str, array: np.ndarray | DeviceArray, kind: str, obj: Any) -> None:
        self.key = key
        self.array = array
        self.kind = kind  # "ndarray", a SCALAR_KINDS entry, or an adapter's name ("torch")
        self.obj = obj    # the original leaf object


_INT64_MIN, _INT64_MAX = -(1 << 63), (1 << 63) - 1

_PY_KINDS = {bool: ("bool", np.bool_), int: ("int", np.int64), float: ("float", np.float64),
             complex: ("complex", np.complex128)}


def as_array_leaf(obj: Any) -> tuple[np.ndarray | DeviceArray, str] | None:
    """(array, kind) when obj is an array-like leaf (a DeviceArray for a value in
    device memory), else None."""
    t = type(obj)
    if t is np.ndarray:
        return obj, "ndarray"
    if isinstance(obj, np.ndarray):  # a subclass
        refuse_masked(obj)
        return obj, "ndarray"
    if isinstance(obj, Variable):
        return obj._value, "ndarray"
    if t in _PY_KINDS:
        kind, dt = _PY_KINDS[t]
        if t is int and not _INT64_MIN <= obj <= _INT64_MAX:
            return np.array(int_text(obj)), kind  # exactly, as a 0-d text tensor
        return np.array(obj, dtype=dt), kind
    if isinstance(obj, np.generic):
        return np.asarray(obj), "numpy_scalar"
    if isinstance(obj, ShardedArray):  # one worker's block; saved through the sharded path
        return obj.local, "ndarray"
    found = leaf_adapter(obj)  # torch, JAX, user types (pyckpt.registry)
    return None if found is None else (found[1], found[0])  # kind: the adapter's name


def keyed_error(e: BaseException, key: Any) -> Exception:
    """``e`` (a TypeError, ValueError or RuntimeError, e.g. a framework's refusal of a
    tensor) as the same kind of error whose message starts with the key it is about."""
    cls = TypeError if isinstance(e, TypeError) else \
        ValueError if isinstance(e, ValueError) else RuntimeError
    return cls(f"{key!r}: {e}")


def _static(obj: Any) -> dict | None:
    if obj is None or isinstance(obj, str):
        return {"v": obj}
    if isinstance(obj, (bytes, bytearray)):
        return {"b": base64.b64encode(bytes(obj)).decode("ascii")}
    return None


_INT_TEXT = re.compile(r"-?(?:0|[1-9][0-9]*|0x[0-9a-f]+)")


def int_text(n: int) -> str:
    """An int as exact text (how ints beyond int64 are stored: a 0-d text tensor):
    decimal, or hexadecimal ("0x...") when it has more digits than Python converts
    to decimal (sys.get_int_max_str_digits)."""
    try:
        return str(n)
    except ValueError:
        return ("-" if n < 0 else "") + hex(abs(n))


def text_int(text: Any) -> int:
    """The inverse of ``int_text``; ValueError for anything else."""
    if not isinstance(text, str) or not _INT_TEXT.fullmatch(text):
        raise ValueError(f"malformed integer text {text!r}")
    return int(text, 16) if "x" in text else int(text)


def static_leaf(obj: Any) -> dict | None:
    """The skeleton node of a leaf kept in the skeleton itself (str, None, bytes;
    docs/FORMAT.md section 8), else None."""
    return _static(obj)


def _join(prefix: str | None, part: Any) -> str:
    if isinstance(part, bool) or not isinstance(part, (str, int)):
        raise TypeError(f"tree keys must be str or int, got {type(part).__name__} {part!r}"
                        + (f" under {prefix!r}" if prefix else ""))
    part = str(part)
    if _not_utf8(part):  # a container name is stored in the skeleton, UTF-8 JSON
        raise ValueError(_not_utf8_message("tree key", part)
                         + (f" under {prefix!r}" if prefix else ""))
    return part if prefix is None else f"{prefix}/{part}"


# Skeleton nodes (docs/FORMAT.md, "Tree"):
#   "key"                          an array leaf stored under that key
#   {"s": key, "as": kind}         a scalar leaf (int/float/bool/complex/numpy_scalar)
#   {"d": [[name, node], ...]}     dict (names are str or int)
#   {"l": [node, ...]}             list
#   {"u": [node, ...]}             tuple
#   {"v": str | null}              static value
#   {"b": base64}                  bytes

def describe_value(obj: Any) -> str:
    """A short description of what was given, for error messages: "an int", "a str",
    "a numpy.ndarray of shape (3,) and dtype float64", "a torch.Tensor of shape ..."."""
    t = type(obj)
    if obj is None:
        return "None"
    if t in (bytes, bytearray):
        return f"a {t.__name__} object"
    if t in _PY_KINDS or t is str:
        return ("an " if t.__name__[0] in "aeiou" else "a ") + t.__name__
    mod = t.__module__ or "builtins"
    top = mod.split(".")[0]
    jax = sys.modules.get("jax")
    if top in ("jax", "jaxlib") and jax is not None and isinstance(obj, jax.Array):
        name = "jax.Array"
    elif mod == "builtins":
        name = t.__qualname__
    elif getattr(sys.modules.get(top), t.__qualname__, None) is t:  # exported at the top
        name = f"{top}.{t.__qualname__}"
    else:
        name = f"{mod}.{t.__qualname__}"
    shape, dtype = getattr(obj, "shape", None), getattr(obj, "dtype", None)
    if shape is not None and not isinstance(obj, np.generic):
        try:
            name += f" of shape {tuple(shape)}" + (f" and dtype {dtype}" if dtype is not None else "")
        except TypeError:
            pass
    return ("an " if name[0].lower() in "aeiou" else "a ") + name


def not_a_tree_error(obj: Any, caller: str) -> TypeError:
    """The error for a root that is not a dict, list or tuple (module doc: a tree)."""
    head = f"{caller} needs a tree (a dict, list or tuple of arrays); got {describe_value(obj)}"
    if obj is None or as_array_leaf(obj) is not None or _static(obj) is not None:
        value = "array" if getattr(obj, "shape", ()) != () else "value"
        hint = f": give it a name, e.g. {{'x': {value}}}"
        if isinstance(obj, str):
            hint += f" (the tree comes first: {caller}(tree, path))"
        return TypeError(head + hint)
    if callable(getattr(obj, "state_dict", None)):
        return TypeError(f"{head}: save its state, e.g. {{'model': obj.state_dict()}}")
    if hasattr(obj, "save_counter") and callable(getattr(obj, "write", None)):
        return TypeError(f"{head}: a Checkpoint saves itself (checkpoint.write(path) or "
                         "checkpoint.save(prefix))")
    return TypeError(f"{head}, which pyckpt cannot save: leaves must be arrays, Variables, "
                     "numbers, str, bytes or None, inside a dict, list or tuple")


def _not_a_leaf_error(obj: Any, key: str) -> TypeError:
    """The error for a value inside a tree that is no leaf pyckpt can save, with the
    same hint as for such a root (``not_a_tree_error``) where one fits."""
    head = f"cannot save {describe_value(obj)} at {key!r}"
    if callable(getattr(obj, "state_dict", None)):
        return TypeError(f"{head}: save its state, e.g. {{{key.rsplit('/', 1)[-1]!r}: "
                         "obj.state_dict()}, or track it in a pyckpt.Checkpoint")
    return TypeError(f"{head}: leaves must be arrays, Variables, numbers, str, bytes or None")


def flatten(tree: Any, prefix: str = "", *, caller: str = "pyckpt.save") -> tuple[list[Leaf], Any]:
    """Returns the leaves (in tree order) and the JSON skeleton of ``tree``. Without a
    ``prefix`` the root must be a dict, list or tuple: anything else raises TypeError
    saying what was given (``caller`` names the function in that message)."""
    if not prefix and not isinstance(tree, (dict, list, tuple)):
        raise not_a_tree_error(tree, caller)
    leaves: list[Leaf] = []
    skeleton = _flatten_node(tree, prefix or None, 0, leaves, set())
    return leaves, skeleton


# The recursive walks of this module are module-level functions, not closures: a
# closure that calls itself is a reference cycle, and it would keep what it captured
# (a checkpoint's arrays) alive until the cyclic collector happens to run.
def _flatten_node(node: Any, key: str | None, depth: int, leaves: list[Leaf],
                  seen: set[str]) -> Any:
    """``flatten``'s skeleton of ``node``, its leaves appended to ``leaves``."""
    if depth > _MAX_DEPTH:
        raise ValueError(f"tree nested deeper than {_MAX_DEPTH} levels at {key!r}")
    if isinstance(node, dict):
        return {"d": [[k, _flatten_node(v, _join(key, k), depth + 1, leaves, seen)]
                      for k, v in node.items()]}
    if isinstance(node, (list, tuple)):
        tag = "l" if isinstance(node, list) else "u"
        return {tag: [_flatten_node(v, _join(key, i), depth + 1, leaves, seen)
                      for i, v in enumerate(node)]}
    try:
        leaf = as_array_leaf(node)
    except (TypeError, ValueError, RuntimeError) as e:  # an adapter's, or a masked array
        raise keyed_error(e, key) from e
    if leaf is not None:
        assert key is not None  # the root is a container or has a prefix (flatten)
        validate_key(key)
        if key in seen:
            raise ValueError(f"two leaves of the tree map to the same key {key!r}")
        seen.add(key)
        arr, kind = leaf
        leaves.append(Leaf(key, arr, kind, node))
        return key if kind == "ndarray" else {"s": key, "as": kind}
    static = _static(node)
    if static is not None:
        if isinstance(node, str) and _not_utf8(node):
            raise ValueError(f"{key or '<root>'!r}: " + _not_utf8_message("the str value", node))
        return static
    raise _not_a_leaf_error(node, key or "<root>")


def paired_leaves(a: Any, b: Any) -> tuple[list, list] | None:
    """The leaves of two trees of one plain structure, in pairs and in tree order:
    dicts with the same keys, lists with lists and tuples with tuples of one
    length, nested alike. None when the structures differ in any way, when a key is
    not a str that ``flatten`` takes as it is (a non-empty key part: no ``/``, not
    ``.`` or ``..``), or when a tree nests too deep: then the caller matches by flat
    keys, whose errors name what differs (``copy_state``'s fast path)."""
    if not isinstance(a, (dict, list, tuple)) or not isinstance(b, (dict, list, tuple)):
        return None
    xs: list = []
    ys: list = []
    return (xs, ys) if _pair(a, b, 0, xs, ys) else None


def _pair(a: Any, b: Any, depth: int, xs: list, ys: list) -> bool:
    """``paired_leaves`` below the containers ``a`` and ``b`` (leaves handled here,
    not by a call each: trees hold thousands)."""
    if depth > _MAX_DEPTH:
        return False
    if isinstance(a, dict):
        if not isinstance(b, dict) or len(a) != len(b):
            return False
        if _leaf_dicts(a, b, xs, ys):
            return True
        pairs: Iterable = ((v, b.get(k, _ABSENT)) for k, v in a.items()
                           if k in _PLAIN_PARTS or _plain_part(k))
        n = len(a)
    elif isinstance(b, (list, tuple)) and isinstance(a, list) == isinstance(b, list) \
            and len(a) == len(b):
        pairs, n = zip(a, b), len(a)
    else:
        return False
    count = 0
    for v, w in pairs:
        count += 1
        if isinstance(v, (dict, list, tuple)):
            if not _pair(v, w, depth + 1, xs, ys):
                return False
        elif w is _ABSENT or isinstance(w, (dict, list, tuple)):
            return False
        else:
            xs.append(v)
            ys.append(w)
    return count == n  # every key was plain


_ABSENT = object()
_PLAIN_PARTS: set[str] = set()  # keys seen to be plain (bounded)
_NESTS = (dict, list, tuple)


def _leaf_dicts(a: dict, b: dict, xs: list, ys: list) -> bool:
    """``_pair`` of two dicts with the same plain keys (all seen before) in one order and
    no container among their values, in C-level passes (no Python step per pair):
    True, their values added; else False, nothing added."""
    keys = list(a)
    if keys != list(b) or not _PLAIN_PARTS.issuperset(keys):
        return False
    va, vb = list(a.values()), list(b.values())
    if any(map(isinstance, va, repeat(_NESTS))) or any(map(isinstance, vb, repeat(_NESTS))):
        return False
    xs.extend(va)
    ys.extend(vb)
    return True


def _plain_part(k: Any) -> bool:
    """A dict key that ``flatten`` keeps as one part of a valid flat key."""
    ok = type(k) is str and bool(k) and "/" not in k and k != "." and k != ".." \
        and "\x00" not in k
    if ok and len(_PLAIN_PARTS) < 65536:
        _PLAIN_PARTS.add(k)
    return ok


_SCALARS = {"int": int, "float": float, "bool": bool, "complex": complex}

#: Leaf kinds stored as 0-d arrays and rebuilt as Python or numpy scalars; every other
#: kind ("ndarray", or the name of the framework a tensor came from) is an array.
SCALAR_KINDS = frozenset(_SCALARS) | {"numpy_scalar"}


def is_array_kind(kind: str) -> bool:
    """Whether a leaf of ``kind`` is an array (an ndarray or a framework's tensor),
    not a scalar."""
    return kind not in SCALAR_KINDS


def is_framework_kind(kind: str) -> bool:
    """Whether a leaf of ``kind`` is a framework's array (an adapter's name, such as
    "torch"), rebuilt by that adapter."""
    return kind.isidentifier() and kind != "ndarray" and is_array_kind(kind)


def rebuild_leaf(kind: str, arr: np.ndarray | DeviceArray) -> Any:
    """The leaf of ``kind`` (as ``flatten`` recorded it: "ndarray", "numpy_scalar",
    "int", "float", "bool", "complex"; or an adapter's name such as "torch", for the
    tensors of a state dict: that framework's host array, or, from a DeviceArray,
    its own array on its device) from its loaded array; ValueError for another."""
    if isinstance(arr, DeviceArray):
        if not is_framework_kind(kind):
            raise ValueError(f"a leaf of kind {kind!r} cannot come from device memory")
        return arr.obj
    if kind == "ndarray":
        return arr
    if kind == "numpy_scalar":
        return arr[()]
    if kind in _SCALARS:
        if kind == "int" and arr.dtype.kind == "U":  # beyond int64: exact text
            return text_int(str(arr[()]))
        return _SCALARS[kind](arr[()])
    if kind.isidentifier():
        return from_host(kind, arr)
    raise ValueError(f"unknown leaf kind {kind!r}")


_rebuild_leaf = rebuild_leaf

#: a Python scalar's type by the kind of a 0-d array's dtype
_BY_DTYPE_KIND: dict[str, Callable[[Any], Any]] = {
    "b": bool, "i": int, "u": int, "f": float, "c": complex}


def replacement_scalar(stored_kind: str | None, arr: np.ndarray, target_kind: str) -> Any:
    """The value that replaces a scalar leaf of ``target_kind`` (``load(into=)``,
    ``copy_state``) from its source's 0-d array: the source's value as it was saved
    (``stored_kind``, a SCALAR_KINDS entry: a float stays a float in an int's
    place, the target's type is never imposed); where the source's kind is not
    known or is an array's, a Python scalar of the array's dtype (a numpy scalar
    for a numpy-scalar target, or for a dtype Python has no scalar for)."""
    if stored_kind is not None and not is_array_kind(stored_kind):
        return rebuild_leaf(stored_kind, arr)
    if target_kind == "int" and arr.dtype.kind == "U":  # an int beyond int64, as text
        return rebuild_leaf("int", arr)
    make = _BY_DTYPE_KIND.get(arr.dtype.kind)
    if make is None or target_kind == "numpy_scalar":
        return arr[()]
    return make(arr[()])


def unflatten(skeleton: Any, values: dict[str, Any],
              rebuild: Callable[[str, Any], Any] | None = None) -> Any:
    """Rebuilds the saved structure from its skeleton and the loaded arrays;
    ``rebuild(kind, value)`` makes the leaf of a ``{"s": key, "as": kind}`` node
    (default: ``rebuild_leaf``)."""
    return _build(skeleton, 0, values, rebuild or rebuild_leaf)


def _build(node: Any, depth: int, values: dict[str, Any],
           rebuild: Callable[[str, Any], Any]) -> Any:
    """``unflatten`` of one skeleton node."""
    if depth > _MAX_DEPTH:
        raise ValueError("malformed tree skeleton: too deep")
    if isinstance(node, str):
        return values[node]
    if not isinstance(node, dict) or len(node) not in (1, 2):
        raise ValueError("malformed tree skeleton")
    if "d" in node:
        return {k: _build(v, depth + 1, values, rebuild) for k, v in node["d"]}
    if "l" in node:
        return [_build(v, depth + 1, values, rebuild) for v in node["l"]]
    if "u" in node:
        return tuple(_build(v, depth + 1, values, rebuild) for v in node["u"])
    if "s" in node:
        return rebuild(node["as"], values[node["s"]])
    if "v" in node:
        return node["v"]
    if "b" in node:
        return base64.b64decode(node["b"])
    raise ValueError(f"malformed tree skeleton node {sorted(node)!r}")


def skeleton_leaves(skeleton: Any) -> dict[str, str]:
    """key -> leaf kind for every tensor a skeleton references, in tree order."""
    out: dict[str, str] = {}
    _leaf_kinds(skeleton, 0, out)
    return out


def _leaf_kinds(node: Any, depth: int, out: dict[str, str]) -> None:
    if depth > _MAX_DEPTH:
        raise ValueError("malformed tree skeleton: too deep")
    if isinstance(node, str):
        out[node] = "ndarray"
    elif isinstance(node, dict):
        if "s" in node:
            out[node["s"]] = node.get("as", "ndarray")
        for tag in ("l", "u"):
            for v in node.get(tag, ()):
                _leaf_kinds(v, depth + 1, out)
        for item in node.get("d", ()):
            _leaf_kinds(item[1], depth + 1, out)


def static_values(skeleton: Any, empty: bool = False) -> dict[str, Any]:
    """key -> value of every leaf a skeleton keeps itself (str, None, bytes), keyed by
    its ``/``-joined path as ``flatten`` joins it; with ``empty``, empty dicts, lists
    and tuples below the root too (they hold no key of their own either)."""
    out: dict[str, Any] = {}
    _statics(skeleton, None, 0, out, empty)
    return out


_EMPTY = {"d": dict, "l": list, "u": tuple}


def _statics(node: Any, key: str | None, depth: int, out: dict[str, Any],
             empty: bool) -> None:
    if depth > _MAX_DEPTH or not isinstance(node, dict):
        return
    if "v" in node and key is not None:
        out[key] = node["v"]
    elif "b" in node and key is not None:
        out[key] = base64.b64decode(node["b"])
    for tag in ("l", "u"):
        kids = node.get(tag)
        if kids is not None and not kids and empty and key is not None:
            out[key] = _EMPTY[tag]()
        for i, v in enumerate(kids or ()):
            _statics(v, _join(key, i), depth + 1, out, empty)
    items = node.get("d")
    if items is not None and not items and empty and key is not None:
        out[key] = {}
    for item in items or ():
        _statics(item[1], _join(key, item[0]), depth + 1, out, empty)


def nest_flat(flat: dict[str, Any]) -> dict:
    """``{"a/b": x, "a/c": y}`` -> ``{"a": {"b": x, "c": y}}``.

    A key below another key that is a value itself (``a/b`` and ``a``) stays at the
    top level under its full flat key (``{"a": ..., "a/b": ...}``), whatever the
    order of the keys: nothing is lost.
    """
    leaves = set(flat)
    out: dict = {}
    for key, value in flat.items():
        parts = key.split("/")
        if any("/".join(parts[:j]) in leaves for j in range(1, len(parts))):
            out[key] = value
            continue
        node = out
        for p in parts[:-1]:
            node = node.setdefault(p, {})
        node[parts[-1]] = value
    return out


def path_trie(paths: Iterable[Sequence[str]]) -> tuple[list[list[tuple[str, int]]], list[int]]:
    """The trie of ``paths`` (each a sequence of names, e.g. a key's ``/``-split
    parts): its edges, per node (0 is the root, the others numbered as they are
    first reached), the ``(name, child)`` pairs in the order first seen; and, per
    path, the node where it ends. The object graph of a checkpoint without one is
    the trie of its keys (``StoredGraph.from_keys``, the TensorFlow writer)."""
    edges: list[list[tuple[str, int]]] = [[]]
    index: list[dict[str, int]] = [{}]
    ends: list[int] = []
    for parts in paths:
        node = 0
        for p in parts:
            nxt = index[node].get(p)
            if nxt is None:
                nxt = len(edges)
                edges.append([])
                index.append({})
                edges[node].append((p, nxt))
                index[node][p] = nxt
            node = nxt
        ends.append(node)
    return edges, ends
