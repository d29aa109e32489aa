"""Every guide block of README.md runs on its own, as a reader would run it: each
Python block in a fresh interpreter, in a temporary working directory (issue 13).
Blocks that need an S3 server or several processes run in
tests/stores/test_readme_s3.py and tests/multiworker/test_readme_workers.py."""

import os
import pathlib
import re
import subprocess
import sys

import pytest

from pyckpt.testing.requirements import require

README = pathlib.Path(__file__).resolve().parents[1] / "README.md"


def readme_blocks(lang: str = "python") -> list[str]:
    return re.findall(rf"```{lang}\n(.*?)```", README.read_text(), flags=re.S)


def is_s3(code: str) -> bool:
    return "s3://" in code


def is_multiworker(code: str) -> bool:
    return "init_process_group" in code


def local_blocks() -> list[tuple[int, str]]:
    return [(i, code) for i, code in enumerate(readme_blocks())
            if not (is_s3(code) or is_multiworker(code))]


def title(code: str) -> str:
    """The block's first statement that is not an import (for the test id)."""
    lines = [ln for ln in code.splitlines()
             if ln.strip() and not ln.startswith(("import ", "from "))]
    return re.sub(r"\W+", "_", lines[0])[:40] if lines else "empty"


def sandbox(tmp_path: pathlib.Path) -> dict:
    """Environment of a block's process: temporary files (tempfile.mkdtemp) go under
    tmp_path, so nothing is left behind and parallel runs never collide."""
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    return dict(os.environ, TMPDIR=str(scratch), OMP_NUM_THREADS="1")


def test_blocks_are_found():
    blocks = readme_blocks()
    assert len(blocks) >= 8
    assert sum(map(is_s3, blocks)) == 1 and sum(map(is_multiworker, blocks)) == 1


@pytest.mark.parametrize("index,code", [pytest.param(i, c, id=f"block{i}-{title(c)}")
                                        for i, c in local_blocks()])
def test_readme_python_block_runs_alone(index, code, tmp_path):
    if "import torch" in code:
        require("torch")
    if "import lightning" in code:
        require("lightning")
    assert "/tmp/" not in code, "a guide block writes into a temporary directory of its own"
    script = tmp_path / f"readme_block_{index}.py"
    script.write_text(code)
    work = tmp_path / "cwd"
    work.mkdir()
    r = subprocess.run([sys.executable, str(script)], cwd=work, env=sandbox(tmp_path),
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, f"README.md Python block {index} failed alone:\n{r.stderr[-3000:]}"
    assert list(work.iterdir()) == [], "the block wrote into the working directory"
    if "key_map" in code:
        assert "model_000" in r.stdout
    if "CheckpointManager" in code:
        assert "ckpt-4" in r.stdout


def test_readme_command_line_block_runs(tmp_path):
    """The command-line block, line by line in one scratch directory (its `cd` is
    the test's cwd); lines on remote URLs are left out. `pyckpt diff` exits 1
    because the two checkpoints differ."""
    (block,) = [b for b in readme_blocks("bash") if "pyckpt verify" in b]
    lines = [ln for ln in block.splitlines() if ln.strip()]
    assert lines[0].startswith("cd ") and any("ckpt-200" in ln for ln in lines[:4])
    env = sandbox(tmp_path)
    work = tmp_path / "cwd"
    work.mkdir()
    bindir = os.path.dirname(sys.executable)  # this interpreter's python and pyckpt
    env["PATH"] = bindir + os.pathsep + env.get("PATH", "")
    ran = []
    for line in lines[1:]:
        if "://" in line:
            continue
        r = subprocess.run(["bash", "-c", line], cwd=work, env=env, capture_output=True,
                           text=True, timeout=300)
        expected = 1 if line.startswith("pyckpt diff") else 0
        assert r.returncode == expected, f"{line}\n{r.stdout[-2000:]}{r.stderr[-2000:]}"
        ran.append((line.split("#")[0].strip(), r.stdout))
    outputs = dict(ran)
    assert "2 changed" in outputs["pyckpt diff run/ckpt-120 run/ckpt-200"]
    assert "every checksum matches" in outputs["pyckpt verify run/ckpt-200"]
    assert (work / "converted" / "pyckpt.index").is_file()
