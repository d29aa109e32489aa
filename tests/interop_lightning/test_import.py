"""Which Lightning pyckpt.lightning builds on, and the errors without one (each in a
fresh interpreter, the packages hidden through sys.modules, run outside the checkout
so that the installed pyckpt is the one imported)."""

from __future__ import annotations

import subprocess
import sys

import pytest


def _run(tmp_path, code):
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                       cwd=tmp_path, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    return r.stdout


_TRY = ("try:\n    import pyckpt.lightning\n"
        "except ImportError as e:\n    print('ImportError:', e)\n"
        "else:\n    print('imported')\n")


def test_without_lightning_the_error_names_the_extra(tmp_path):
    hide = "import sys\nsys.modules['lightning'] = sys.modules['pytorch_lightning'] = None\n"
    out = _run(tmp_path, hide + _TRY)
    assert out.startswith("ImportError:") and 'pip install "pyckpt[lightning]"' in out, out


def test_without_torch_the_error_names_the_extra(tmp_path):
    out = _run(tmp_path, "import sys\nsys.modules['torch'] = None\n" + _TRY)
    assert out.startswith("ImportError:") and 'pip install "pyckpt[torch]"' in out, out


@pytest.mark.slow  # imports pytorch_lightning in a new interpreter (~15 s here)
def test_pytorch_lightning_when_lightning_is_missing(tmp_path):
    pytest.importorskip("pytorch_lightning")
    out = _run(tmp_path, "import sys\nsys.modules['lightning'] = None\n"
               "import pyckpt.lightning, pytorch_lightning as pl\n"
               "from lightning_fabric.plugins import CheckpointIO\n"
               "assert issubclass(pyckpt.lightning.CheckpointIO, CheckpointIO)\n"
               "t = pl.Trainer(plugins=[pyckpt.lightning.CheckpointIO()], logger=False)\n"
               "print(type(t.strategy.checkpoint_io).__module__)\n")
    assert out.strip().endswith("pyckpt.lightning"), out
