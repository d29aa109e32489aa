"""A restricted pickle reader: a small pickle machine of its own (C++,
cpp/bindings/restricted_pickle.cc, run by ``restricted_load``), that runs nothing
stored in the data.

``pickle.Unpickler`` with an overridden ``find_class`` would restrict which
globals load, but it still calls what the data names, and its C memo grows to
whatever index a ``LONG_BINPUT`` names (a 6-byte pickle can ask for tens of
GiB). This machine instead:

- resolves every global through an allow-list of ``Global`` stand-ins, never
  by importing (anything else raises CorruptCheckpointError naming
  ``module.name``);
- "calls" only what a stand-in allows (``REDUCE``: the stand-in's own
  function, written in allowed.py, on the given arguments; ``NEWOBJ``: an ``Obj``
  record of the class name and arguments; ``BUILD``: the record's state);
- knows only the opcodes of protocols 2 to 5 that pickles of plain data use
  (no ``INST``/``OBJ``/``EXT*``, no sets, no out-of-band buffers): any other
  raises;
- keeps its memo in a hash map (indices 0, 1, 2, ... in an array that grows by
  one entry per op that writes one: no index makes it allocate) and reads each
  length against the bytes that are left before slicing;
- takes as dict keys only values that hash in constant time and that no input
  can make collide (strings and bytes, whose hashes are salted and cached;
  records and stand-ins, hashed by identity; None, booleans and integers of
  magnitude below 2**61 - 2, each its own hash), each at most once per dict:
  DCP's dicts are keyed by names and records; a tuple key (hashed anew, element
  by element, at every use) could make a small file take minutes;
- charges every call (``REDUCE``, a persistent id) the size of its arguments
  (their elements, and those of the strings, tuples, lists and dicts among them)
  against a budget of ``WORK_PER_BYTE`` per byte of the input: one wide argument
  passed again and again cannot make the calls' work quadratic.

Every other op consumes at least one byte and does constant work or work on
what earlier ops pushed (each value is popped once), so time and memory are
linear in the input; a pickle over the budget raises CorruptCheckpointError.
The values it returns can share parts (the memo): their readers must not walk a
shared part once per reference (metadata.py).

The machine runs with the GIL held (it builds Python objects) and calls back into
Python only for a stand-in's ``call``, the ``persistent`` function, ``Obj`` and,
when it refuses, ``_short``. Its first version, in Python, is kept in the tests
(tests/interop_dcp/reference_unpickler.py) as the reference it is checked against.
"""

from __future__ import annotations

from typing import Any, Callable, Mapping

from ..._native import core
from ...errors import CorruptCheckpointError

__all__ = ["Global", "Obj", "int_tuple", "restricted_load", "MAX_LONG_BYTES", "WORK_PER_BYTE"]

#: longest integer (LONG1/LONG4 body) accepted, in bytes
MAX_LONG_BYTES = 256
#: elements of call arguments a pickle may pass per byte of its size (plus WORK_BASE)
WORK_PER_BYTE = 16
WORK_BASE = 1 << 16
_SCALARS = (str, int, float, bool, bytes, type(None))


class Global:
    """An allowed global: ``kind`` says what it is ("class": NEWOBJ makes an ``Obj``;
    "function"; "dtype", "layout", "storage": plain names used as values), ``call``
    what REDUCE does with it (None: REDUCE is refused)."""

    __slots__ = ("module", "name", "kind", "call")

    def __init__(self, module: str, name: str, kind: str,
                 call: Callable[[tuple], Any] | None = None) -> None:
        self.module, self.name, self.kind, self.call = module, name, kind, call

    @property
    def qualname(self) -> str:
        return f"{self.module}.{self.name}"

    def __repr__(self) -> str:
        return self.qualname


class Obj:
    """An instance of an allowed class: its class's qualified name, the NEWOBJ
    arguments, and the state BUILD gave it (None if none)."""

    __slots__ = ("cls", "args", "state")

    def __init__(self, cls: str, args: tuple = ()) -> None:
        self.cls, self.args, self.state = cls, args, None

    def __repr__(self) -> str:
        return f"<{self.cls}>"


def _short(value: Any, depth: int = 0) -> str:
    """A bounded rendering of untrusted data for messages (short tuples two levels
    deep, at most 80 characters each: nested shared tuples cannot make it long)."""
    if isinstance(value, tuple) and len(value) <= 8 and depth < 2:
        text = "(" + ", ".join(_short(v, depth + 1) for v in value) + ")"
    elif isinstance(value, (str, bytes)):
        text = repr(value[:80])
    elif isinstance(value, _SCALARS + (Global, Obj)):
        text = repr(value)
    else:
        return f"<{type(value).__name__}>" if not isinstance(value, tuple) else \
            f"<tuple of {len(value)}>"
    return text if len(text) <= 80 else text[:77] + "..."


def int_tuple(args: tuple) -> tuple:
    """A stand-in's ``call`` that makes a tuple of ints of its one argument, a tuple or
    list of ints (``torch.Size(dims)``: called once per chunk box, so the machine runs
    it natively, falling back to this function, and its message, for anything
    else); ValueError otherwise."""
    if len(args) == 1 and isinstance(args[0], (tuple, list)):
        dims = tuple(args[0])
        for d in dims:
            if type(d) is not int:
                break
        else:
            return dims
    raise ValueError("torch.Size takes one sequence of ints")


def restricted_load(data: bytes, allowed: Mapping[tuple[str, str], Global], *, where: str,
                    persistent: Callable[[Any], Any] | None = None,
                    exact: bool = True) -> Any:
    """The value pickled in ``data``, built from plain Python values and the stand-ins
    of ``allowed`` only (module doc). ``persistent(pid)``: what a persistent id
    stands for (None: refused). ``exact``: bytes after STOP are an error. Raises
    CorruptCheckpointError "<where>: <what> (pickle opcode at byte N)" for anything
    else. The machine is C++ (``_core.restricted_unpickle``); it calls back only into
    the stand-ins' ``call`` (but ``int_tuple``'s, which it runs itself on a tuple or
    list of ints), ``persistent``, ``Obj`` and, for messages, ``_short``."""
    value, end = core.restricted_unpickle(
        data=bytes(data), allowed=allowed if type(allowed) is dict else dict(allowed),
        where=where, persistent=persistent, global_type=Global, obj_type=Obj, short=_short,
        int_tuple=int_tuple, work_per_byte=WORK_PER_BYTE, work_base=WORK_BASE,
        max_long_bytes=MAX_LONG_BYTES)
    if exact and end != len(data):
        raise CorruptCheckpointError(f"{where}: {len(data) - end} bytes after the pickle's STOP")
    return value
