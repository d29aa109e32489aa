"""A tiered manager's persists run as background jobs (pyckpt/jobs.py, issue 39 item 3):
the one executor's ``drain`` waits for them, the manager starts no thread of its
own, and a persist in flight when the program ends still reaches the durable tier."""

import ast
import pathlib
import subprocess
import sys
import textwrap
import threading
import uuid

import numpy as np

import pyckpt
from pyckpt import jobs
from pyckpt import saving  # a tier persists through saving.copy: its copy_checkpoint
from pyckpt.manager import tiers as tiers_module

WAIT = 60
MANAGER = pathlib.Path(tiers_module.__file__).parent


def _ck():
    return pyckpt.Checkpoint(a=pyckpt.Variable(np.arange(5000.0)))


def test_the_manager_starts_no_thread_of_its_own():
    started = []
    for path in sorted(MANAGER.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call):
                f = node.func
                name = f.attr if isinstance(f, ast.Attribute) else getattr(f, "id", "")
                if name in ("Thread", "ThreadPoolExecutor", "to_thread"):
                    started.append(f"{path.name}:{node.lineno}")
    assert started == [], "background work of the manager runs as jobs (pyckpt/jobs.py)"


def test_a_persist_in_flight_is_a_job_that_drain_waits_for(tmp_path, monkeypatch):
    gate, entered = threading.Event(), threading.Event()
    real = saving.copy_checkpoint

    def held_copy(*args, **kwargs):
        entered.set()
        assert gate.wait(WAIT)
        return real(*args, **kwargs)

    monkeypatch.setattr(saving, "copy_checkpoint", held_copy)
    url = f"memory://pyckpt-persist-jobs/{uuid.uuid4().hex[:12]}"
    m = pyckpt.CheckpointManager(_ck(), url, local_dir=tmp_path / "local", persist_every=1)
    try:
        m.save()
        assert entered.wait(WAIT)
        persists = [j for j in jobs.pending() if j.name == "pyckpt-persist"]
        assert len(persists) == 1 and m._tiers.busy()
        assert jobs.drain(0.01) is False  # the copy is held
        gate.set()
        assert jobs.drain(WAIT) is True
        assert persists[0].done() and persists[0].error is None
        assert not m._tiers.busy()
        assert m._tiers.durable.latest_name == "ckpt-1"
    finally:
        gate.set()
        m.close()


CHILD = textwrap.dedent("""
    import sys, threading
    import numpy as np
    import pyckpt
    from pyckpt import saving
    real = saving.copy_checkpoint

    def copy_after_exit(*args, **kwargs):  # the persist runs on after the main thread ended
        threading.main_thread().join()
        return real(*args, **kwargs)

    saving.copy_checkpoint = copy_after_exit
    m = pyckpt.CheckpointManager(pyckpt.Checkpoint(a=pyckpt.Variable(np.arange(5000.0))),
                                 sys.argv[1], local_dir=sys.argv[2], persist_every=1)
    print(m.save(blocking=False), flush=True)
""")


def test_a_persist_in_flight_at_exit_reaches_the_durable_tier(tmp_path):
    durable, local = tmp_path / "durable", tmp_path / "local"
    run = subprocess.run([sys.executable, "-c", CHILD, str(durable), str(local)],
                         capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip() == str(local / "ckpt-1")
    saved = pyckpt.latest_checkpoint(str(durable))  # recorded in the durable state file
    assert saved is not None and saved.endswith("ckpt-1")
    pyckpt.load_checkpoint(saved).verify()
    assert not (durable / "pyckpt-manager.lock").exists()  # the lease given up at exit
