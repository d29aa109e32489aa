"""``pyckpt.Trackable``: objects joined by named attribute edges (docs/API.md section 2).

Assigning an attribute whose value is a Variable, an ndarray, a Trackable, an
object with a state dict or a random generator (stateful.py), or a list / tuple
/ dict (nested) of those creates a dependency edge named after the attribute;
names starting with ``_`` are not tracked. Other values (numbers, strings) are
configuration and not tracked here; ``Checkpoint`` refuses them. Lists and dicts are
stored as tracked copies (containers.py). Assigning a value under a name for
which a restore is pending restores it on the spot (deferred.py).

Subclasses need not call ``super().__init__()``: all bookkeeping is created
lazily in the instance ``__dict__``.
"""

from __future__ import annotations

from typing import Any

from . import deferred
from .containers import wrap
from .nodes import MISSING, is_node


class Trackable:
    """Base class of objects whose state is saved by following named edges."""

    def __setattr__(self, name: str, value: Any) -> None:
        if name.startswith("_"):
            object.__setattr__(self, name, value)
            return
        value = wrap(value)
        object.__setattr__(self, name, value)
        deferred.apply(self, name, value)

    # -- graph protocol (object_graph.py); subclasses may extend ------------------
    def _pyckpt_children(self) -> list[tuple[str, Any]]:
        """Named dependencies, in attribute assignment order."""
        return [(k, v) for k, v in self.__dict__.items() if not k.startswith("_") and is_node(v)]

    def _pyckpt_get_child(self, name: str) -> Any:
        if name.startswith("_"):
            return MISSING
        v = self.__dict__.get(name, MISSING)
        return v if v is MISSING or is_node(v) else MISSING
