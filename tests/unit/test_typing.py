import pathlib
import subprocess
import sys

from pyckpt.testing.requirements import require

ROOT = pathlib.Path(__file__).resolve().parents[2]


def test_package_type_checks(tmp_path):
    """mypy (configured in pyproject.toml) finds no errors in the pyckpt package."""
    require("mypy", "type-checks the package")
    import pyckpt

    package_dir = pathlib.Path(pyckpt.__file__).resolve().parent
    r = subprocess.run(
        [sys.executable, "-m", "mypy", "--config-file", str(ROOT / "pyproject.toml"),
         "--cache-dir", str(tmp_path / "mypy_cache"), str(package_dir)],
        capture_output=True, text=True, cwd=str(tmp_path))
    assert r.returncode == 0, f"mypy found problems in {package_dir}:\n{r.stdout}{r.stderr}"
