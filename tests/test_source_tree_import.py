"""Importing pyckpt from a source tree without the built extension (issue 13):
the error says what happened and what to do, not "circular import"."""

import os
import pathlib
import shutil
import site
import subprocess
import sys

import pytest

PACKAGE = pathlib.Path(__file__).resolve().parents[1] / "pyckpt"


def copy_sources(dst: pathlib.Path) -> pathlib.Path:
    """The pyckpt/ package copied under ``dst`` without any built extension."""
    ignore = shutil.ignore_patterns("__pycache__", "*.so", "*.pyd")
    shutil.copytree(PACKAGE, dst / "pyckpt", ignore=ignore)
    return dst / "pyckpt"


def import_from(cwd: pathlib.Path) -> subprocess.CompletedProcess:
    """``python -c "import pyckpt"`` in ``cwd``, as a user would run it there.

    ``-S`` keeps an editable install's import hook (a .pth file) out, since it would
    take ``pyckpt`` from the original tree whatever the directory; the
    site-packages directories stay reachable for numpy through PYTHONPATH (which
    .pth files are not read from)."""
    paths = [*site.getsitepackages(), site.getusersitepackages()]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in paths if os.path.isdir(p)))
    return subprocess.run([sys.executable, "-S", "-c", "import pyckpt"], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=120)


@pytest.fixture
def clone(tmp_path: pathlib.Path) -> pathlib.Path:
    """A clone's root: pyproject.toml beside a pyckpt/ source tree with no extension."""
    root = tmp_path / "clone"
    root.mkdir()
    copy_sources(root)
    shutil.copy(PACKAGE.parent / "pyproject.toml", root / "pyproject.toml")
    return root


def test_source_tree_says_what_to_do(clone: pathlib.Path) -> None:
    r = import_from(clone)
    assert r.returncode != 0
    last = r.stderr.strip().splitlines()[-1]
    assert last.startswith("ImportError: pyckpt is being imported from its source tree at "
                           f"{clone / 'pyckpt'}, which has no built extension"), r.stderr
    assert "Run from another directory" in last and f"pip install -e {clone}" in last
    assert "circular import" not in last


def test_extension_of_another_python_is_named(clone: pathlib.Path) -> None:
    (clone / "pyckpt" / "_core.cpython-20-x86_64-linux-gnu.so").write_bytes(b"")
    last = import_from(clone).stderr.strip().splitlines()[-1]
    assert "which has no built extension" in last
    assert "_core.cpython-20-x86_64-linux-gnu.so, built for another Python" in last


def test_incomplete_install_says_reinstall(tmp_path: pathlib.Path) -> None:
    copy_sources(tmp_path)  # a package directory, but no project around it
    r = import_from(tmp_path)
    last = r.stderr.strip().splitlines()[-1]
    assert last.startswith("ImportError: pyckpt's compiled extension (pyckpt._core) is missing "
                           f"from {tmp_path / 'pyckpt'}"), r.stderr
    assert "reinstall" in last and "circular import" not in last
