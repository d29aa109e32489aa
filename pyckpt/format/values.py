"""Values a checkpoint keeps outside its tensors: text, None and bytes, held in the
tree skeleton of a flat checkpoint (docs/FORMAT.md section 8) or in the ``state``
of an object graph's nodes. Conversions to formats that hold tensors only
(TensorFlow's, safetensors) name them when they leave them out."""

from __future__ import annotations

import base64
from typing import Any

from ..tree import static_values

__all__ = ["text_values", "left_out_warning"]


def _graph_texts(graph: dict) -> dict[str, Any]:
    """path -> value of each object-graph node whose state is a kept value, the path
    being the edge names from the root (first path in breadth-first order)."""
    children, state = graph.get("children") or [], graph.get("state") or []
    out: dict[str, Any] = {}
    seen = {0}
    todo: list[tuple[int, str]] = [(0, "")]
    while todo:
        node, path = todo.pop(0)
        st = state[node] if node < len(state) else None
        if path and isinstance(st, dict) and ("v" in st or "b" in st):
            out[path] = st.get("v") if "v" in st else base64.b64decode(st["b"])
        for name, child in (children[node] if node < len(children) else []):
            if isinstance(child, int) and child not in seen:
                seen.add(child)
                todo.append((child, f"{path}/{name}" if path else str(name)))
    return out


def text_values(tree: Any, graph: dict | None) -> dict[str, Any]:
    """key path -> value of every text, None or bytes value a checkpoint keeps outside
    its tensors (from its tree skeleton and its object graph)."""
    out = dict(static_values(tree)) if tree is not None else {}
    if graph is not None:
        try:
            out.update(_graph_texts(graph))
        except (TypeError, ValueError, IndexError, AttributeError):
            pass  # a malformed graph: its reader reports it
    return out


def left_out_warning(values: dict[str, Any], fmt: str) -> str | None:
    """The warning naming the values a conversion to ``fmt`` leaves out, or None."""
    if not values:
        return None
    shown = ", ".join(f"{k} ({type(v).__name__})" for k, v in list(values.items())[:20])
    more = f" and {len(values) - 20} more" if len(values) > 20 else ""
    return (f"{len(values)} value(s) left out of the {fmt}: only tensors are written there, "
            f"and these are text, None or bytes: {shown}{more}. pyckpt's own format keeps them "
            "(pyckpt.save, Checkpoint.write, pyckpt cp without --format)")
