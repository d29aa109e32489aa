"""Random number generators as checkpointable state (docs/API.md section 11).

- ``state_functions(obj)``: ``(get, set)`` for Python's ``random.Random``, numpy's
  ``Generator``, ``BitGenerator`` and legacy ``RandomState``: ``get()`` returns the
  generator's state as a state dict (arrays, numbers, strings), ``set(sd)`` puts it
  back exactly. The object graph makes such generators nodes with them.
- ``GlobalRNG``: the process's global random state (Python's ``random``, numpy's
  global ``np.random``, and the generators frameworks register with
  ``register_global``: torch's CPU generator and every CUDA device's) as an object
  with ``state_dict()`` / ``load_state_dict()``, so ``Checkpoint(rng=GlobalRNG())``
  saves and restores it.

This module imports no framework: torch registers its part from
``pyckpt/adapters/torch_support.py``.
"""

from __future__ import annotations

import random
from typing import Any, Callable, NamedTuple

import numpy as np

__all__ = ["GlobalRNG", "state_functions", "register_global"]

Getter = Callable[[], Any]
Setter = Callable[[Any], None]


# -- single generators -------------------------------------------------------------------

def python_state(state: tuple) -> dict:
    """A ``random.Random.getstate()`` tuple as a state dict: the 625 Mersenne Twister
    words (624 of state, then the position) as one int64 array, not 625 Python ints."""
    version, internal, gauss_next = state
    return {"version": version, "internal": np.array(internal, dtype=np.int64),
            "gauss_next": gauss_next}


def python_tuple(sd: dict) -> tuple:
    """The inverse of ``python_state``: the tuple ``random.Random.setstate`` takes."""
    internal = tuple(int(x) for x in np.asarray(sd["internal"]).tolist())
    gauss = sd["gauss_next"]
    return int(sd["version"]), internal, None if gauss is None else float(gauss)


def _set_bit_generator(bg: Any, sd: dict) -> None:
    bg.state = sd  # numpy checks the generator's name and the fields


def state_functions(obj: Any) -> tuple[Getter, Setter] | None:
    """``(get, set)`` of a random generator's state, or None for anything else.

    - ``random.Random`` (not ``SystemRandom``, which has no state): ``getstate``
      as ``python_state`` / ``setstate``;
    - ``numpy.random.Generator``: its bit generator's ``state`` dict;
    - ``numpy.random.BitGenerator`` (PCG64, MT19937, Philox, SFC64...): ``state``;
    - ``numpy.random.RandomState``: ``get_state(legacy=False)`` / ``set_state``.

    numpy's states hold integers beyond 64 bits (PCG64's 128-bit state): they are
    saved exactly (docs/FORMAT.md section 8)."""
    if isinstance(obj, random.Random):
        if isinstance(obj, random.SystemRandom):
            return None
        return (lambda: python_state(obj.getstate())), (lambda sd: obj.setstate(python_tuple(sd)))
    if isinstance(obj, np.random.Generator):
        bg = obj.bit_generator
        return (lambda: bg.state), (lambda sd: _set_bit_generator(bg, sd))
    if isinstance(obj, np.random.BitGenerator):
        return (lambda: obj.state), (lambda sd: _set_bit_generator(obj, sd))
    if isinstance(obj, np.random.RandomState):
        return (lambda: obj.get_state(legacy=False)), (lambda sd: obj.set_state(sd))
    return None


# -- the global state ----------------------------------------------------------------------

class _Part(NamedTuple):
    get: Callable[[], Any]   # the part's state dict, or None when there is none to save
    set: Setter


_GLOBAL: dict[str, _Part] = {}


def register_global(name: str, get: Callable[[], Any], set: Setter) -> None:
    """Adds (or replaces) a part of ``GlobalRNG``: ``get()`` returns its state (None
    when that framework is not in use: nothing is saved for it), ``set(state)``
    restores it. torch registers ``"torch"``."""
    _GLOBAL[name] = _Part(get, set)


def _numpy_get() -> dict:
    return np.random.get_state(legacy=False)


def _numpy_set(sd: Any) -> None:
    np.random.set_state(sd)


register_global("python", lambda: python_state(random.getstate()),
                lambda sd: random.setstate(python_tuple(sd)))
register_global("numpy", _numpy_get, _numpy_set)


class GlobalRNG:
    """The process's global random state, as one checkpointable object.

    ``state_dict()`` captures Python's ``random`` module, numpy's global generator
    (``np.random.seed`` / ``np.random.rand``...) and, when torch is imported, torch's
    CPU generator and the generator of every CUDA device; ``load_state_dict(sd)``
    restores each part that ``sd`` holds. As a ``Checkpoint`` attribute it is saved
    and restored with the rest: ``Checkpoint(model=m, optimizer=opt, rng=GlobalRNG())``.

    ``parts`` limits it to some of the registered parts (``("python", "numpy",
    "torch")`` by default: every one registered)."""

    def __init__(self, parts: tuple[str, ...] | None = None) -> None:
        unknown = [p for p in parts or () if p not in _GLOBAL]
        if unknown:
            raise ValueError(f"GlobalRNG: unknown part(s) {unknown}; known: {sorted(_GLOBAL)}")
        self.parts = tuple(parts) if parts is not None else None

    def _names(self) -> list[str]:
        return list(self.parts) if self.parts is not None else list(_GLOBAL)

    def state_dict(self) -> dict:
        """``{part: state}`` of every part in use now."""
        out = {}
        for name in self._names():
            state = _GLOBAL[name].get()
            if state is not None:
                out[name] = state
        return out

    def load_state_dict(self, state_dict: dict) -> None:
        """Restores every part of ``state_dict`` (of those this object covers); a part
        no longer registered raises ValueError."""
        names = set(self._names())
        unknown = [p for p in state_dict if p not in _GLOBAL]
        if unknown:
            raise ValueError(f"GlobalRNG: the checkpoint holds the random state of {unknown}, "
                             f"which this process cannot restore (known: {sorted(_GLOBAL)})")
        for name, state in state_dict.items():
            if name in names:
                _GLOBAL[name].set(state)

    def __repr__(self) -> str:
        return f"GlobalRNG({', '.join(self._names())})"
