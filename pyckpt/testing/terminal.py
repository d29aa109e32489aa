"""Running a command with its stderr on a pseudo-terminal, as a person's shell would:
how tests see what a command draws on a terminal (progress bars)."""

from __future__ import annotations

import os
import subprocess
import tempfile
from typing import Sequence

__all__ = ["run_on_terminal"]


def run_on_terminal(cmd: Sequence[str], timeout: float = 60.0) -> tuple[int, bytes]:
    """(exit status, bytes written to the terminal) of ``cmd`` run with stderr on a
    100-column pseudo-terminal, stdout on a pipe, in the temporary directory. Reading
    stops when the terminal is quiet for ``timeout`` seconds or closes."""
    import fcntl
    import pty
    import select
    import struct
    import termios

    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 100, 0, 0))  # a real width
    proc = subprocess.Popen(list(cmd), stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                            stderr=slave, cwd=tempfile.gettempdir())
    os.close(slave)
    seen = b""
    try:
        while True:
            ready, _, _ = select.select([master], [], [], timeout)
            if not ready:
                break
            try:
                chunk = os.read(master, 4096)
            except OSError:
                break
            if not chunk:
                break
            seen += chunk
        proc.communicate(timeout=60)
    finally:
        os.close(master)
    return proc.returncode, seen
