"""docs/ARCHITECTURE.md and the import contracts of pyproject.toml say the same thing
(issue 39, item 4), as tests/test_api_doc.py ties docs/API.md to the public names:

- the ```layers block of "The layers, top to bottom" is the layers contract's list;
- every layer there has a paragraph whose bold heading names it;
- the table of "Who may import what" is the list of `protected` contracts;
- every module of the package is in a layer (a new top-level module must be placed);
- the contracts hold (`lint-imports`, which CI runs too, is run here when installed).
"""

import pathlib
import re
import shutil
import subprocess
import sys

import pytest

from pyckpt.testing.requirements import require

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    tomllib = pytest.importorskip("tomli")

ROOT = pathlib.Path(__file__).resolve().parents[1]
DOC = (ROOT / "docs" / "ARCHITECTURE.md").read_text()
CONTRACTS = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]["contracts"]


def _layers_contract():
    (layers,) = [c for c in CONTRACTS if c["type"] == "layers"]
    return layers


def _doc_layers():
    m = re.search(r"^```layers\n(.*?)^```", DOC, re.S | re.M)
    assert m, "docs/ARCHITECTURE.md has no ```layers block"
    return [line.strip() for line in m.group(1).splitlines() if line.strip()]


def test_the_layer_list_is_the_contract():
    assert _doc_layers() == _layers_contract()["layers"]


def test_every_layer_has_its_paragraph():
    # bold headings: **`a | b`, `c`: what they are.**
    headed = set()
    for heading in re.findall(r"^\*\*(`[^*]*?`):", DOC, re.M):
        headed |= {h.strip() for h in re.findall(r"`([^`]+)`", heading)}
    missing = [layer for layer in _doc_layers() if layer not in headed]
    assert not missing, f"layers without a paragraph in ARCHITECTURE.md: {missing}"


def _doc_protected():
    section = DOC.split("## Who may import what", 1)[1].split("\n## ", 1)[0]
    rows = {}
    for line in section.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 3 and cells[1].startswith("`"):
            rows[cells[0]] = (set(re.findall(r"`([^`]+)`", cells[1])),
                              set(re.findall(r"`([^`]+)`", cells[2])))
    return rows


def test_the_protected_table_is_the_contracts():
    want = {c["name"]: (set(c["protected_modules"]), set(c["allowed_importers"]))
            for c in CONTRACTS if c["type"] == "protected"}
    assert want, "no protected contracts"
    assert _doc_protected() == want


def test_every_module_is_in_a_layer():
    placed = {name.strip() for layer in _layers_contract()["layers"] for name in layer.split("|")}
    pkg = ROOT / "pyckpt"
    here = {p.stem if p.is_file() else p.name for p in pkg.iterdir()
            if (p.is_file() and p.suffix == ".py" and p.stem != "__init__")
            or (p.is_dir() and (p / "__init__.py").exists())}
    assert sorted(here - placed) == [], "modules in no layer of pyproject.toml"
    assert sorted(placed - here) == [], "layers naming no module"


def test_the_contracts_hold():
    require("importlinter", "the import contracts (pip install 'import-linter>=2.16')")
    exe = shutil.which("lint-imports")
    assert exe is not None, "import-linter is installed but lint-imports is not on PATH"
    run = subprocess.run([exe], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-2000:]
