"""``pyckpt.Module``: a Trackable with variable and submodule collection."""

from __future__ import annotations

import re
from typing import Any, Iterator

from ..variables import Variable
from .object_graph import children
from .trackable import Trackable


def _snake(name: str) -> str:
    return re.sub(r"(?<!^)(?=[A-Z])", "_", name).lower()


class Module(Trackable):
    """Convenience base for model building blocks.

    ``variables`` / ``trainable_variables`` / ``submodules`` walk the tracked
    attributes depth-first in assignment order, each object once.
    """

    def __init__(self, name: str | None = None) -> None:
        self._name = name

    @property
    def name(self) -> str:
        """The name given to the constructor, else the class name in snake_case."""
        return self.__dict__.get("_name") or _snake(type(self).__name__)

    def _walk(self) -> Iterator[Any]:
        seen = {id(self)}
        stack = [iter(children(self))]
        while stack:
            for _, child in stack[-1]:
                if id(child) in seen:
                    continue
                seen.add(id(child))
                yield child
                stack.append(iter(children(child)))
                break
            else:
                stack.pop()

    @property
    def variables(self) -> tuple[Variable, ...]:
        """Every Variable reachable through tracked attributes (depth-first, each once)."""
        return tuple(o for o in self._walk() if isinstance(o, Variable))

    @property
    def trainable_variables(self) -> tuple[Variable, ...]:
        """The trainable ones of ``variables``."""
        return tuple(o for o in self._walk() if isinstance(o, Variable) and o.trainable)

    @property
    def submodules(self) -> tuple["Module", ...]:
        """Every Module reachable below this one (depth-first, each once; not itself)."""
        return tuple(o for o in self._walk() if isinstance(o, Module))

    def __repr__(self) -> str:
        return f"<{type(self).__name__} '{self.name}'>"
