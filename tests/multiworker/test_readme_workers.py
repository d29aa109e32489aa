"""The README's multi-worker snippet, run with torchrun on 2 processes."""

import os
import pathlib
import re
import shutil
import subprocess

import numpy as np

import pyckpt
from pyckpt.testing.requirements import require

README = pathlib.Path(__file__).resolve().parents[2] / "README.md"


def test_readme_multiworker_snippet(tmp_path):
    require("torch")
    (code,) = [b for b in re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.S)
               if "init_process_group" in b]
    script = tmp_path / "train.py"
    script.write_text(code)
    exe = shutil.which("torchrun")
    assert exe, "torchrun missing"
    r = subprocess.run([exe, "--standalone", "--nproc-per-node", "2", str(script)],
                       capture_output=True, text=True, timeout=180, cwd=tmp_path,
                       env=dict(os.environ, OMP_NUM_THREADS="1"))
    assert r.returncode == 0, r.stdout + r.stderr[-3000:]
    assert not os.path.exists("/tmp/pyckpt-guide")  # nothing in a shared fixed place
    w = pyckpt.load(tmp_path / "checkpoints" / "multi")["w"]
    np.testing.assert_array_equal(w, np.repeat(np.arange(2, dtype=np.float32), 4)[:, None] * np.ones(4))
