"""Every exception class pyckpt defines lives in pyckpt/errors.py (issue 39, item 4:
one home per concept; docs/ARCHITECTURE.md, "core types").

The check reads the source (no import): a class is an exception class when one of
its bases is a builtin exception or, transitively, a class found to be one."""

import ast
import builtins
import pathlib

PACKAGE = pathlib.Path(__file__).resolve().parents[1] / "pyckpt"
HOME = PACKAGE / "errors.py"


def _classes():
    """(file, class name, base names) of every class defined in the package."""
    for path in sorted(PACKAGE.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.ClassDef):
                bases = [b.id if isinstance(b, ast.Name) else
                         b.attr if isinstance(b, ast.Attribute) else "" for b in node.bases]
                yield path, node.name, bases


def _exception_classes():
    known = {n for n in dir(builtins)
             if isinstance(getattr(builtins, n), type)
             and issubclass(getattr(builtins, n), BaseException)}
    classes = list(_classes())
    found: set[tuple[pathlib.Path, str]] = set()
    while True:  # a fixed point: at most one round per class
        new = {(p, name) for p, name, bases in classes
               if (p, name) not in found and any(b in known for b in bases)}
        if not new:
            return found
        found |= new
        known |= {name for _, name in new}


def test_every_exception_class_is_defined_in_errors_py():
    found = _exception_classes()
    assert {name for p, name in found if p == HOME} >= {
        "CheckpointError", "UnsupportedDCPError", "WorkerTimeoutError", "StoreDown"}
    elsewhere = sorted(f"{p.relative_to(PACKAGE.parent)}: class {name}"
                       for p, name in found if p != HOME)
    assert not elsewhere, "exception classes outside pyckpt/errors.py:\n" + "\n".join(elsewhere)


def test_the_old_import_paths_still_name_the_same_classes():
    import pyckpt.errors as errors
    from pyckpt.codecs.distcp import UnsupportedDCPError
    from pyckpt.codecs.tensorflow import UnsupportedTensorError
    from pyckpt.workers.comm import WorkerTimeoutError
    from pyckpt.workers.save import DistributedSaveError

    assert UnsupportedDCPError is errors.UnsupportedDCPError
    assert UnsupportedTensorError is errors.UnsupportedTensorError
    assert WorkerTimeoutError is errors.WorkerTimeoutError
    assert DistributedSaveError is errors.DistributedSaveError
    assert issubclass(errors.UnsupportedDCPError, (errors.CheckpointError, NotImplementedError))
