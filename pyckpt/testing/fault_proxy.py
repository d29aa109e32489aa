"""A fault-injecting HTTP/1.1 proxy on 127.0.0.1, for S3 clients on the wire.

``FaultProxy`` sits between a client (s3fs/aiobotocore) and a local S3 server
(SeaweedFS, moto): it forwards each connection to the server, reading the
requests and responses as HTTP/1.1 messages (heads, bodies framed by
Content-Length or chunked encoding, keep-alive), and injects, into requests it
picks at random (seeded) among those it is told to touch:

- ``reset``: the connection is reset (TCP RST to both sides) in the middle of
  a body: the request's body (an upload) or the response's (a download, or the
  answer to an upload the server already took);
- ``slowdown``: a burst of ``503 SlowDown`` answers written by the proxy itself,
  as S3 throttles; the burst's requests never reach the server;
- ``stall``: in the middle of a body, nothing moves either way for
  ``stall_seconds`` (set it longer than the client's timeouts), then a reset;
- ``drip``: a body moves ``drip_bytes`` every ``drip_interval`` seconds for
  ``drip_seconds``, then at full speed (slow, but never stalled).

``counts`` says how many faults of each kind it injected, ``events`` which
requests got them. Every loop is bounded in count and time: connections
(``max_connections``), requests per connection, waits (``idle_timeout``, the
fault durations), and the proxy's whole life (``lifetime``); ``close`` stops
everything. It listens on 127.0.0.1 only and connects only to 127.0.0.1::

    with FaultProxy(server_port, reset=0.2, slowdown=0.1, seed=3) as proxy:
        so = {"key": ..., "secret": ..., "client_kwargs": {"endpoint_url": proxy.url}}
        pyckpt.save(tree, "s3://bucket/run/ckpt-1", storage_options=so)
        proxy.counts       # {"reset": 4, "slowdown": 6, "stall": 0, "drip": 0}
"""

from __future__ import annotations

import contextlib
import random
import select
import socket
import struct
import threading
import time
from typing import Any, Callable, Iterator

KINDS = ("reset", "slowdown", "stall", "drip")

_MAX_HEAD = 64 << 10
_RECV = 64 << 10


class _Abort(Exception):
    """Ends the connection (``rst``: with a reset of both sides)."""

    def __init__(self, rst: bool = False) -> None:
        super().__init__()
        self.rst = rst


class _Side:
    """One socket with a read buffer; every wait is bounded by the proxy's idle
    timeout and ends when the proxy stops."""

    def __init__(self, sock: socket.socket, proxy: "FaultProxy") -> None:
        self.sock = sock
        self.proxy = proxy
        self.buf = b""
        self.eof = False

    def fill(self, watch: "_Side | None" = None) -> bool:
        """Reads more bytes into ``buf``; False at end of stream. ``watch``: another
        side whose end of stream (or data) while waiting ends the connection."""
        if self.eof:
            return False
        idle_until = time.monotonic() + self.proxy.idle_timeout
        while True:
            if self.proxy._stop.is_set() or time.monotonic() > idle_until:
                raise _Abort()
            socks = [self.sock] + ([watch.sock] if watch is not None else [])
            try:
                ready, _, _ = select.select(socks, [], [], 0.2)
            except (OSError, ValueError):
                raise _Abort() from None
            if self.sock in ready:
                try:
                    data = self.sock.recv(_RECV)
                except OSError:
                    raise _Abort() from None
                if not data:
                    self.eof = True
                    return False
                self.buf += data
                return True
            if watch is not None and watch.sock in ready:
                raise _Abort()  # the other side spoke (or closed) out of turn

    def head(self, watch: "_Side | None" = None) -> bytes | None:
        """One message head (through the blank line), or None at a clean end."""
        while b"\r\n\r\n" not in self.buf:
            if len(self.buf) > _MAX_HEAD:
                raise _Abort()
            if not self.fill(watch):
                if self.buf:
                    raise _Abort()
                return None
        i = self.buf.index(b"\r\n\r\n") + 4
        out, self.buf = self.buf[:i], self.buf[i:]
        return out

    def take(self, n: int) -> bytes:
        """Up to ``n`` bytes (at least one), waiting for them."""
        if not self.buf and not self.fill():
            raise _Abort()
        out, self.buf = self.buf[:n], self.buf[n:]
        return out

    def line(self) -> bytes:
        while b"\r\n" not in self.buf:
            if len(self.buf) > _MAX_HEAD or not self.fill():
                raise _Abort()
        i = self.buf.index(b"\r\n") + 2
        out, self.buf = self.buf[:i], self.buf[i:]
        return out


