"""GPU tests (issue 12: device memory as first-class state).

Every test of this directory needs a CUDA device: where ``torch.cuda.is_available()``
is false (or torch is missing) they are skipped at collection, and pytest's terminal
summary says how many, e.g. ``tests/gpu: 42 tests skipped (no CUDA device)``, so a run
on a machine without a GPU never looks like a GPU pass.

Hooks of a conftest below the root see every collected item and every report of the
session, so both hooks only look at the tests of this directory.
"""

from __future__ import annotations

from pathlib import Path

import pytest

GPU_DIR = Path(__file__).resolve().parent


def _cuda_status() -> tuple[bool, str]:
    try:
        import torch  # optional dependency
    except Exception:  # noqa: BLE001 - a missing or broken torch means no CUDA here
        return False, "torch not installed"
    try:
        return (True, "") if torch.cuda.is_available() else (False, "no CUDA device")
    except Exception as e:  # noqa: BLE001 - a broken driver counts as no device
        return False, f"no CUDA device ({type(e).__name__})"


HAS_CUDA, WHY_NOT = _cuda_status()


def _in_gpu_dir(path: str | Path) -> bool:
    try:
        Path(path).resolve().relative_to(GPU_DIR)
        return True
    except ValueError:
        return False


def pytest_collection_modifyitems(config, items):
    if HAS_CUDA:
        return
    skip = pytest.mark.skip(reason=f"tests/gpu: {WHY_NOT}")
    for item in items:
        if _in_gpu_dir(item.path):
            item.add_marker(skip)


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    if HAS_CUDA:
        return
    root = Path(config.rootpath)
    skipped = [r for r in terminalreporter.stats.get("skipped", [])
               if _in_gpu_dir(root / r.nodeid.split("::", 1)[0])]
    if skipped:
        terminalreporter.write_line(f"tests/gpu: {len(skipped)} tests skipped ({WHY_NOT})")
