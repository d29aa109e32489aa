"""One background executor for saves and persists, with one shutdown path (issue 39
item 3; docs/ARCHITECTURE.md, ``jobs``): the save pipeline (``saving``) and the manager
start no thread of their own, and ``jobs.py`` is the only module of pyckpt that
registers an exit hook."""

import ast
import pathlib
import threading

import numpy as np

import pyckpt
from pyckpt import jobs

PACKAGE = pathlib.Path(pyckpt.__file__).parent


def _calls(path: pathlib.Path, names: tuple[str, ...]) -> list[str]:
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Call):
            f = node.func
            name = f.attr if isinstance(f, ast.Attribute) else getattr(f, "id", "")
            if name in names:
                found.append(f"{path.relative_to(PACKAGE)}:{node.lineno}")
    return found


def _exit_hooks(path: pathlib.Path) -> list[str]:
    """``atexit.register`` calls and decorators of a module."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Attribute) and node.attr == "register" and \
                isinstance(node.value, ast.Name) and node.value.id == "atexit":
            found.append(f"{path.relative_to(PACKAGE)}:{node.lineno}")
    return found


def test_saves_and_persists_start_no_thread_of_their_own():
    paths = [PACKAGE / "saving.py", *sorted((PACKAGE / "manager").glob("*.py"))]
    started = [c for p in paths for c in _calls(p, ("Thread", "ThreadPoolExecutor",
                                                    "to_thread"))]
    assert started == [], "background saves and persists run as jobs (pyckpt/jobs.py)"


def test_jobs_is_the_one_exit_hook():
    hooks = [h for path in sorted(PACKAGE.rglob("*.py")) for h in _exit_hooks(path)]
    assert [h.split(":")[0] for h in hooks] == ["jobs.py"], hooks


def test_a_background_save_is_a_job_that_drain_waits_for(tmp_path, monkeypatch):
    gate, entered = threading.Event(), threading.Event()
    from pyckpt.engine import writer

    real = writer.StagedSave.finish

    def held(self, *args, **kwargs):
        entered.set()
        assert gate.wait(60)
        return real(self, *args, **kwargs)

    monkeypatch.setattr(writer.StagedSave, "finish", held)
    handle = pyckpt.save({"a": np.arange(1000.0)}, tmp_path / "c", blocking=False)
    assert entered.wait(60)
    assert any(j.name == "pyckpt-save" for j in jobs.pending())
    gate.set()
    jobs.drain(60)
    assert handle.done() and handle.wait() == str(tmp_path / "c")
    np.testing.assert_array_equal(pyckpt.load(tmp_path / "c")["a"], np.arange(1000.0))