class _Message:
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
                raise _Abort() from None
        return "close", 0


class _Shaper:
    """Sends a message's bytes to ``dst``, applying one fault: ``reset`` or ``stall``
    once ``cut`` bytes have gone, ``drip`` while its time lasts."""

    def __init__(self, proxy: "FaultProxy", dst: socket.socket, fault: str | None,
                 cut: int, what: str = "") -> None:
        self.proxy = proxy
        self.what = what
        self.dst = dst
        self.fault = fault
        self.cut = max(0, cut)
        self.sent = 0
        self.drip_until = time.monotonic() + proxy.drip_seconds
        self.counted = False

    def _count(self) -> None:
        if not self.counted:
            self.counted = True
            self.proxy._injected(self.fault or "", self.what)

    def _sendall(self, data: bytes) -> None:
        try:
            self.dst.sendall(data)
        except OSError:
            raise _Abort() from None
        self.sent += len(data)

    def send(self, data: bytes) -> None:
        p = self.proxy
        if self.fault in ("reset", "stall") and self.sent + len(data) >= self.cut:
            self._sendall(data[:self.cut - self.sent])
            self._count()
            if self.fault == "stall":
                p._stop.wait(p.stall_seconds)  # nothing moves either way
            raise _Abort(rst=True)
        if self.fault == "drip":
            while data and time.monotonic() < self.drip_until and not p._stop.is_set():
                self._count()
                piece, data = data[:p.drip_bytes], data[p.drip_bytes:]
                self._sendall(piece)
                p._stop.wait(p.drip_interval)
        if data:
            self._sendall(data)


def _pipe_body(src: _Side, shaper: _Shaper, framing: tuple[str, int]) -> None:
    """Forwards one body, framed as ``framing``, from ``src`` through ``shaper``."""
    kind, n = framing
    if kind == "length":
        left = n
        while left > 0:
            data = src.take(min(left, _RECV))
            left -= len(data)
            shaper.send(data)
    elif kind == "chunked":
        for _ in range(1 << 20):  # chunks of one body, at most
            line = src.line()
            shaper.send(line)
            try:
                size = int(line.split(b";", 1)[0].strip(), 16)
            except ValueError:
                raise _Abort() from None
            if size == 0:
                for _ in range(1000):  # trailers, then the blank line
                    trailer = src.line()
                    shaper.send(trailer)
                    if trailer == b"\r\n":
                        return
                raise _Abort()
            left = size + 2  # the chunk and its CRLF
            while left > 0:
                data = src.take(min(left, _RECV))
                left -= len(data)
                shaper.send(data)
        raise _Abort()
    else:  # until the end of the stream
        for _ in range(1 << 24):  # reads of one body, at most
            if not (src.buf or src.fill()):
                return
            data, src.buf = src.buf, b""
            shaper.send(data)
        raise _Abort()


def _drain_body(src: _Side, framing: tuple[str, int], limit: float) -> bool:
    """Reads and discards one body (at most ``limit`` seconds); whether it all came."""
    kind, n = framing
    if kind == "close":
        return False
    end = time.monotonic() + limit

    class _Discard:
        def send(self, data: bytes) -> None:
            if time.monotonic() > end:
                raise _Abort()

    try:
        _pipe_body(src, _Discard(), framing)  # type: ignore[arg-type]
    except _Abort:
        return False
    return True


