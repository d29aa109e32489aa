"""Figures of issue 11: function-local imports of pyckpt's own modules, modules
reading manifest columns, public definitions with docstrings; and of issue 39 (the
pipeline behind every door): where manifests are built and commits run, and the
background threads and pools pyckpt starts outside ``testing/``.
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
                    if not isinstance(sub, (ast.Import, ast.ImportFrom)):
                        continue
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


def _called(node: ast.Call) -> str:
    """The dotted name a call calls (``commit.finish``, ``threading.Thread``), or ""."""
    parts, f = [], node.func
    while isinstance(f, ast.Attribute):
        parts.append(f.attr)
        f = f.value
    if isinstance(f, ast.Name):
        parts.append(f.id)
    return ".".join(reversed(parts))


def call_sites(root: pathlib.Path, names: set[str], skip: str | None = None) -> list[str]:
    """``module:line name`` of every call whose callee is one of ``names`` or ends with
    ``.`` and one of them (``writer.Commit(...)`` counts as ``Commit``), outside
    ``root/skip``."""
    out = []
    for p in sorted(root.rglob("*.py")):
        if skip and p.is_relative_to(root / skip):
            continue
        for node in ast.walk(ast.parse(p.read_text())):
            if isinstance(node, ast.Call):
                name = _called(node)
                if name and any(name == n or name.endswith("." + n) for n in names):
                    out.append((str(p), node.lineno, name))
    return [f"{f}:{line} {name}" for f, line, name in sorted(out)]


def issue39(root: pathlib.Path) -> None:
    """The counts of issue 39's stages (docs/ARCHITECTURE.md, "The pipeline behind
    every door"): stage 1a leaves ``build_manifest`` and the commit routine to
    engine/commit.py; stage 2 leaves the raw save steps to engine/commit.py (every route
    begins an ``Attempt``) and one background executor."""
    for title, names, skip in (
            ("calls of build_manifest", {"build_manifest"}, None),
            ("calls of the commit routine (Commit, commit_checkpoint, commit.finish)",
             {"Commit", "commit_checkpoint", "commit.finish", "commits.finish"}, None),
            ("raw save steps (attempts.begin/end, new_attempt_id; stage 2: engine/commit.py only)",
             {"attempts.begin", "attempts.end", "new_attempt_id"}, None),
            ("attempts begun (Attempt.begin: one per save route)", {"Attempt.begin"}, None),
            ("background threads and pools (outside testing/)",
             {"Thread", "ThreadPoolExecutor", "to_thread"}, "testing")):
        sites = call_sites(root, names, skip)
        print(f"{title}: {len(sites)}")
        for site in sites:
            print(f"  {site}")


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
    issue39(root)
