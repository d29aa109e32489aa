"""Every Python snippet of README.md runs. Blocks that need an S3 server or
several processes run in tests/stores/test_readme_s3.py and
tests/multiworker/test_readme_workers.py."""

import pathlib
import re
import shutil

README = pathlib.Path(__file__).resolve().parents[1] / "README.md"


def readme_blocks() -> list[str]:
    return re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.S)


def is_s3(code: str) -> bool:
    return "s3://" in code


def is_multiworker(code: str) -> bool:
    return "init_process_group" in code


def test_readme_python_blocks_run(capsys):
    blocks = readme_blocks()
    assert len(blocks) >= 8
    assert sum(map(is_s3, blocks)) == 1 and sum(map(is_multiworker, blocks)) == 1
    shutil.rmtree("/tmp/pyckpt-guide", ignore_errors=True)
    shutil.rmtree("/tmp/run", ignore_errors=True)
    namespace: dict = {}
    try:
        for i, code in enumerate(blocks):
            if is_s3(code) or is_multiworker(code):
                continue
            exec(compile(code, f"README.md block {i}", "exec"), namespace)
    finally:
        shutil.rmtree("/tmp/pyckpt-guide", ignore_errors=True)
        shutil.rmtree("/tmp/run", ignore_errors=True)
    out = capsys.readouterr().out
    assert "model_000" in out and "ckpt-4" in out
