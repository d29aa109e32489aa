"""Optional test dependencies: skipped locally when missing, a failure in CI.

CI sets PYCKPT_REQUIRE_ALL=1, so a test that needs torch, a storage server or
an MPI launcher can never be silently skipped there.
"""

from __future__ import annotations

import importlib
import os
from typing import Any

REQUIRE_ALL = os.environ.get("PYCKPT_REQUIRE_ALL") == "1"


def require(module: str, why: str = "") -> Any:
    """The imported module, or a skip (locally) / failure (CI) naming what is missing."""
    import pytest

    try:
        return importlib.import_module(module)
    except ImportError as e:
        msg = f"needs {module}{': ' + why if why else ''} ({e})"
        if REQUIRE_ALL:
            pytest.fail(f"PYCKPT_REQUIRE_ALL=1 but {msg}")
        pytest.skip(msg)
