import pathlib
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[2]


def test_core_stub_is_up_to_date():
    """pyckpt/_core.pyi matches the built extension (regenerate with tools/gen_core_stub.py)."""
    import pyckpt

    env_path = str(pathlib.Path(pyckpt.__file__).parents[1])
    r = subprocess.run([sys.executable, str(ROOT / "tools" / "gen_core_stub.py"), "--check"],
                       capture_output=True, text=True, env={"PYTHONPATH": env_path},
                       cwd=str(ROOT))
    assert r.returncode == 0, r.stderr
