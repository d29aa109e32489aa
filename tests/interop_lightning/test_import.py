"""The errors of `import pyckpt.lightning` without Lightning or torch (each in a
fresh interpreter, the packages hidden through sys.modules, run outside the checkout
so that the installed pyckpt is the one imported)."""

from __future__ import annotations

import subprocess
import sys



def _run(tmp_path, code):
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                       cwd=tmp_path, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    return r.stdout


_TRY = ("try:\n    import pyckpt.lightning\n"
        "except ImportError as e:\n    print('ImportError:', e)\n"
        "else:\n    print('imported')\n")


def test_without_lightning_the_error_names_the_extra(tmp_path):
    hide = ("import sys\nfor name in ('lightning', 'pytorch_lightning', 'lightning_fabric'):\n"
            "    sys.modules[name] = None\n")
    out = _run(tmp_path, hide + _TRY)
    assert out.startswith("ImportError:") and 'pip install "pyckpt[lightning]"' in out, out


def test_without_torch_the_error_names_the_extra(tmp_path):
    out = _run(tmp_path, "import sys\nsys.modules['torch'] = None\n" + _TRY)
    assert out.startswith("ImportError:") and 'pip install "pyckpt[torch]"' in out, out

