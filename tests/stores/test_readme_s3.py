"""The README's object-store snippet, run as a new user would (issue 13): the local
S3 server command (``python -m pyckpt.testing.servers s3``) started in the
background, the variables it prints exported, the README's S3 block run as written
in a fresh interpreter with that environment and nothing else; then Ctrl-C stops
the server.
And what a SeaweedFS start leaves behind in /tmp: nothing."""

import os
import pathlib
import queue
import re
import shlex
import signal
import subprocess
import sys
import threading
import time
import urllib.request

import pytest

import pyckpt
from pyckpt.testing import servers
from pyckpt.testing.requirements import require

README = pathlib.Path(__file__).resolve().parents[2] / "README.md"


def _user_env():
    """This environment, less anything that already points a client at S3."""
    return {k: v for k, v in os.environ.items()
            if not k.startswith(("AWS_", "FSSPEC_S3", "S3_ENDPOINT"))}


class _Command:
    """``python -m pyckpt.testing.servers s3`` in the background, its output read
    line by line."""

    def __init__(self, cwd):
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "pyckpt.testing.servers", "s3", "--max-seconds", "240"],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=cwd,
            env=_user_env(), start_new_session=True)
        self.lines = []
        self._queue = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self):
        for line in self.proc.stdout:
            self._queue.put(line.rstrip("\n"))
        self._queue.put(None)

    def until(self, pattern, timeout):
        """Reads lines until one matches ``pattern``; returns the match."""
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            try:
                line = self._queue.get(timeout=max(0.0, end - time.monotonic()))
            except queue.Empty:
                break
            if line is None:
                break
            self.lines.append(line)
            m = re.search(pattern, line)
            if m:
                return m
        raise AssertionError(f"no line matching {pattern!r} in {timeout} s; output:\n"
                             + "\n".join(self.lines))

    def kill(self):
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)  # its server dies with it
            self.proc.wait(timeout=30)


def _readme_s3_block():
    """The README's S3 block (the first Python block with an s3:// URL)."""
    blocks = re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.S)
    s3 = [code for code in blocks if "s3://" in code]
    assert s3, "the README has no S3 block"
    return s3[0]


CHECK = """
assert pyckpt.latest_checkpoint("s3://my-bucket/run", storage_options=s3).endswith("ckpt-100")
assert embedding.shape == (4, 4)
assert pyckpt.latest_checkpoint("s3://my-bucket/managed", storage_options=s3) is not None
print("README S3 BLOCK OK")
"""


def test_readme_s3_block_runs_after_the_local_server_command(tmp_path):
    require("s3fs", "a storage server or its client")
    shell = re.findall(r"```bash\n(.*?)```", README.read_text(), flags=re.S)
    assert any(b.startswith("python -m pyckpt.testing.servers s3") for b in shell), \
        "the README no longer shows the command this test runs"
    cmd = _Command(tmp_path)
    try:
        endpoint = cmd.until(r"^S3 endpoint: (http://127\.0\.0\.1:\d+)$", 120).group(1)
        m = cmd.until(r"^bucket: +s3://(\S+) +\(data in (\S+), removed at exit\)", 10)
        bucket, data = m.group(1), m.group(2)
        cmd.until(r"^Ctrl-C stops the server", 10)
        exports = dict(shlex.split(line)[1].split("=", 1) for line in cmd.lines
                       if line.startswith("export "))
        assert bucket == "my-bucket"  # the README's
        assert exports["AWS_ENDPOINT_URL"] == endpoint
        assert {"AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_DEFAULT_REGION",
                "FSSPEC_S3_ENDPOINT_URL"} <= set(exports)
        # the README's block as written, in a new interpreter, with the exports and
        # nothing else
        run = subprocess.run([sys.executable, "-c", _readme_s3_block() + CHECK],
                             env={**_user_env(), **exports}, cwd=tmp_path,
                             capture_output=True, text=True, timeout=180)
        assert run.returncode == 0 and "README S3 BLOCK OK" in run.stdout, run.stdout + run.stderr
        so = {"endpoint_url": endpoint, "key": exports["AWS_ACCESS_KEY_ID"],
              "secret": exports["AWS_SECRET_ACCESS_KEY"], **servers.S3_CLIENT}
        pyckpt.load_checkpoint("s3://my-bucket/run/ckpt-100", storage_options=so).verify()
        # Ctrl-C: the server stops, its files go
        s3_port = int(endpoint.rsplit(":", 1)[1])
        os.kill(cmd.proc.pid, signal.SIGINT)
        assert cmd.proc.wait(timeout=60) == 0, "\n".join(cmd.lines)
        cmd.until(r"^stopped\.$", 5)
        assert not os.path.exists(data)
        assert not os.path.exists(f"/tmp/seaweedfs-s3-grpc-{s3_port + 10000}.sock")
        with pytest.raises(OSError):
            urllib.request.urlopen(endpoint, timeout=2)
    finally:
        cmd.kill()


_WEED_FILE = re.compile(r"^(seaweedfs-.*\.sock|weed\..*\.log\..*|weed\.(INFO|WARNING|ERROR|FATAL))$")


def _weed_files():
    return {n for n in os.listdir("/tmp") if _WEED_FILE.match(n)}


def _of(server, pid, names):
    """The names among ``names`` that belong to ``server`` (its ports, its pid)."""
    ports = {p + d for p in server.ports for d in (0, 10000)}
    out = []
    for n in names:
        m = re.search(r"-(\d+)\.sock$", n)
        if m and int(m.group(1)) in ports:
            out.append(n)
        elif n.endswith(f".{pid}"):
            out.append(n)
        elif n.startswith("weed.") and os.path.islink(os.path.join("/tmp", n)):
            if os.readlink(os.path.join("/tmp", n)).endswith(f".{pid}"):
                out.append(n)
    return sorted(out)


def test_seaweedfs_leaves_no_sockets_or_logs_in_tmp():
    """weed puts its log files in $TMPDIR unless told (-logdir), and some of its unix
    sockets in /tmp whatever it is told: the log files and the sockets that take a
    flag go to the server's own directory, the others are removed when it stops.
    Other processes may start servers meanwhile: only this server's files count."""
    before = _weed_files()
    server = servers.SeaweedServer()
    try:
        server.start()
        pid = server.pid
        logs = os.listdir(os.path.join(server.data, "logs"))
        assert any(".log.INFO." in n for n in logs), logs
        assert os.path.exists(os.path.join(server.data, "s3.sock"))
        during = _of(server, pid, _weed_files() - before)
        assert all(n.endswith(".sock") for n in during), during  # no log files in /tmp
    finally:
        server.close()
    after = _weed_files()
    print(f"\nSeaweedFS files in /tmp: {len(before)} before, {len(during)} of this server's "
          f"while it ran ({', '.join(during)}), {len(after)} after (any process's), "
          f"{len(_of(server, pid, after))} of this server's after it stopped")
    assert _of(server, pid, after) == []
    assert not os.path.exists(server.data)
