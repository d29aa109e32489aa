"""Run-directory knowledge has one home the engine does not own (issue 39 item 3):
``pyckpt/run_directory.py`` holds the step names, "latest", the manager's state
file and TensorFlow's; no module of the engine names either state file. And the
small helpers that the manager and the test servers share with the engine live
below it (``pid_alive`` in ``pyckpt/_process.py``), so that neither has to
import the engine's save modules for them."""

import ast
import os
import pathlib
import subprocess
import sys

import numpy as np

import pyckpt
from pyckpt import run_directory
from pyckpt._process import pid_alive
from pyckpt.format import INDEX_NAME
from pyckpt.storage import resolve

PKG = pathlib.Path(pyckpt.__file__).resolve().parent


def _code_strings(tree: ast.AST) -> set[str]:
    """The string constants of a module that are not docstrings."""
    docs = {id(n.body[0].value) for n in ast.walk(tree)
            if isinstance(n, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
            and n.body and isinstance(n.body[0], ast.Expr)
            and isinstance(n.body[0].value, ast.Constant)}
    return {n.value for n in ast.walk(tree)
            if isinstance(n, ast.Constant) and isinstance(n.value, str) and id(n) not in docs}


def _imports(tree: ast.AST) -> set[str]:
    """What a module imports, as written (``from ..format import tf_state``:
    ``format.tf_state``; ``from ..format.tf_state import X``: ``format.tf_state``)."""
    out = set()
    for n in ast.walk(tree):
        if isinstance(n, ast.ImportFrom):
            out |= {f"{n.module}.{a.name}" if n.module else a.name for a in n.names}
            if n.module:
                out.add(n.module)
        elif isinstance(n, ast.Import):
            out |= {a.name for a in n.names}
    return out


def test_the_engine_names_no_state_file_of_a_run_directory():
    offenders = []
    for path in sorted((PKG / "engine").rglob("*.py")):
        tree = ast.parse(path.read_text(), str(path))
        # TensorFlow's state file is "checkpoint", a word any module may use: the
        # engine must not reach its parser (format/tf_state.py) instead
        named = _code_strings(tree) & {run_directory.STATE_NAME}
        tf = [m for m in _imports(tree) if m.endswith("tf_state")]
        if named or tf:
            offenders.append(f"{path.relative_to(PKG)}: {sorted(named) + tf}")
    assert not offenders, "the engine knows a run directory's state files: " + "; ".join(offenders)
    assert not (PKG / "engine" / "run.py").exists()


def test_the_manager_state_file_is_named_in_one_module():
    naming = sorted(str(p.relative_to(PKG)) for p in PKG.rglob("*.py")
                    if run_directory.STATE_NAME in _code_strings(ast.parse(p.read_text())))
    assert naming == ["run_directory.py"]


def test_committed_manifest(tmp_path):
    store, root = resolve(str(tmp_path))
    path = str(tmp_path / "ckpt-1")
    assert run_directory.committed_manifest(store, path) is None       # nothing there
    pyckpt.save({"w": np.arange(3, dtype=np.float32)}, path)
    assert run_directory.committed_manifest(store, path).keys == ["w"]
    (tmp_path / "ckpt-1" / INDEX_NAME).write_bytes(b"garbage")
    assert run_directory.committed_manifest(store, path) is None       # not readable


def test_pid_alive():
    assert pid_alive(os.getpid())
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()  # reaped: its pid names no process now (nor, this soon, a new one)
    assert not pid_alive(child.pid)
