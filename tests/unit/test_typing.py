import os
import pathlib
import subprocess
import sys
import sysconfig

from pyckpt.testing.requirements import require

ROOT = pathlib.Path(__file__).resolve().parents[2]


def test_package_type_checks(tmp_path):
    """mypy (configured in pyproject.toml) finds no errors in the pyckpt package,
    checked as imported (the installed package in CI, the checkout in development)."""
    require("mypy", "type-checks the package")
    import pyckpt

    parent = pathlib.Path(pyckpt.__file__).resolve().parent.parent
    env = dict(os.environ)
    site = {pathlib.Path(p).resolve() for p in (sysconfig.get_paths()["purelib"],
                                                sysconfig.get_paths()["platlib"])}
    if parent not in site:  # a checkout: mypy must be told where the package is
        env["MYPYPATH"] = str(parent)
    r = subprocess.run(
        [sys.executable, "-m", "mypy", "--config-file", str(ROOT / "pyproject.toml"),
         "--cache-dir", str(tmp_path / "mypy_cache"), "-p", "pyckpt"],
        capture_output=True, text=True, cwd=str(tmp_path), env=env)
    assert r.returncode == 0, f"mypy found problems in {parent / 'pyckpt'}:\n{r.stdout}{r.stderr}"
    assert "no issues found" in r.stdout
