"""The compiled core, ``pyckpt._core`` (cpp/bindings/module.cc; stubs in _core.pyi).

Modules import it from here (``from .._native import core``): a compiled
module is invisible to the import-graph tools, and this one name keeps the
layer contracts (docs/ARCHITECTURE.md) able to see who uses it. It is the
bottom layer: it imports nothing else of pyckpt.
"""

from . import _core as core

__all__ = ["core"]
