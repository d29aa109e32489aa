"""Checkpoint keys of object-based checkpoints, in TensorFlow's convention
(docs/FORMAT.md section 5): ``net/l1/kernel/.ATTRIBUTES/VARIABLE_VALUE``."""

from __future__ import annotations

from typing import Any

VALUE_SUFFIX = "/.ATTRIBUTES/VARIABLE_VALUE"

#: a Checkpoint's own counter of ``save`` calls, and the key of its value
SAVE_COUNTER = "save_counter"
SAVE_COUNTER_KEY = SAVE_COUNTER + VALUE_SUFFIX


def escape(name: str) -> str:
    """An edge name as a key component: ``.`` -> ``..``, then ``/`` -> ``.S``."""
    return name.replace(".", "..").replace("/", ".S")


def unescape(component: str) -> str:
    """The inverse of ``escape``: ``..`` -> ``.`` and ``.S`` -> ``/``; any other ``.x``
    is kept as it is."""
    out = []
    i = 0
    while i < len(component):
        c = component[i]
        if c == "." and i + 1 < len(component):
            nxt = component[i + 1]
            out.append("." if nxt == "." else "/" if nxt == "S" else "." + nxt)
            i += 2
        else:
            out.append(c)
            i += 1
    return "".join(out)


def value_key(path: list[str]) -> str:
    """The key of the value held by the object at ``path`` (edge names from the root)."""
    return "/".join(escape(p) for p in path) + VALUE_SUFFIX


def path_string(path: list[str]) -> str:
    """A readable path for messages: ``net.l1.kernel`` style, like attribute access."""
    return ".".join(path) if path else "<root>"

#: How reports (``unmatched_checkpoint_keys``) name a state stored without a key (a
#: string in a dict, a state dict holding no array or number): its path and this.
STATE_SUFFIX = "/.ATTRIBUTES/PYTHON_STATE"


def index_lists(tree: Any) -> Any:
    """Nested dicts whose keys are all 0..n-1 become lists (stored list indices: the
    edge names of a list's items), as a restore from a checkpoint builds them."""
    if not isinstance(tree, dict):
        return tree
    out = {k: index_lists(v) for k, v in tree.items()}
    if out and all(k.isdigit() for k in out) and sorted(map(int, out)) == list(range(len(out))):
        return [out[str(i)] for i in range(len(out))]
    return out
