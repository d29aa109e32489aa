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
import socket
import struct
import time
from typing import Any, Callable, Iterator

from .http_wire import Abort, Message, Side, drain_body, pipe_body
from .relay import Relay

KINDS = ("reset", "slowdown", "stall", "drip")


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
            raise Abort() from None
        self.sent += len(data)

    def send(self, data: bytes) -> None:
        p = self.proxy
        if self.fault in ("reset", "stall") and self.sent + len(data) >= self.cut:
            self._sendall(data[:self.cut - self.sent])
            self._count()
            if self.fault == "stall":
                p._stop.wait(p.stall_seconds)  # nothing moves either way
            raise Abort(rst=True)
        if self.fault == "drip":
            while data and time.monotonic() < self.drip_until and not p._stop.is_set():
                self._count()
                piece, data = data[:p.drip_bytes], data[p.drip_bytes:]
                self._sendall(piece)
                p._stop.wait(p.drip_interval)
        if data:
            self._sendall(data)


def _slowdown_response(req: Message, number: int, keep_alive: bool) -> bytes:
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


class FaultProxy(Relay):
    """See the module's docstring. ``reset``, ``slowdown``, ``stall``, ``drip``: the
    probability that a request that ``match`` selects gets that fault (one fault per
    request at most; a slowdown starts a burst of ``burst`` 503 answers, one per
    following selected request); ``max_per_kind``: at most that many faults of each
    kind in all; ``body``: which body a reset, stall or drip hits when the request
    has one: "request", "response" (the server took the request, its answer is
    lost) or "either" (drawn at random); ``match``: a text (or texts) that ``"METHOD /path?query"`` must
    contain, or a predicate on it; None: every request."""

    thread_name = "pyckpt-fault-proxy"

    def __init__(self, target_port: int, *, reset: float = 0.0, slowdown: float = 0.0,
                 stall: float = 0.0, drip: float = 0.0, seed: int = 0,
                 match: str | tuple[str, ...] | Callable[[str], bool] | None = None,
                 burst: int = 3, max_per_kind: int = 20, body: str = "either",
                 stall_seconds: float = 5.0,
                 drip_bytes: int = 4096, drip_interval: float = 0.02,
                 drip_seconds: float = 0.5, idle_timeout: float = 60.0,
                 max_connections: int = 5000, max_requests_per_connection: int = 10000,
                 lifetime: float = 900.0) -> None:
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
        self._burst_left = 0
        #: faults injected, per kind; and one (kind, "METHOD /path") per fault
        self.counts: dict[str, int] = {k: 0 for k in KINDS}
        self.events: list[tuple[str, str]] = []
        #: requests seen (a burst's 503s included) and connections accepted
        self.requests = 0
        self.connections = 0
        super().__init__(target_port, backlog=128)
        self.url = f"http://127.0.0.1:{self.port}"
        self._start()

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
    def _accepting(self) -> bool:
        return self.connections < self.max_connections

    def _relay(self, client: socket.socket) -> None:
        with self._lock:
            self.connections += 1
        self._spawn(self._serve, client)

    def _serve(self, client_sock: socket.socket) -> None:
        upstream_sock: socket.socket | None = None
        rst = False
        self._hold(client_sock)
        try:
            client_sock.settimeout(self.idle_timeout)
            upstream_sock = socket.create_connection(self.target, timeout=10)
            upstream_sock.settimeout(self.idle_timeout)
            self._hold(upstream_sock)
            client = Side(client_sock, self._stop, self.idle_timeout)
            upstream = Side(upstream_sock, self._stop, self.idle_timeout)
            for _ in range(self.max_requests):
                if not self._exchange(client, upstream):
                    break
        except Abort as e:
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
                    self._release(sock)

    # -- one request and its response ---------------------------------------------------
    def _exchange(self, client: Side, upstream: Side) -> bool:
        """One request and its response; whether the connection goes on."""
        raw = client.head(watch=upstream)
        if raw is None:
            return False
        req = Message(raw)
        if len(req.first) < 3:
            raise Abort()
        what = f"{req.first[0].upper()} {req.first[1]}"
        fault, request_side, number = self._decide(what)
        req_framing = req.framing()
        if req_framing[0] == "close":
            req_framing = ("length", 0)  # a request without a length has no body
        expect = "100-continue" in (req.get("expect") or "").lower()
        if fault == "slowdown":
            return self._slow_down(client, req, req_framing, expect, what, number)
        on_request = req_framing != ("length", 0) and request_side
        self._send_request(client, upstream, req, req_framing, expect,
                           fault if on_request else None, what)
        resp = self._send_response(client, upstream, req, None if on_request else fault, what)
        if resp is None:  # its body ended with the connection
            return False
        closing = "close" in ((resp.get("connection") or "") + (req.get("connection") or "")).lower()
        return not closing

    def _slow_down(self, client: Side, req: Message, req_framing: tuple[str, int], expect: bool,
                   what: str, number: int) -> bool:
        """Answers the request with a 503 SlowDown of the proxy's own (the server never
        sees the request); whether the connection goes on."""
        drained = not expect and drain_body(client, req_framing, limit=10.0)
        self._injected("slowdown", what)
        try:
            client.sock.sendall(_slowdown_response(req, number, keep_alive=drained))
        except OSError:
            raise Abort() from None
        if not drained:  # the client may still send: read a little, then close
            with contextlib.suppress(Abort, OSError):
                client.sock.shutdown(socket.SHUT_WR)
                end = time.monotonic() + 1.0
                while time.monotonic() < end and client.fill():
                    client.buf = b""
        return drained

    def _send_request(self, client: Side, upstream: Side, req: Message,
                      req_framing: tuple[str, int], expect: bool, fault: str | None,
                      what: str) -> None:
        """Forwards the request, ``fault`` applied to its body (None: no fault)."""
        # the proxy answers "100 Continue" itself; the server gets no Expect
        head = req.without("expect") if expect else req.raw
        try:
            upstream.sock.sendall(head)
            if expect:
                client.sock.sendall(b"HTTP/1.1 100 Continue\r\n\r\n")
        except OSError:
            raise Abort() from None
        length = req_framing[1] if req_framing[0] == "length" else 2048
        pipe_body(client, _Shaper(self, upstream.sock, fault, length // 2, what), req_framing)

    def _send_response(self, client: Side, upstream: Side, req: Message, fault: str | None,
                       what: str) -> Message | None:
        """Forwards the response to ``req``, ``fault`` applied to it (None: no fault);
        returns its head, or None when its body ran to the end of the connection."""
        resp, status = _final_head(client, upstream)
        if req.first[0].upper() == "HEAD" or status in (204, 304):
            framing: tuple[str, int] = ("length", 0)
        else:
            framing = resp.framing()
        total = len(resp.raw) + (framing[1] if framing[0] == "length" else 2048)
        shaper = _Shaper(self, client.sock, fault, total // 2, what)
        shaper.send(resp.raw)
        pipe_body(upstream, shaper, framing)
        return None if framing[0] == "close" else resp


def _final_head(client: Side, upstream: Side) -> tuple[Message, int]:
    """The head of the response and its status (0 when unreadable), once the interim
    1xx answers before it are forwarded to the client."""
    for _ in range(10):
        raw = upstream.head()
        if raw is None:
            raise Abort()
        resp = Message(raw)
        status = int(resp.first[1]) if len(resp.first) > 1 and resp.first[1].isdigit() else 0
        if status >= 200 or status == 0:
            return resp, status
        try:
            client.sock.sendall(raw)
        except OSError:
            raise Abort() from None
    raise Abort()


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
