"""The compiled core, ``pyckpt._core`` (cpp/bindings/module.cc; stubs in _core.pyi).

Modules import it from here (``from .._native import core``): a compiled
module is invisible to the import-graph tools, and this one name keeps the
layer contracts (docs/ARCHITECTURE.md) able to see who uses it. It is the
bottom layer: it imports nothing else of pyckpt.

When the extension is missing, Python's own message misleads ("cannot import
name '_core' from partially initialized module 'pyckpt' (most likely due to a
circular import)"); ``_explain`` says what happened instead. The usual cause is
a clone's source tree shadowing the installed package: Python looks in the
current directory first, and the source tree has no built extension.
"""

from __future__ import annotations

import importlib.machinery
import os


def _explain(package_dir: str) -> str | None:
    """Why ``pyckpt._core`` cannot be imported from ``package_dir``, or None when an
    extension for this interpreter is there (its own import error says more then)."""
    try:
        names = sorted(os.listdir(package_dir))
    except OSError:
        return None
    built = [n for n in names if n.startswith("_core.") and n != "_core.pyi"]
    if any("_core" + suffix in names for suffix in importlib.machinery.EXTENSION_SUFFIXES):
        return None
    other = f" (only {', '.join(built)}, built for another Python)" if built else ""
    root = os.path.dirname(package_dir)
    if os.path.isfile(os.path.join(root, "pyproject.toml")):  # a clone or an unpacked sdist
        return (f"pyckpt is being imported from its source tree at {package_dir}, which has "
                f"no built extension (pyckpt._core){other}. The source tree shadows any "
                "installed pyckpt when Python runs in (or has on its path) the directory "
                f"{root}. Run from another directory to use the installed package, or build "
                f"in place with `pip install -e {root}` (an editable install, after which "
                "this tree imports).")
    return (f"pyckpt's compiled extension (pyckpt._core) is missing from {package_dir}"
            f"{other}: the installation is incomplete; reinstall it (`pip install "
            "--force-reinstall --no-deps .` in a clone of pyckpt).")


try:
    from . import _core as core
except ImportError as _error:
    _message = _explain(os.path.dirname(os.path.abspath(__file__)))
    if _message is None:
        raise
    raise ImportError(_message, name=f"{__package__}._core") from _error

__all__ = ["core"]