def _slowdown_response(req: _Message, number: int, keep_alive: bool) -> bytes:
    target = req.first[1] if len(req.first) > 1 else "/"
    resource = target.split("?", 1)[0]
    body = (f'<?xml version="1.0" encoding="UTF-8"?>\n<Error><Code>SlowDown</Code>'
            f"<Message>Please reduce your request rate.</Message>"
            f"<Resource>{resource}</Resource><RequestId>pyckpt-fault-{number}</RequestId>"
            f"</Error>").encode()
    head = ("HTTP/1.1 503 Slow Down\r\nContent-Type: application/xml\r\n"
            f"Content-Length: {len(body)}\r\nx-amz-request-id: pyckpt-fault-{number}\r\n"
            f"Connection: {'keep-alive' if keep_alive else 'close'}\r\n\r\n").encode()
    return head if req.first[0].upper() == "HEAD" else head + body


def _reset(sock: socket.socket) -> None:
    with contextlib.suppress(OSError):
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    with contextlib.suppress(OSError):
        sock.close()


class FaultProxy:
    """See the module's docstring. ``reset``, ``slowdown``, ``stall``, ``drip``: the
    probability that a request that ``match`` selects gets that fault (one fault per
    request at most; a slowdown starts a burst of ``burst`` 503 answers, one per
    following selected request); ``max_per_kind``: at most that many faults of each
    kind in all; ``body``: which body a reset, stall or drip hits when the request
    has one: "request", "response" (the server took the request, its answer is
    lost) or "either" (drawn at random); ``match``: a text (or texts) that ``"METHOD /path?query"`` must
    contain, or a predicate on it; None: every request."""

    def __init__(self, target_port: int, *, reset: float = 0.0, slowdown: float = 0.0,
                 stall: float = 0.0, drip: float = 0.0, seed: int = 0,
                 match: str | tuple[str, ...] | Callable[[str], bool] | None = None,
                 burst: int = 3, max_per_kind: int = 20, body: str = "either",
                 stall_seconds: float = 5.0,
                 drip_bytes: int = 4096, drip_interval: float = 0.02,
                 drip_seconds: float = 0.5, idle_timeout: float = 60.0,
                 max_connections: int = 5000, max_requests_per_connection: int = 10000,
                 lifetime: float = 900.0) -> None:
        self.target = ("127.0.0.1", int(target_port))
        self.rates: dict[str, float] = {}
        self.match: Any = None
        self.configure(reset=reset, slowdown=slowdown, stall=stall, drip=drip, match=match)
        if body not in ("either", "request", "response"):
            raise ValueError(f"body must be 'either', 'request' or 'response', not {body!r}")
        self.burst = burst
        self.body = body
        self.max_per_kind = max_per_kind
        self.stall_seconds = stall_seconds
        self.drip_bytes = max(1, drip_bytes)
        self.drip_interval = drip_interval
        self.drip_seconds = drip_seconds
        self.idle_timeout = idle_timeout
        self.max_connections = max_connections
        self.max_requests = max_requests_per_connection
        self.lifetime = lifetime
        self._rng = random.Random(seed)
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._burst_left = 0
        #: faults injected, per kind; and one (kind, "METHOD /path") per fault
        self.counts: dict[str, int] = {k: 0 for k in KINDS}
        self.events: list[tuple[str, str]] = []
        #: requests seen (a burst's 503s included) and connections accepted
        self.requests = 0
        self.connections = 0
        self._socks: set[socket.socket] = set()
        self._threads: list[threading.Thread] = []
        self.listener = socket.socket()
        self.listener.bind(("127.0.0.1", 0))
        self.listener.listen(128)
        self.port = self.listener.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self._spawn(self._accept)

    # -- configuration and counters ------------------------------------------------
    def configure(self, *, reset: float | None = None, slowdown: float | None = None,
                  stall: float | None = None, drip: float | None = None,
                  match: Any = "unchanged") -> None:
        """Changes the fault rates (and ``match``) from the next request on."""
        for kind, rate in (("reset", reset), ("slowdown", slowdown), ("stall", stall),
                           ("drip", drip)):
            if rate is not None:
                if not 0.0 <= rate <= 1.0:
                    raise ValueError(f"{kind} must be a probability, not {rate!r}")
                self.rates[kind] = rate
        if match != "unchanged":
            self.match = match

    def quiet(self) -> None:
        """No more faults (an ongoing burst ends too)."""
        self.configure(reset=0.0, slowdown=0.0, stall=0.0, drip=0.0)
        with self._lock:
            self._burst_left = 0

    def _selected(self, what: str) -> bool:
        m = self.match
        if m is None:
            return True
        if callable(m):
            return bool(m(what))
        return any(t in what for t in ((m,) if isinstance(m, str) else m))

    def _decide(self, what: str) -> tuple[str | None, bool, int]:
        """(the fault for this request or None, whether a body fault goes to the
        request's body rather than the response's, the request's number)."""
        with self._lock:
            self.requests += 1
            number = self.requests
            if not self._selected(what):
                return None, False, number
            if self._burst_left > 0:
                self._burst_left -= 1
                return "slowdown", False, number
            kinds = list(KINDS)
            self._rng.shuffle(kinds)
            for kind in kinds:
                if self.counts[kind] < self.max_per_kind and self._rng.random() < self.rates[kind]:
                    if kind == "slowdown":
                        self._burst_left = self.burst - 1
                    side = self._rng.random() < 0.5 if self.body == "either" else (
                        self.body == "request")
                    return kind, side, number
            return None, False, number

    def _injected(self, kind: str, what: str) -> None:
        with self._lock:
            self.counts[kind] += 1
            self.events.append((kind, what))

    def summary(self) -> str:
        with self._lock:
            parts = ", ".join(f"{k} {self.counts[k]}" for k in KINDS)
            return f"{parts} (of {self.requests} requests on {self.connections} connections)"

    # -- connections ------------------------------------------------------------------
    def _spawn(self, fn: Callable[..., None], *args: Any) -> None:
        t = threading.Thread(target=fn, args=args, daemon=True, name="pyckpt-fault-proxy")
        with self._lock:
            self._threads = [x for x in self._threads if x.is_alive()]
            self._threads.append(t)
        t.start()

    def _accept(self) -> None:
        end = time.monotonic() + self.lifetime
        self.listener.settimeout(0.2)
        while not self._stop.is_set() and time.monotonic() < end:
            if self.connections >= self.max_connections:
                break
            try:
                client, _ = self.listener.accept()
            except socket.timeout:
                continue
            except OSError:
                return
            with self._lock:
                self.connections += 1
            self._spawn(self._serve, client)
        with contextlib.suppress(OSError):
            self.listener.close()

    def _serve(self, client_sock: socket.socket) -> None:
        upstream_sock: socket.socket | None = None
        rst = False
        with self._lock:
            self._socks.add(client_sock)
        try:
            client_sock.settimeout(self.idle_timeout)
            upstream_sock = socket.create_connection(self.target, timeout=10)
            upstream_sock.settimeout(self.idle_timeout)
            with self._lock:
                self._socks.add(upstream_sock)
            client, upstream = _Side(client_sock, self), _Side(upstream_sock, self)
            for _ in range(self.max_requests):
                if not self._exchange(client, upstream):
                    break
        except _Abort as e:
            rst = e.rst
        except OSError:
            pass
        finally:
            for sock in (client_sock, upstream_sock):
                if sock is not None:
                    if rst:
                        _reset(sock)
                    else:
                        with contextlib.suppress(OSError):
                            sock.close()
                    with self._lock:
                        self._socks.discard(sock)

    def _exchange(self, client: _Side, upstream: _Side) -> bool:
        """One request and its response; whether the connection goes on."""
        raw = client.head(watch=upstream)
        if raw is None:
            return False
        req = _Message(raw)
        if len(req.first) < 3:
            raise _Abort()
        method = req.first[0].upper()
        what = f"{method} {req.first[1]}"
        fault, request_side, number = self._decide(what)
        req_framing = req.framing()
        if req_framing[0] == "close":
            req_framing = ("length", 0)  # a request without a length has no body
        expect = "100-continue" in (req.get("expect") or "").lower()
        if fault == "slowdown":
            drained = not expect and _drain_body(client, req_framing, limit=10.0)
            self._injected("slowdown", what)
            try:
                client.sock.sendall(_slowdown_response(req, number, keep_alive=drained))
            except OSError:
                raise _Abort() from None
            if not drained:  # the client may still send: read a little, then close
                with contextlib.suppress(_Abort, OSError):
                    client.sock.shutdown(socket.SHUT_WR)
                    end = time.monotonic() + 1.0
                    while time.monotonic() < end and client.fill():
                        client.buf = b""
            return drained
        has_body = req_framing != ("length", 0)
        on_request = has_body and request_side
        # the proxy answers "100 Continue" itself; the server gets no Expect
        head = req.without("expect") if expect else raw
        try:
            upstream.sock.sendall(head)
            if expect:
                client.sock.sendall(b"HTTP/1.1 100 Continue\r\n\r\n")
        except OSError:
            raise _Abort() from None
        length = req_framing[1] if req_framing[0] == "length" else 2048
        _pipe_body(client, _Shaper(self, upstream.sock, fault if on_request else None,
                                   length // 2, what), req_framing)
        # the response (skipping interim 1xx answers)
        for _ in range(10):
            raw_resp = upstream.head()
            if raw_resp is None:
                raise _Abort()
            resp = _Message(raw_resp)
            status = int(resp.first[1]) if len(resp.first) > 1 and resp.first[1].isdigit() else 0
            if status >= 200 or status == 0:
                break
            try:
                client.sock.sendall(raw_resp)
            except OSError:
                raise _Abort() from None
        else:
            raise _Abort()
        if method == "HEAD" or status in (204, 304):
            framing: tuple[str, int] = ("length", 0)
        else:
            framing = resp.framing()
        total = len(raw_resp) + (framing[1] if framing[0] == "length" else 2048)
        shaper = _Shaper(self, client.sock, None if on_request else fault, total // 2, what)
        shaper.send(raw_resp)
        _pipe_body(upstream, shaper, framing)
        if framing[0] == "close":
            return False
        closing = "close" in ((resp.get("connection") or "") + (req.get("connection") or "")).lower()
        return not closing

    # -- the end ------------------------------------------------------------------------
    def close(self) -> None:
        """Stops the proxy: closes the listener and every connection, joins the
        threads (2 s each at most)."""
        self._stop.set()
        with contextlib.suppress(OSError):
            self.listener.close()
        with self._lock:
            socks, threads = list(self._socks), list(self._threads)
        for sock in socks:
            with contextlib.suppress(OSError):
                sock.close()
        for t in threads:
            t.join(timeout=2)

    def __enter__(self) -> "FaultProxy":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


@contextlib.contextmanager
def fault_proxy(target_url: str, **kwargs: Any) -> Iterator[FaultProxy]:
    """A ``FaultProxy`` in front of the server at ``target_url`` (http://127.0.0.1:PORT)."""
    host_port = target_url.split("://", 1)[-1].split("/", 1)[0]
    host, _, port = host_port.rpartition(":")
    if host not in ("127.0.0.1", "localhost"):
        raise ValueError(f"the fault proxy only reaches servers on 127.0.0.1, not {host!r}")
    proxy = FaultProxy(int(port), **kwargs)
    try:
        yield proxy
    finally:
        proxy.close()
