"""Figures of issue 11: function-local imports of pyckpt's own modules, modules
reading manifest columns, public definitions with docstrings.
Run from the repository root: python tools/count_layering.py [--list]"""

from __future__ import annotations

import ast
import pathlib
import re
import sys


def local_imports(root: pathlib.Path) -> list[tuple[str, int, str]]:
    out = set()
    for p in sorted(root.rglob("*.py")):
        tree = ast.parse(p.read_text())
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                for sub in ast.walk(node):
                    own = (isinstance(sub, ast.ImportFrom) and (sub.level > 0 or (sub.module or "").startswith("pyckpt"))) or \
                          (isinstance(sub, ast.Import) and any(a.name.startswith("pyckpt") for a in sub.names))
                    if own:
                        out.add((str(p), sub.lineno, ast.unparse(sub)))
    return sorted(out)


def column_readers(root: pathlib.Path) -> list[str]:
    pat = re.compile(r"\.(tensor_begin|crc_begin)\b")
    return sorted(str(p) for p in root.rglob("*.py") if pat.search(p.read_text()))


def docstrings(root: pathlib.Path) -> tuple[int, int]:
    total = with_doc = 0
    for p in root.rglob("*.py"):
        tree = ast.parse(p.read_text())

        def visit(body: list) -> None:
            nonlocal total, with_doc
            for n in body:
                if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) \
                        and not n.name.startswith("_"):
                    total += 1
                    with_doc += ast.get_docstring(n) is not None
                    if isinstance(n, ast.ClassDef):
                        visit(n.body)

        visit(tree.body)
    return total, with_doc


if __name__ == "__main__":
    root = pathlib.Path("pyckpt")
    li = local_imports(root)
    cols = column_readers(root)
    total, documented = docstrings(root)
    print(f"function-local imports of own modules: {len(li)}")
    print(f"modules reading manifest columns: {len(cols)} {cols}")
    print(f"public definitions with a docstring: {documented} of {total}")
    if "--list" in sys.argv:
        for f, line, text in li:
            print(f"  {f}:{line}: {text}")
