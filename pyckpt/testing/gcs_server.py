"""A GCS emulator (gcp-storage-emulator, threaded: gcs_emulator.py) on a data
directory of its own, on 127.0.0.1, that a test can stall (SIGSTOP), kill and start
again on the same data and port: the GCS counterpart of ``servers.SeaweedServer``."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from typing import Iterator

from .servers import _die_with_parent, _stop, _wait_http, free_port


class GcsServer:
    """gcp-storage-emulator storing its objects under ``data``; ``options`` are the
    storage_options that reach it through gcsfs."""

    def __init__(self, startup_timeout: float = 60.0) -> None:
        os.environ["GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT"] = "false"  # see servers.py
        self.startup_timeout = startup_timeout
        self.data = tempfile.mkdtemp(prefix="pyckpt-gcs-")
        self.port = free_port()
        self.log = os.path.join(self.data, "emulator.log")
        self.proc: subprocess.Popen | None = None
        self.options: dict = {"endpoint_url": f"http://127.0.0.1:{self.port}", "token": "anon",
                              "project": "test"}

    def start(self) -> None:
        """Starts the emulator (again, after ``kill``: the same data and port)."""
        with open(self.log, "ab") as out:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "pyckpt.testing.gcs_emulator", "--data-dir",
                 os.path.join(self.data, "store"), "start", "--host", "127.0.0.1", "--port",
                 str(self.port), "-q"],
                stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
                preexec_fn=_die_with_parent, cwd=self.data)
        _wait_http(f"http://127.0.0.1:{self.port}/storage/v1/b?project=test", self.proc,
                   self.startup_timeout, self.log)

    def stop_now(self) -> None:
        """SIGSTOP: connections are accepted by the kernel, nothing answers."""
        if self.proc is not None:
            os.killpg(self.proc.pid, signal.SIGSTOP)

    def resume(self) -> None:
        if self.proc is not None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGCONT)

    def kill(self) -> None:
        """SIGKILL, as a crash would (the data directory stays)."""
        if self.proc is not None and self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=30)

    def close(self) -> None:
        if self.proc is not None:
            self.resume()
            _stop(self.proc, grace=2.0)
        shutil.rmtree(self.data, ignore_errors=True)


@contextlib.contextmanager
def gcs_server(startup_timeout: float = 60.0) -> Iterator[GcsServer]:
    """A started ``GcsServer``, stopped and removed at the end."""
    server = GcsServer(startup_timeout)
    try:
        server.start()
        yield server
    finally:
        server.close()
