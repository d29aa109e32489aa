"""The restricted pickle machine of pyckpt/codecs/distcp/unpickler.py as it was
written first, in Python: the reference that the C++ machine (cpp/bindings/
restricted_pickle.cc, which ``restricted_load`` runs) is checked against
(test_unpickler_differential.py). Same rules (unpickler.py's module doc), same
stand-ins (``Global``, ``Obj``) and messages; slow (about 0.5 s per MB).
"""

from __future__ import annotations

import struct
from typing import Any, Callable, Mapping

from pyckpt.codecs.distcp.unpickler import (MAX_LONG_BYTES, WORK_BASE, WORK_PER_BYTE, Global,
                                            Obj, _short)
from pyckpt.errors import CorruptCheckpointError

__all__ = ["reference_load"]

#: integers up to this magnitude are their own hash (CPython: modulo 2**61 - 1)
_INT_KEY = (1 << 61) - 2


def _key_ok(k: Any) -> bool:
    """Dict keys (module doc): str, bytes, Obj, Global, None, bool, or an int of
    magnitude at most 2**61 - 2."""
    t = type(k)
    if t is str or t is bytes or t is Obj or t is Global or t is bool or k is None:
        return True
    return t is int and -_INT_KEY <= k <= _INT_KEY


class _Machine:
    """One run of the machine over ``data`` (module doc)."""

    def __init__(self, data: bytes, allowed: Mapping[tuple[str, str], Global],
                 persistent: Callable[[Any], Any] | None, where: str) -> None:
        self.data, self.pos, self.end = data, 0, len(data)
        self.allowed, self.persistent, self.where = allowed, persistent, where
        self.stack: list[Any] = []
        self.marks: list[int] = []
        self.memo: dict[int, Any] = {}
        self.work, self.budget = 0, WORK_PER_BYTE * len(data) + WORK_BASE
        self.op_at = 0
        self.ops: list[Callable[[], bool] | None] = [None] * 256
        for code, fn in _handlers(self).items():
            self.ops[code] = fn

    # -- helpers ------------------------------------------------------------------------
    def bad(self, what: str) -> CorruptCheckpointError:
        return CorruptCheckpointError(f"{self.where}: {what} (pickle opcode at byte {self.op_at})")

    def take(self, n: int) -> bytes:
        p = self.pos
        if n < 0 or p + n > self.end:
            raise self.bad(f"truncated: {n} bytes wanted, {self.end - p} left")
        self.pos = p + n
        return self.data[p:p + n]

    def uint(self, n: int) -> int:
        return int.from_bytes(self.take(n), "little")

    def pop(self) -> Any:
        if len(self.stack) <= (self.marks[-1] if self.marks else 0):
            raise self.bad("stack underflow")
        return self.stack.pop()

    def top(self) -> Any:
        if len(self.stack) <= (self.marks[-1] if self.marks else 0):
            raise self.bad("stack underflow")
        return self.stack[-1]

    def pop_mark(self) -> list:
        if not self.marks:
            raise self.bad("no MARK to pop to")
        k = self.marks.pop()
        items = self.stack[k:]
        del self.stack[k:]
        return items

    def resolve(self, module: Any, name: Any) -> Global:
        if not isinstance(module, str) or not isinstance(name, str):
            raise self.bad("a global's module and name must be strings")
        g = self.allowed.get((module, name))
        if g is None:
            raise self.bad(f"refused global {module}.{name}: not in the allow-list of what "
                           "this file may hold (nothing was run)")
        return g

    def set_items(self, d: Any, items: list) -> None:
        if type(d) is not dict or len(items) % 2:
            raise self.bad("SETITEMS on a non-dict or an odd number of items")
        for k, v in zip(items[0::2], items[1::2]):
            if not _key_ok(k):
                raise self.bad(f"unsupported dict key of type {type(k).__name__}"
                               + (" (a large integer)" if type(k) is int else ""))
            n = len(d)
            d[k] = v
            if len(d) == n:
                raise self.bad(f"dict key {_short(k)} set twice")

    def charge(self, args: Any) -> None:
        """Counts a call on ``args`` against the budget (module doc)."""
        n = 1
        if type(args) is tuple:
            n += len(args)
            for a in args:
                if isinstance(a, (str, bytes, tuple, list, dict)):
                    n += len(a)
        self.work += n
        if self.work > self.budget:
            raise self.bad(f"its calls pass arguments of more than {self.budget} elements in "
                           f"all, over {WORK_PER_BYTE} per byte of its {self.end} bytes (one "
                           "argument passed again and again?)")

    # -- the loop -----------------------------------------------------------------------
    def run(self) -> tuple[Any, int]:
        """Runs to STOP: (the value, the position after STOP). The most frequent ops
        of DCP's metadata (MEMOIZE, BINGET, LONG_BINGET, BININT1, MARK, EMPTY_TUPLE,
        EMPTY_DICT: three quarters of all) run inline; the rest through ``ops``."""
        data, ops, stack, memo, end = self.data, self.ops, self.stack, self.memo, self.end
        marks = self.marks
        pos = self.pos
        try:
            while pos < end:
                op = data[pos]
                if op == 0x94:  # MEMOIZE (the top, whatever MARK is above it)
                    if not stack:
                        self.op_at = pos
                        raise self.bad("stack underflow")
                    memo[len(memo)] = stack[-1]
                    pos += 1
                elif op == 0x29 or op == 0x7d:  # EMPTY_TUPLE, EMPTY_DICT
                    stack.append(() if op == 0x29 else {})
                    pos += 1
                elif op == 0x28:  # MARK
                    marks.append(len(stack))
                    pos += 1
                elif op == 0x68 or op == 0x6a or op == 0x4b:  # BINGET, LONG_BINGET, BININT1
                    n = 4 if op == 0x6a else 1
                    if pos + 1 + n > end:
                        self.op_at = pos
                        raise self.bad(f"truncated: {n} bytes wanted, {end - pos - 1} left")
                    v = int.from_bytes(data[pos + 1:pos + 1 + n], "little")
                    if op != 0x4b and v not in memo:
                        self.op_at = pos
                        raise self.bad(f"memo entry {v} read before it was written")
                    stack.append(v if op == 0x4b else memo[v])
                    pos += 1 + n
                else:
                    self.op_at, self.pos = pos, pos + 1
                    handler = ops[op]
                    if handler is None:
                        raise self.bad(f"unsupported pickle opcode 0x{op:02x}")
                    if handler():
                        return self.pop(), self.pos
                    pos = self.pos
        except (IndexError, KeyError):
            self.op_at = pos  # for the message of restricted_load
            raise
        self.op_at = end
        raise self.bad("no STOP opcode: truncated pickle")


