"""Processes of this host: whether one still runs. Attempt markers (``engine/attempts.py``),
the manager's writer lease (``manager/lock.py``) and the test servers' pid files
(``testing/servers.py``) each judge a recorded pid with it."""

from __future__ import annotations

import os

__all__ = ["pid_alive"]


def pid_alive(pid: int) -> bool:
    """Whether a process with this pid runs on this host (a zombie counts)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
