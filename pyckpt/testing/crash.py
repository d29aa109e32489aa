"""Killing a saving child process at a random moment, for crash-safety tests.

The child prints ``start <step>`` once it restored and ``saved <step>`` after each
save it knows to be committed; ``run_and_kill`` starts it, waits for ``start``,
sends SIGKILL after a random delay and returns what the child reported."""

from __future__ import annotations

import random
import signal
import subprocess
import sys
import threading
import time
from typing import Sequence


def run_and_kill(args: Sequence[str], rng: random.Random, max_delay: float = 0.8,
                 start_timeout: float = 60.0) -> tuple[int, list[int]]:
    """Runs ``python *args``, kills it (SIGKILL) 0..max_delay s after it started
    training; returns (its start step, the steps it reported saved)."""
    proc = subprocess.Popen([sys.executable, *map(str, args)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.extend(proc.stdout or ()), daemon=True)
    reader.start()
    deadline = time.monotonic() + start_timeout
    while not any(line.startswith("start") for line in lines):
        if proc.poll() is not None:
            raise AssertionError(f"child exited before starting: {proc.stderr.read() if proc.stderr else ''}")
        if time.monotonic() > deadline:
            proc.kill()
            raise AssertionError("child did not start")
        time.sleep(0.01)
    time.sleep(rng.uniform(0.0, max_delay))  # somewhere inside the save loop
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=30)
    reader.join(timeout=30)
    start = int(next(line for line in lines if line.startswith("start")).split()[1])
    saved = [int(line.split()[1]) for line in lines if line.startswith("saved")]
    return start, saved