def _handlers(m: _Machine) -> dict[int, Callable[[], bool]]:
    """opcode -> handler; a handler returns True at STOP."""
    ops: dict[int, Callable[[], bool]] = {}
    ops.update(_stack_ops(m))
    ops.update(_scalar_ops(m))
    ops.update(_container_ops(m))
    ops.update(_global_ops(m))
    ops.update(_object_ops(m))
    return ops


def _push(m: _Machine, value: Any) -> bool:
    m.stack.append(value)
    return False


def _stack_ops(m: _Machine) -> dict[int, Callable[[], bool]]:
    def proto() -> bool:
        if not 2 <= m.uint(1) <= 5:
            raise m.bad("pickle protocol outside 2..5")
        return False

    def frame() -> bool:
        m.take(8)
        return False

    def put(index: int) -> bool:
        m.memo[index] = m.top()
        return False

    def get(index: int) -> bool:
        if index not in m.memo:
            raise m.bad(f"memo entry {index} read before it was written")
        return _push(m, m.memo[index])

    def mark() -> bool:
        m.marks.append(len(m.stack))
        return False

    def pop() -> bool:
        m.pop()
        return False

    def pop_mark() -> bool:
        m.pop_mark()
        return False

    return {
        0x80: proto, 0x95: frame, ord("."): lambda: True,
        ord("("): mark, ord("0"): pop, ord("1"): pop_mark,
        ord("2"): lambda: _push(m, m.top()),
        0x94: lambda: put(len(m.memo)),
        ord("q"): lambda: put(m.uint(1)), ord("r"): lambda: put(m.uint(4)),
        ord("h"): lambda: get(m.uint(1)), ord("j"): lambda: get(m.uint(4)),
    }


def _scalar_ops(m: _Machine) -> dict[int, Callable[[], bool]]:
    def long(nlen: int) -> bool:
        n = m.uint(nlen)
        if n > MAX_LONG_BYTES:
            raise m.bad(f"an integer of {n} bytes")
        return _push(m, int.from_bytes(m.take(n), "little", signed=True))

    def text(nlen: int) -> bool:
        raw = m.take(m.uint(nlen))
        try:
            return _push(m, raw.decode("utf-8", "surrogatepass"))
        except UnicodeDecodeError:
            raise m.bad("a string that is not UTF-8") from None

    return {
        ord("N"): lambda: _push(m, None), 0x88: lambda: _push(m, True),
        0x89: lambda: _push(m, False),
        ord("J"): lambda: _push(m, int.from_bytes(m.take(4), "little", signed=True)),
        ord("K"): lambda: _push(m, m.uint(1)), ord("M"): lambda: _push(m, m.uint(2)),
        0x8a: lambda: long(1), 0x8b: lambda: long(4),
        ord("G"): lambda: _push(m, struct.unpack(">d", m.take(8))[0]),
        0x8c: lambda: text(1), ord("X"): lambda: text(4), 0x8d: lambda: text(8),
        ord("C"): lambda: _push(m, m.take(m.uint(1))), ord("B"): lambda: _push(m, m.take(m.uint(4))),
        0x8e: lambda: _push(m, m.take(m.uint(8))),
    }


