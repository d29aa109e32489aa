"""Every Python snippet of README.md runs (in order, in one namespace)."""

import pathlib
import re
import shutil

README = pathlib.Path(__file__).resolve().parents[1] / "README.md"


def test_readme_python_blocks_run(capsys):
    blocks = re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.S)
    assert len(blocks) >= 5
    shutil.rmtree("/tmp/pyckpt-guide", ignore_errors=True)
    shutil.rmtree("/tmp/run", ignore_errors=True)
    namespace: dict = {}
    try:
        for i, code in enumerate(blocks):
            exec(compile(code, f"README.md block {i}", "exec"), namespace)
    finally:
        shutil.rmtree("/tmp/pyckpt-guide", ignore_errors=True)
        shutil.rmtree("/tmp/run", ignore_errors=True)
    out = capsys.readouterr().out
    assert "model_000" in out and "ckpt-4" in out
