"""docs/API.md, the API reference (issue 13): it names every public name, the
docstrings' references into it lead somewhere, and its examples run."""

import os
import pathlib
import re
import subprocess
import sys
import tempfile

import pyckpt

ROOT = pathlib.Path(__file__).resolve().parents[1]
API = ROOT / "docs" / "API.md"


def documented_names(text: str) -> set[str]:
    """Names in backticks (`load`, `pyckpt.load`, `load(path, into=None)`,
    `pyckpt.dist.TorchComm(...)`: the last dotted part before any call) and the
    words of headings."""
    names = set()
    for span in re.findall(r"`([^`\n]+)`", text):
        head = span.split("(", 1)[0].strip()
        names.add(head)
        names.add(head.rsplit(".", 1)[-1])
    for heading in re.findall(r"^#+ (.*)$", text, flags=re.M):
        names.update(re.findall(r"[A-Za-z_][\w.]*", heading))
    return names


def test_every_public_name_is_documented():
    names = documented_names(API.read_text())
    missing = [n for n in pyckpt.__all__ if n not in names]
    assert not missing, f"docs/API.md does not document: {missing}"


def test_other_public_names_are_documented():
    names = documented_names(API.read_text())
    for name in ("TorchComm", "MPIComm", "register_adapter", "PendingSave", "wait", "done",
                 "restore_or_initialize", "wait_until_finished", "checkpoints",
                 "latest_checkpoint", "assert_consumed", "assert_existing_objects_matched",
                 "assert_nontrivial_match", "expect_partial", "get_variable_to_shape_map",
                 "get_variable_to_dtype_map", "get_tensor", "has_tensor", "verify"):
        assert name in names, name
    for command in ("ls", "inspect", "verify", "diff", "cp", "demo"):
        assert f"`pyckpt {command}" in API.read_text(), command


def test_docstring_references_lead_to_a_section():
    """"docs/API.md section N" and 'docs/API.md, "Title"' in the package's sources
    name a heading of docs/API.md; no reference to a bare "API.md" is left."""
    text = API.read_text()
    numbers = set(re.findall(r"^## (\d+)\. ", text, flags=re.M))
    headings = re.findall(r"^#+ (.*)$", text, flags=re.M)
    for source in (ROOT / "pyckpt").rglob("*.py"):
        code = source.read_text()
        where = source.relative_to(ROOT)
        assert not re.search(r"(?<![/\w])API\.md", code), f"{where}: bare API.md"
        for n in re.findall(r"docs/API\.md,? section (\d+)", code):
            assert n in numbers, f"{where}: docs/API.md has no section {n}"
        for title in re.findall(r'docs/API\.md, "([^"]+)"', code):
            assert any(title.lower() in h.lower() for h in headings), \
                f'{where}: docs/API.md has no section "{title}"'


def test_examples_run(tmp_path):
    """The Python examples, in order, in one fresh interpreter (sections build on
    each other); /tmp/api-demo becomes a temporary directory, remote ones are
    left out."""
    blocks = re.findall(r"```python\n(.*?)```", API.read_text(), flags=re.S)
    local = [b for b in blocks if "://" not in b]
    assert len(local) >= 10
    script = "import numpy as np\nimport pyckpt\n\n" + "\n".join(local)
    script = script.replace("/tmp/api-demo", str(tmp_path / "api-demo"))
    path = tmp_path / "examples.py"
    path.write_text(script)
    r = subprocess.run([sys.executable, str(path)], cwd=tmp_path, capture_output=True,
                       text=True, timeout=300, env=dict(os.environ, TMPDIR=str(tmp_path)))
    assert r.returncode == 0, r.stderr[-3000:]


def test_help_of_the_manager_explains_every_argument():
    """Issue 22: help(CheckpointManager) explained none of its arguments."""
    import inspect

    doc = pyckpt.CheckpointManager.__doc__ or ""
    params = [p for p in inspect.signature(pyckpt.CheckpointManager.__init__).parameters
              if p != "self"]
    assert len(params) >= 12
    params += list(pyckpt.manager.options.KEYWORDS)  # the deprecated keywords (issue 39)
    missing = [p for p in params if f"``{p}``" not in doc]
    assert not missing, f"CheckpointManager's docstring does not explain: {missing}"


def test_docs_name_no_fixed_s3_port():
    """The local S3 recipe picks a random port: no example may hard-code one."""
    for path in (ROOT / "README.md", API):
        text = path.read_text()
        assert not re.search(r"endpoint_url=http://127\.0\.0\.1:\d+\s*$|"
                             r"\"endpoint_url\": \"http://127\.0\.0\.1:\d+\"", text, flags=re.M), path


def test_api_doc_command_line_table_matches_the_parser():
    """Section 8 names `cp`'s --force, --format and --max-shard-size, and `ls`'s real exit
    status."""
    text = API.read_text()
    section = text[text.index("## 8. Command line"):text.index("## 9.")]
    assert "--force" in section and "--format {auto,pyckpt,tf,safetensors,hf}" in section
    assert "--max-shard-size SIZE" in section
    row = next(line for line in section.splitlines() if line.startswith("| `pyckpt ls PATH`"))
    assert "1 when it holds none" in row
    r = subprocess.run([sys.executable, "-m", "pyckpt", "cp", "--help"], capture_output=True,
                       text=True, timeout=60, cwd=tempfile.gettempdir())
    assert "--force" in r.stdout and "{auto,pyckpt,tf,safetensors,hf}" in r.stdout
    assert "--max-shard-size SIZE" in r.stdout
