"""Tracked lists and dicts: what a list or dict assigned to a Trackable
attribute becomes, so that later mutations stay tracked and values pending
from a restore are applied when their element appears (restore-on-create).

As in TensorFlow, assigning a list or dict to an attribute stores a tracked
copy: mutate it through the attribute (``self.layers.append(...)``), not
through another reference to the original list.
"""

from __future__ import annotations

import operator
from typing import Any, Iterable, SupportsIndex

from . import deferred


def wrap(value: Any) -> Any:
    """Tracked versions of plain lists and dicts (recursively); other values as they are."""
    if type(value) is list:
        return TrackedList(value)
    if type(value) is dict:
        return TrackedDict(value)
    return value


class TrackedList(list):
    """A list whose elements are dependencies named by their index."""

    def __init__(self, items: Iterable[Any] = ()) -> None:
        super().__init__(wrap(v) for v in items)

    def _added(self, index: int) -> None:
        deferred.apply(self, str(index), list.__getitem__(self, index))

    def append(self, value: Any) -> None:
        """Appends ``value`` (a list or dict as a tracked copy) and restores what is pending
        under its index."""
        super().append(wrap(value))
        self._added(len(self) - 1)

    def extend(self, values: Iterable[Any]) -> None:
        """Appends each of ``values`` in turn, as ``append`` does."""
        for v in values:
            self.append(v)

    def insert(self, index: SupportsIndex, value: Any) -> None:
        """Inserts ``value`` (wrapped as by ``append``) and restores what is pending under
        the index it lands at."""
        super().insert(index, wrap(value))
        n = len(self)
        k = operator.index(index)
        i = k if k >= 0 else max(0, n - 1 + k)
        self._added(min(i, n - 1))

    # list.__iadd__ takes any iterable while list.__add__ takes only lists; typeshed's
    # builtins.pyi silences the same [misc] check on list.__iadd__ itself
    def __iadd__(self, values: Iterable[Any]) -> "TrackedList":  # type: ignore[misc]
        self.extend(values)
        return self

    def __setitem__(self, index: Any, value: Any) -> None:
        if isinstance(index, slice):
            new = [wrap(v) for v in value]
            start, stop, step = index.indices(len(self))
            super().__setitem__(index, new)
            # the new elements' indices: a slice of step 1 may grow or shrink the list
            landed = range(start, start + len(new)) if step == 1 else range(start, stop, step)
            for i in landed:
                self._added(i)
            return
        super().__setitem__(index, wrap(value))
        self._added(index if index >= 0 else len(self) + index)

    def copy(self) -> list:
        """A plain (untracked) shallow copy, as a list."""
        return list(self)

    def __repr__(self) -> str:
        return f"TrackedList({list.__repr__(self)})"


class TrackedDict(dict):
    """A dict whose entries are dependencies named by ``str(key)``."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__()
        for k, v in dict(*args, **kwargs).items():
            dict.__setitem__(self, k, wrap(v))

    def __setitem__(self, key: Any, value: Any) -> None:
        value = wrap(value)
        super().__setitem__(key, value)
        deferred.apply(self, str(key), value)

    def update(self, *args: Any, **kwargs: Any) -> None:
        """Sets every entry through item assignment, so each is tracked and restores what
        is pending under its key."""
        for k, v in dict(*args, **kwargs).items():
            self[k] = v

    def __ior__(self, other: Any) -> "TrackedDict":  # type: ignore[misc]
        self.update(other)
        return self

    def setdefault(self, key: Any, default: Any = None) -> Any:
        """``self[key]``, first set to ``default`` (as by item assignment) when absent."""
        if key not in self:
            self[key] = default
        return self[key]

    def copy(self) -> dict:
        """A plain (untracked) shallow copy, as a dict."""
        return dict(self)

    def __repr__(self) -> str:
        return f"TrackedDict({dict.__repr__(self)})"
