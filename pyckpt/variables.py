"""``pyckpt.Variable``: a mutable holder of one ndarray, like ``tf.Variable``."""

from __future__ import annotations

import itertools
from typing import Any, Callable

import numpy as np

__all__ = ["Variable"]

_counter = itertools.count()


class Variable(np.lib.mixins.NDArrayOperatorsMixin):
    """A named, mutable array.

    ``assign`` and friends write into the same buffer, so views handed out by
    ``np.asarray(var)`` see later assignments (as a TensorFlow variable's
    ``numpy()`` would not: ``numpy()`` returns a copy).
    Arithmetic (``var + 1``, ``np.sin(var)``) works on the current value and
    returns plain ndarrays.
    """

    __slots__ = ("_value", "_name", "_trainable", "__weakref__")
    _value: np.ndarray
    _name: str
    _trainable: bool

    def __init__(self, initial_value: Any, dtype: Any = None, name: str | None = None,
                 trainable: bool = True) -> None:
        if callable(initial_value):
            initial_value = initial_value()
        if isinstance(initial_value, Variable):
            initial_value = initial_value._value
        value = np.array(initial_value, dtype=dtype, copy=True, order="C")
        if value.dtype.hasobject:
            raise TypeError("a Variable cannot hold Python objects")
        self._value = value
        self._name = name if name is not None else f"Variable_{next(_counter)}"
        self._trainable = bool(trainable)

    # -- properties -------------------------------------------------------------
    @property
    def name(self) -> str:
        """The variable's name (as given, else ``Variable_<n>``)."""
        return self._name

    @property
    def trainable(self) -> bool:
        """Whether the variable is trainable (see ``Module.trainable_variables``)."""
        return self._trainable

    @property
    def shape(self) -> tuple[int, ...]:
        """The shape of the value (fixed: assignments keep it)."""
        return self._value.shape

    @property
    def dtype(self) -> np.dtype:
        """The dtype of the value (fixed: assignments cast to it)."""
        return self._value.dtype

    @property
    def ndim(self) -> int:
        """The number of dimensions of the value."""
        return self._value.ndim

    @property
    def size(self) -> int:
        """The number of elements of the value."""
        return self._value.size

    @property
    def nbytes(self) -> int:
        """Bytes of the value."""
        return self._value.nbytes

    # -- value access -------------------------------------------------------------
    def numpy(self) -> np.ndarray:
        """A copy of the current value."""
        return self._value.copy()

    def read_value(self) -> np.ndarray:
        """A copy of the current value (as ``numpy()``)."""
        return self.numpy()

    def value(self) -> np.ndarray:
        """A copy of the current value (as ``numpy()``)."""
        return self.numpy()

    def _check(self, value: Any) -> np.ndarray:
        v = value._value if isinstance(value, Variable) else np.asarray(value)
        if v.shape != self._value.shape:
            raise ValueError(f"cannot assign a value of shape {v.shape} to variable "
                             f"'{self._name}' of shape {self._value.shape}")
        return v

    def assign(self, value: Any, read_value: bool = False) -> "Variable":
        """Writes ``value`` into the variable's buffer in place; returns the variable.
        ValueError when the shape differs, TypeError when the cast is not "same_kind".
        ``read_value`` is accepted for TensorFlow compatibility and ignored."""
        np.copyto(self._value, self._check(value), casting="same_kind")
        return self

    def assign_add(self, delta: Any, read_value: bool = False) -> "Variable":
        """Adds ``delta`` in place (same shape, "same_kind" casting); returns the variable."""
        np.add(self._value, self._check(delta), out=self._value, casting="same_kind")
        return self

    def assign_sub(self, delta: Any, read_value: bool = False) -> "Variable":
        """Subtracts ``delta`` in place (same shape, "same_kind" casting); returns the
        variable."""
        np.subtract(self._value, self._check(delta), out=self._value, casting="same_kind")
        return self

    # -- numpy interop -------------------------------------------------------------
    def __array__(self, dtype: Any = None, copy: bool | None = None) -> np.ndarray:
        if dtype is not None and np.dtype(dtype) != self._value.dtype:
            return self._value.astype(dtype)
        if copy:
            return self._value.copy()
        return self._value

    def __array_ufunc__(self, ufunc: Callable, method: str, *inputs: Any, **kwargs: Any) -> Any:
        unwrap = lambda x: x._value if isinstance(x, Variable) else x  # noqa: E731
        inputs = tuple(unwrap(x) for x in inputs)
        if "out" in kwargs:
            kwargs["out"] = tuple(unwrap(x) for x in kwargs["out"])
        return getattr(ufunc, method)(*inputs, **kwargs)

    def __int__(self) -> int:
        return int(self._value)

    def __float__(self) -> float:
        return float(self._value)

    def __index__(self) -> int:
        return self._value.__index__()

    def __bool__(self) -> bool:
        return bool(self._value)

    def __len__(self) -> int:
        return len(self._value)

    def __getitem__(self, idx: Any) -> Any:
        return self._value[idx]

    def __repr__(self) -> str:
        return (f"<pyckpt.Variable '{self._name}' shape={self.shape} dtype={self.dtype.name} "
                f"numpy={np.array2string(self._value, threshold=8)}>")

    # Variables are identity-hashed objects (they are graph nodes), not values.
    __hash__ = object.__hash__

    def __eq__(self, other: Any) -> Any:  # elementwise, like ndarray
        return np.equal(self._value, other._value if isinstance(other, Variable) else other)

    def __ne__(self, other: Any) -> Any:
        return np.not_equal(self._value, other._value if isinstance(other, Variable) else other)
