"""TCP relays on 127.0.0.1 in front of local test servers.

``Relay`` is what every test proxy shares: a listener on 127.0.0.1, a thread
that accepts connections and hands each to the subclass (``_relay``), the
threads and sockets it started, and ``close``, which stops them all.
``LoopbackProxy`` forwards bytes as they come (optionally at a bounded rate);
``fault_proxy.FaultProxy`` reads HTTP/1.1 messages and injects faults.
Relays listen on 127.0.0.1 only and connect only to 127.0.0.1.
"""

from __future__ import annotations

import contextlib
import math
import socket
import threading
import time
from typing import Any, Callable, Iterator, TypeVar

_R = TypeVar("_R", bound="Relay")


class Relay:
    """A listener on 127.0.0.1 for a server on 127.0.0.1 (``target``). Once
    ``_start`` is called, a thread accepts connections (while ``_accepting()``, at
    most ``lifetime`` seconds) and hands each to ``_relay``; ``_spawn`` starts
    the threads that ``close`` joins, ``_hold`` notes the sockets it closes."""

    thread_name = "pyckpt-relay"
    #: seconds the relay accepts connections (then its listener closes)
    lifetime: float = math.inf

    def __init__(self, target_port: int, *, backlog: int, rcvbuf: int | None = None) -> None:
        self.target = ("127.0.0.1", int(target_port))
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._socks: set[socket.socket] = set()
        self._threads: list[threading.Thread] = []
        self.listener = socket.socket()
        if rcvbuf is not None:
            self.listener.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
        self.listener.bind(("127.0.0.1", 0))
        self.listener.listen(backlog)
        self.listener.settimeout(0.2)
        self.port = self.listener.getsockname()[1]

    def _start(self) -> None:
        """Starts accepting connections."""
        self._spawn(self._accept)

    def _accepting(self) -> bool:
        """Whether to accept more connections."""
        return True

    def _relay(self, client: socket.socket) -> None:
        """Takes over an accepted connection (in the accepting thread: start threads
        for anything long)."""
        raise NotImplementedError

    def _spawn(self, fn: Callable[..., None], *args: Any) -> None:
        t = threading.Thread(target=fn, args=args, daemon=True, name=self.thread_name)
        with self._lock:
            self._threads = [x for x in self._threads if x.is_alive()]
            self._threads.append(t)
        t.start()

    def _hold(self, *socks: socket.socket) -> None:
        """Notes sockets for ``close`` to close."""
        with self._lock:
            self._socks.update(socks)

    def _release(self, sock: socket.socket) -> None:
        with self._lock:
            self._socks.discard(sock)

    def _accept(self) -> None:
        end = time.monotonic() + self.lifetime
        while not self._stop.is_set() and time.monotonic() < end and self._accepting():
            try:
                client, _ = self.listener.accept()
            except socket.timeout:
                continue
            except OSError:
                return
            self._relay(client)
        with contextlib.suppress(OSError):
            self.listener.close()

    def close(self) -> None:
        """Stops the relay: closes the listener and every connection, then joins the
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

    def __enter__(self: _R) -> _R:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


class LoopbackProxy(Relay):
    """A TCP proxy on 127.0.0.1 in front of a local server, forwarding each connection
    at most ``rate`` bytes per second in each direction (None: as fast as it can), so
    that tests can make a transfer slow without stopping it. Threads, one pair per
    connection; ``close`` stops them all."""

    thread_name = "pyckpt-proxy"

    def __init__(self, target_port: int, rate: float | None = None) -> None:
        # a small receive window: the client cannot push far ahead of the rate
        super().__init__(target_port, backlog=64, rcvbuf=64 << 10)
        self.rate = rate
        self._start()

    def _relay(self, client: socket.socket) -> None:
        try:
            upstream = socket.create_connection(self.target, timeout=10)
        except OSError:
            client.close()
            return
        for sock in (client, upstream):
            sock.settimeout(0.2)
        self._hold(client, upstream)
        self._spawn(self._pump, client, upstream)
        self._spawn(self._pump, upstream, client)

    def _pump(self, src: socket.socket, dst: socket.socket) -> None:
        chunk = 64 << 10 if self.rate is None else max(1024, min(64 << 10, int(self.rate / 50)))
        due = time.monotonic()
        while not self._stop.is_set():
            try:
                data = src.recv(chunk)
            except socket.timeout:
                continue
            except OSError:
                break
            if not data:
                with contextlib.suppress(OSError):
                    dst.shutdown(socket.SHUT_WR)
                break
            try:
                dst.sendall(data)
            except OSError:
                break
            if self.rate is not None:
                due = max(due, time.monotonic() - 0.5) + len(data) / self.rate
                self._stop.wait(max(0.0, due - time.monotonic()))


@contextlib.contextmanager
def loopback_proxy(storage_options: dict, rate: float | None = None) -> Iterator[dict]:
    """The ``storage_options`` of an S3 test server, reached through a ``LoopbackProxy``."""
    port = int(storage_options["endpoint_url"].rsplit(":", 1)[1].split("/")[0])
    proxy = LoopbackProxy(port, rate)
    try:
        yield {**storage_options, "endpoint_url": f"http://127.0.0.1:{proxy.port}"}
    finally:
        proxy.close()
