"""HTTP/1.1 on a relayed connection, for ``fault_proxy.FaultProxy``: one socket's
read buffer (``Side``), message heads (``Message``) and bodies framed by
Content-Length, chunked encoding or the end of the stream (``pipe_body``,
``drain_body``). Every wait is bounded (``idle_timeout``, the proxy's stop
event) and every loop in count; a malformed or stalled message raises ``Abort``,
which ends the connection.
"""

from __future__ import annotations

import select
import socket
import threading
import time
from typing import Protocol

from ..errors import RelayAbort as Abort

MAX_HEAD = 64 << 10
RECV = 64 << 10


class Sink(Protocol):
    """Where ``pipe_body`` sends a body's bytes."""

    def send(self, data: bytes) -> None: ...


class Side:
    """One socket with a read buffer; every wait is bounded by ``idle_timeout`` and
    ends when ``stop`` is set."""

    def __init__(self, sock: socket.socket, stop: threading.Event, idle_timeout: float) -> None:
        self.sock = sock
        self.stop = stop
        self.idle_timeout = idle_timeout
        self.buf = b""
        self.eof = False


    def fill(self, watch: "Side | None" = None) -> bool:
        """Reads more bytes into ``buf``; False at end of stream. ``watch``: another
        side whose end of stream (or data) while waiting ends the connection."""
        if self.eof:
            return False
        idle_until = time.monotonic() + self.idle_timeout
        while True:
            if self.stop.is_set() or time.monotonic() > idle_until:
                raise Abort()
            socks = [self.sock] + ([watch.sock] if watch is not None else [])
            try:
                ready, _, _ = select.select(socks, [], [], 0.2)
            except (OSError, ValueError):
                raise Abort() from None
            if self.sock in ready:
                try:
                    data = self.sock.recv(RECV)
                except OSError:
                    raise Abort() from None
                if not data:
                    self.eof = True
                    return False
                self.buf += data
                return True
            if watch is not None and watch.sock in ready:
                raise Abort()  # the other side spoke (or closed) out of turn

    def head(self, watch: "Side | None" = None) -> bytes | None:
        """One message head (through the blank line), or None at a clean end."""
        while b"\r\n\r\n" not in self.buf:
            if len(self.buf) > MAX_HEAD:
                raise Abort()
            if not self.fill(watch):
                if self.buf:
                    raise Abort()
                return None
        i = self.buf.index(b"\r\n\r\n") + 4
        out, self.buf = self.buf[:i], self.buf[i:]
        return out

    def take(self, n: int) -> bytes:
        """Up to ``n`` bytes (at least one), waiting for them."""
        if not self.buf and not self.fill():
            raise Abort()
        out, self.buf = self.buf[:n], self.buf[n:]
        return out

    def line(self) -> bytes:
        while b"\r\n" not in self.buf:
            if len(self.buf) > MAX_HEAD or not self.fill():
                raise Abort()
        i = self.buf.index(b"\r\n") + 2
        out, self.buf = self.buf[:i], self.buf[i:]
        return out


class Message:
    """A parsed HTTP head: the first line's words and the headers (lower-case names)."""

    def __init__(self, raw: bytes) -> None:
        lines = raw[:-4].decode("latin-1").split("\r\n")
        self.raw = raw
        self.first = lines[0].split(" ", 2)
        self.headers: list[tuple[str, str]] = []
        for line in lines[1:]:
            name, _, value = line.partition(":")
            self.headers.append((name.strip().lower(), value.strip()))

    def get(self, name: str) -> str | None:
        for k, v in self.headers:
            if k == name:
                return v
        return None

    def without(self, name: str) -> bytes:
        """The head again, less the header ``name``."""
        lines = self.raw[:-4].split(b"\r\n")
        keep = [lines[0]] + [ln for ln in lines[1:]
                             if ln.split(b":", 1)[0].strip().lower() != name.encode()]
        return b"\r\n".join(keep) + b"\r\n\r\n"

    def framing(self) -> tuple[str, int]:
        """("length", n), ("chunked", 0) or ("close", 0): how the body is delimited."""
        if "chunked" in (self.get("transfer-encoding") or "").lower():
            return "chunked", 0
        length = self.get("content-length")
        if length is not None:
            try:
                return "length", max(0, int(length))
            except ValueError:
                raise Abort() from None
        return "close", 0


def pipe_body(src: Side, shaper: Sink, framing: tuple[str, int]) -> None:
    """Forwards one body, framed as ``framing``, from ``src`` to ``shaper``."""
    kind, n = framing
    if kind == "length":
        left = n
        while left > 0:
            data = src.take(min(left, RECV))
            left -= len(data)
            shaper.send(data)
    elif kind == "chunked":
        for _ in range(1 << 20):  # chunks of one body, at most
            line = src.line()
            shaper.send(line)
            try:
                size = int(line.split(b";", 1)[0].strip(), 16)
            except ValueError:
                raise Abort() from None
            if size == 0:
                for _ in range(1000):  # trailers, then the blank line
                    trailer = src.line()
                    shaper.send(trailer)
                    if trailer == b"\r\n":
                        return
                raise Abort()
            left = size + 2  # the chunk and its CRLF
            while left > 0:
                data = src.take(min(left, RECV))
                left -= len(data)
                shaper.send(data)
        raise Abort()
    else:  # until the end of the stream
        for _ in range(1 << 24):  # reads of one body, at most
            if not (src.buf or src.fill()):
                return
            data, src.buf = src.buf, b""
            shaper.send(data)
        raise Abort()


def drain_body(src: Side, framing: tuple[str, int], limit: float) -> bool:
    """Reads and discards one body (at most ``limit`` seconds); whether it all came."""
    kind, n = framing
    if kind == "close":
        return False
    end = time.monotonic() + limit

    class _Discard:
        def send(self, data: bytes) -> None:
            if time.monotonic() > end:
                raise Abort()

    try:
        pipe_body(src, _Discard(), framing)
    except Abort:
        return False
    return True
