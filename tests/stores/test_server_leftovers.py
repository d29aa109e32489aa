"""Issue 22: a SIGKILL of ``python -m pyckpt.testing.servers s3`` left its data
directory and its unix sockets in /tmp; the next server start removes them (once
neither the killed process nor its ``weed`` runs), and never a live server's."""

import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time

import pytest

from pyckpt.testing import servers
from pyckpt.testing.requirements import require


@pytest.mark.slow
def test_a_killed_servers_leftovers_are_swept_at_the_next_start():
    require("s3fs", "a storage server or its client")
    proc = subprocess.Popen([sys.executable, "-m", "pyckpt.testing.servers", "s3"],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env=dict(os.environ), cwd=tempfile.gettempdir())
    data = None
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            line = proc.stdout.readline()
            if not line:
                break
            m = re.search(r"\(data in (\S+),", line)
            if m:
                data = m.group(1)
            if line.startswith("Ctrl-C stops"):
                break
        assert data is not None and os.path.isdir(data)
        with open(os.path.join(data, "owner.json")) as f:
            owner = json.load(f)
        assert owner["pid"] == proc.pid and isinstance(owner["weed"], int)
        # a live server is never swept
        assert data not in servers.sweep_dead_servers() and os.path.isdir(data)
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
    for _ in range(100):  # weed dies with its parent (PR_SET_PDEATHSIG)
        try:
            os.kill(owner["weed"], 0)
        except ProcessLookupError:
            break
        time.sleep(0.1)
    assert os.path.isdir(data)  # what the kill left
    removed = servers.sweep_dead_servers()
    assert data in removed and not os.path.exists(data)
    ghost = servers.SeaweedServer.__new__(servers.SeaweedServer)
    ghost.ports = owner["ports"]
    assert not [p for p in ghost.tmp_sockets() if os.path.exists(p)]