def _container_ops(m: _Machine) -> dict[int, Callable[[], bool]]:
    def tuple_n(n: int) -> bool:
        if len(m.stack) - (m.marks[-1] if m.marks else 0) < n:
            raise m.bad("stack underflow")
        items = tuple(m.stack[len(m.stack) - n:]) if n else ()
        del m.stack[len(m.stack) - n:]
        return _push(m, items)

    def appends(items: list) -> bool:
        target = m.top()
        if type(target) is not list:
            raise m.bad("APPEND to a non-list")
        target.extend(items)
        return False

    def dict_() -> bool:
        items = m.pop_mark()
        d: dict = {}
        m.set_items(d, items)
        return _push(m, d)

    def setitem() -> bool:
        v = m.pop()
        k = m.pop()
        m.set_items(m.top(), [k, v])
        return False

    def setitems() -> bool:
        items = m.pop_mark()
        m.set_items(m.top(), items)
        return False

    return {
        ord(")"): lambda: _push(m, ()), ord("t"): lambda: _push(m, tuple(m.pop_mark())),
        0x85: lambda: tuple_n(1), 0x86: lambda: tuple_n(2), 0x87: lambda: tuple_n(3),
        ord("]"): lambda: _push(m, []), ord("l"): lambda: _push(m, m.pop_mark()),
        ord("a"): lambda: appends([m.pop()]), ord("e"): lambda: appends(m.pop_mark()),
        ord("}"): lambda: _push(m, {}), ord("d"): dict_,
        ord("s"): setitem, ord("u"): setitems,
    }


def _global_ops(m: _Machine) -> dict[int, Callable[[], bool]]:
    def line() -> str:
        end = m.data.find(b"\n", m.pos, min(m.end, m.pos + 1024))
        if end < 0:
            raise m.bad("unterminated GLOBAL")
        return m.take(end - m.pos + 1)[:-1].decode("ascii", "replace")

    def global_() -> bool:
        module = line()
        return _push(m, m.resolve(module, line()))

    def stack_global() -> bool:
        name = m.pop()
        return _push(m, m.resolve(m.pop(), name))

    return {ord("c"): global_, 0x93: stack_global}


def _object_ops(m: _Machine) -> dict[int, Callable[[], bool]]:
    def reduce() -> bool:
        args = m.pop()
        fn = m.top()
        if not isinstance(fn, Global) or fn.call is None or type(args) is not tuple:
            raise m.bad(f"REDUCE of {_short(fn)}, which this reader does not call")
        m.charge(args)
        try:
            m.stack[-1] = fn.call(args)
        except (TypeError, ValueError) as e:
            raise m.bad(f"{fn.qualname}{_short(args)}: {e}") from None
        return False

    def newobj() -> bool:
        args = m.pop()
        cls = m.top()
        if not isinstance(cls, Global) or cls.kind != "class" or type(args) is not tuple:
            raise m.bad(f"NEWOBJ of {_short(cls)}, which this reader does not create")
        m.stack[-1] = Obj(cls.qualname, args)
        return False

    def newobj_ex() -> bool:
        kwargs = m.pop()
        if type(kwargs) is not dict or kwargs:
            raise m.bad("NEWOBJ_EX with keyword arguments")
        return newobj()

    def build() -> bool:
        state = m.pop()
        inst = m.top()
        if not isinstance(inst, Obj) or inst.state is not None:
            raise m.bad(f"BUILD of {_short(inst)}, which this reader does not give a state")
        inst.state = state
        return False

    def persid() -> bool:
        pid = m.pop()
        if m.persistent is None:
            raise m.bad("a persistent id, which this file may not hold")
        m.charge(pid)
        try:
            return _push(m, m.persistent(pid))
        except (TypeError, ValueError) as e:
            raise m.bad(f"persistent id {_short(pid)}: {e}") from None

    return {ord("R"): reduce, 0x81: newobj, 0x92: newobj_ex, ord("b"): build, ord("Q"): persid}


def reference_load(data: bytes, allowed: Mapping[tuple[str, str], Global], *, where: str,
                   persistent: Callable[[Any], Any] | None = None,
                   exact: bool = True) -> Any:
    """The value pickled in ``data``, built from plain Python values and the stand-ins
    of ``allowed`` only (module doc). ``persistent(pid)``: what a persistent id
    stands for (None: refused). ``exact``: bytes after STOP are an error. Raises
    CorruptCheckpointError prefixed with ``where`` for anything else."""
    m = _Machine(bytes(data), allowed, persistent, where)
    try:
        value, end = m.run()
    except CorruptCheckpointError:
        raise
    except (IndexError, KeyError, TypeError, ValueError, OverflowError, RecursionError,
            struct.error) as e:  # a malformed pickle the checks above did not foresee
        raise m.bad(f"malformed pickle ({type(e).__name__}: {e})") from None
    if exact and end != m.end:
        raise CorruptCheckpointError(f"{where}: {m.end - end} bytes after the pickle's STOP")
    return value
