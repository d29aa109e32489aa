"""Issue 22, item 3: store errors reach Python as ``CheckpointError``s naming the
cause and the fix (as the command line already printed them), and the command
line's check of a remote store is bounded by ``--timeout`` as a whole."""

import os
import socket
import subprocess
import sys
import textwrap
import threading
import time

import numpy as np
import pytest

import pyckpt
from pyckpt.testing.requirements import require


@pytest.mark.parametrize("op", ["save", "load", "latest"])
def test_an_unknown_scheme_is_a_checkpoint_error(tmp_path, op):
    with pytest.raises(pyckpt.CheckpointIOError, match=r"no storage serves foo:// URLs.*"
                                                       r"install and import the fsspec"):
        if op == "save":
            pyckpt.save({"a": np.ones(2)}, "foo://bucket/ckpt-1")
        elif op == "load":
            pyckpt.load("foo://bucket/ckpt-1")
        else:
            pyckpt.latest_checkpoint("foo://bucket")


def _no_cloud_env(tmp_path):
    """An environment with no AWS or Google credentials anywhere, whose clients never
    look for them off this machine (no instance metadata service)."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("AWS_", "GOOGLE_", "GCE_", "CLOUDSDK_"))}
    env.update(HOME=str(tmp_path), AWS_EC2_METADATA_DISABLED="true",
               AWS_SHARED_CREDENTIALS_FILE=str(tmp_path / "none"),
               AWS_CONFIG_FILE=str(tmp_path / "none"))
    return env


def test_missing_s3_credentials_are_one_checkpoint_io_error(tmp_path):
    require("s3fs", "the S3 client")
    # port 9 on loopback: nothing listens, and the error comes before any request
    code = textwrap.dedent("""
        import numpy as np, pyckpt
        so = {"endpoint_url": "http://127.0.0.1:9"}
        for op in ("save", "load"):
            try:
                if op == "save":
                    pyckpt.save({"a": np.ones(2)}, "s3://bucket/ckpt-1", storage_options=so)
                else:
                    pyckpt.load("s3://bucket/ckpt-1", storage_options=so)
            except pyckpt.CheckpointIOError as e:
                print(op, "|", e)
    """)
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                       timeout=120, env=_no_cloud_env(tmp_path), cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    lines = r.stdout.strip().splitlines()
    assert [ln.split(" |")[0] for ln in lines] == ["save", "load"], r.stdout + r.stderr
    for ln in lines:
        assert "no usable credentials for s3://bucket/ckpt-1" in ln
        assert "NoCredentialsError" in ln and "AWS_ACCESS_KEY_ID" in ln
        assert "storage_options={'key': ..., 'secret': ...}" in ln
    assert "Traceback" not in r.stderr


def _black_hole():
    """A TCP server on 127.0.0.1 that accepts connections and never answers."""
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(64)
    held = []
    stop = threading.Event()

    def serve():
        srv.settimeout(0.2)
        while not stop.is_set():
            try:
                held.append(srv.accept()[0])
            except OSError:
                pass
        for c in held:
            c.close()
        srv.close()

    threading.Thread(target=serve, daemon=True).start()
    return srv.getsockname()[1], stop


def test_cli_gs_check_is_bounded_by_timeout_credentials_search_included(tmp_path):
    """gcsfs looks for credentials (a metadata server) before its first request; that
    search counts against --timeout too. The metadata server here never answers."""
    require("gcsfs", "the GCS client")
    port, stop = _black_hole()
    env = _no_cloud_env(tmp_path)
    env.update(GCE_METADATA_HOST=f"127.0.0.1:{port}", GCE_METADATA_IP=f"127.0.0.1:{port}")
    try:
        t = time.monotonic()
        r = subprocess.run([sys.executable, "-m", "pyckpt", "ls", "gs://bucket/run",
                            "--timeout", "3"], capture_output=True, text=True, timeout=120,
                           env=env, cwd=tmp_path)
        took = time.monotonic() - t
    finally:
        stop.set()
    assert r.returncode != 0
    assert r.stderr.startswith("pyckpt: ") and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert "gs://bucket/run" in r.stderr and "--timeout" in r.stderr
    assert took < 3 + 8, f"took {took:.1f} s with --timeout 3"  # 1 s margin + interpreter start
