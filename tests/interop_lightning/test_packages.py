"""pyckpt's plugin under the Trainer of either Lightning package, with both installed,
only ``lightning`` or only ``pytorch_lightning`` (issue 38 item 1; an environment of
one package is simulated in a fresh interpreter that hides the other one from every
import: lightning_env.py), and the README's Lightning block for users of either."""

from __future__ import annotations

import os
import pathlib
import re
import subprocess
import sys

import pytest

from .lightning_env import fit

pytest.importorskip("lightning")
pytest.importorskip("pytorch_lightning")

pytestmark = [pytest.mark.filterwarnings("ignore:::lightning"),  # advice for real runs
              pytest.mark.filterwarnings("ignore:::pytorch_lightning"),
              pytest.mark.filterwarnings("ignore:::lightning_fabric")]

ENV = pathlib.Path(__file__).with_name("lightning_env.py")
README = pathlib.Path(__file__).resolve().parents[2] / "README.md"


def _env(tmp_path, *args) -> str:
    """lightning_env.py in a new interpreter outside the checkout (the installed pyckpt)."""
    scratch = tmp_path / "tmp"
    scratch.mkdir(exist_ok=True)
    r = subprocess.run([sys.executable, str(ENV), *args], capture_output=True, text=True,
                       cwd=tmp_path, timeout=600,
                       env=dict(os.environ, TMPDIR=str(scratch), OMP_NUM_THREADS="1"))
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-5000:]
    return r.stdout.strip().splitlines()[-1]


@pytest.mark.parametrize("package", ["pytorch_lightning", "lightning.pytorch"])
def test_both_installed_either_trainer(tmp_path, package):
    """Both packages installed (as ``pip install "pyckpt[lightning]"`` leaves a
    pytorch_lightning user): each package's Trainer takes the plugin, alone and in its
    own AsyncCheckpointIO, resumes bit for bit, and load_from_checkpoint rebuilds."""
    assert fit(package, str(tmp_path)) == [f"{package}.Trainer + CheckpointIO",
                                           f"{package}.Trainer + AsyncCheckpointIO"]


def test_both_installed_one_class_for_both():
    from lightning.fabric.plugins import CheckpointIO as A
    from lightning_fabric.plugins import CheckpointIO as B

    import pyckpt.lightning

    assert A is not B
    assert issubclass(pyckpt.lightning.CheckpointIO, A)
    assert issubclass(pyckpt.lightning.CheckpointIO, B)


@pytest.mark.slow  # a new interpreter importing torch and Lightning, 4 short fits
@pytest.mark.parametrize("package,hide", [
    ("lightning.pytorch", "pytorch_lightning,lightning_fabric"),  # only lightning
    ("pytorch_lightning", "lightning"),                           # only pytorch_lightning
])
def test_only_one_package_installed(tmp_path, package, hide):
    out = _env(tmp_path, hide, "fit", package, str(tmp_path))
    base = "lightning.fabric" if package == "lightning.pytorch" else "lightning_fabric"
    assert out == (f"done: {package}.Trainer + CheckpointIO; {package}.Trainer + "
                   f"AsyncCheckpointIO | bases: {base}.plugins.io.checkpoint_io"), out


def _readme_lightning_block() -> str:
    (code,) = [b for b in re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.S)
               if "pyckpt.lightning" in b]
    return code


@pytest.mark.slow  # a new interpreter importing torch and Lightning, 2 short fits
@pytest.mark.parametrize("hide", ["lightning", "pytorch_lightning,lightning_fabric"])
def test_readme_block_runs_with_one_package(tmp_path, hide):
    """The README's Lightning block, as pasted, where only one package is installed
    (tests/test_readme.py runs it where both are)."""
    script = tmp_path / "readme_lightning.py"
    script.write_text(_readme_lightning_block())
    assert _env(tmp_path, hide, "run", str(script)).startswith("done: ran readme_lightning.py")


def test_attribute_dicts_of_both_packages_come_back_as_themselves(tmp_path):
    """A pytorch_lightning run's hyperparameters are lightning_fabric's AttributeDict, a
    lightning run's lightning.fabric's: each is stored, and comes back as itself."""
    from lightning.fabric.utilities.data import AttributeDict as A
    from lightning_fabric.utilities.data import AttributeDict as B

    from pyckpt.lightning import CheckpointIO

    io = CheckpointIO()
    io.save_checkpoint({"a": A(lr=0.1, sub=B(k=1)), "b": B(lr=0.2)}, tmp_path / "c.ckpt")
    back = io.load_checkpoint(tmp_path / "c.ckpt")
    assert type(back["a"]) is A and type(back["a"]["sub"]) is B and type(back["b"]) is B
    assert back["a"].sub.k == 1 and back["b"].lr == 0.2
