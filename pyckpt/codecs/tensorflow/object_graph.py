"""TensorFlow's object graph (``TrackableObjectGraph``) <-> pyckpt's stored graph
(docs/FORMAT.md section 9; docs/TF_FORMAT.md section 7).

Reading: node *i* of TensorFlow's graph is node *i* of ours, with the same
named edges (TensorFlow stores edge names unescaped, as pyckpt does). A node's
``VARIABLE_VALUE`` attribute (or its only attribute) becomes its value; any
other attribute, and an attribute whose tensors are stored under longer keys
(a dataset iterator's ``ITERATOR`` is saved as ``.../ITERATOR_STATE``), becomes
a child node named ``.ATTRIBUTES/<name>`` holding that key, so that a restore
reports it as unmatched rather than forgetting it. Slot variables (of TF1-style
optimizers) keep their nodes, unreachable by edges, as in TensorFlow.

Writing: every node of a pyckpt graph becomes a TrackableObject with its
children, and each value node one ``VARIABLE_VALUE`` attribute, which is what
``tf.Variable`` restores from.
"""

from __future__ import annotations

import bisect
from typing import Any, Callable, Mapping, Sequence

from .messages import ObjectNode

__all__ = ["OBJECT_GRAPH_KEY", "VALUE_ATTRIBUTE", "to_pyckpt_graph", "from_pyckpt_graph"]

OBJECT_GRAPH_KEY = "_CHECKPOINTABLE_OBJECT_GRAPH"
VALUE_ATTRIBUTE = "VARIABLE_VALUE"
_ATTRIBUTES = "/.ATTRIBUTES/"


def _stored_keys(key: str, index: Mapping[str, int], sorted_keys: Sequence[str]) -> list[str]:
    """The tensor keys holding attribute ``key``: itself, else the keys extending it."""
    if key in index:
        return [key]
    out = []
    i = bisect.bisect_left(sorted_keys, key)
    while i < len(sorted_keys) and sorted_keys[i].startswith(key):
        out.append(sorted_keys[i])
        i += 1
    return out


def to_pyckpt_graph(nodes: list[ObjectNode], index: Mapping[str, int],
                    bad: Callable[[str], Exception]) -> dict:
    """The graph of a TensorFlow checkpoint in pyckpt's JSON form (``children``,
    ``value``, ``kind``); ``bad(message)`` is raised for edges out of range."""
    n = len(nodes)
    if n == 0:
        raise bad("the object graph has no nodes")
    children: list[list[list[Any]]] = []
    value: list[str | None] = [None] * n
    kind: list[str] = [""] * n
    sorted_keys = sorted(index)
    extra: list[tuple[int, str, str]] = []  # (parent node, edge name, key): added after the nodes
    for i, node in enumerate(nodes):
        edges: list[list[Any]] = []
        for child, name in node.children:
            if not 0 <= child < n:
                raise bad(f"node {i}: edge {name!r} points to node {child} (there are {n})")
            edges.append([name, child])
        children.append(edges)
        attrs = node.attributes
        main = next((a for a in attrs if a[0] == VALUE_ATTRIBUTE), attrs[0] if len(attrs) == 1
                    else None)
        for attr in attrs:
            name, _, key = attr
            keys = _stored_keys(key, index, sorted_keys)
            if attr is main and keys == [key]:
                value[i] = key
                continue
            for k in keys:  # an extra node per stored tensor of this attribute
                extra.append((i, ".ATTRIBUTES/" + (k.split(_ATTRIBUTES, 1)[1] if _ATTRIBUTES in k
                                                   else name), k))
    for parent, edge, k in extra:
        children[parent].append([edge, len(value)])
        children.append([])
        value.append(k)
        kind.append("")
    for i, node in enumerate(nodes):
        for orig, _, slot in node.slots:
            if not (0 <= orig < n and 0 <= slot < n):
                raise bad(f"node {i}: slot variable reference ({orig}, {slot}) out of range")
    return {"children": children, "value": value, "kind": kind}


def from_pyckpt_graph(graph: Mapping[str, Any]) -> tuple[list[ObjectNode], list[bool]]:
    """A pyckpt graph (``children``/``value`` lists) as TensorFlow's nodes, with
    ``has_checkpoint_values`` of each (whether it or a node below holds a value)."""
    children = graph["children"]
    value = graph["value"]
    nodes = []
    for i, edges in enumerate(children):
        attrs = []
        if value[i] is not None:
            full = value[i][:-len(_ATTRIBUTES + VALUE_ATTRIBUTE)] \
                if value[i].endswith(_ATTRIBUTES + VALUE_ATTRIBUTE) else value[i]
            attrs.append((VALUE_ATTRIBUTE, full, value[i]))
        nodes.append(ObjectNode([(int(c), str(name)) for name, c in edges], attrs, []))
    has = [v is not None for v in value]
    parents: list[list[int]] = [[] for _ in value]
    for i, edges in enumerate(children):
        for _, c in edges:
            parents[int(c)].append(i)
    stack = [i for i, h in enumerate(has) if h]
    while stack:
        for p in parents[stack.pop()]:
            if not has[p]:
                has[p] = True
                stack.append(p)
    return nodes, has
