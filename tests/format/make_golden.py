"""Writes the golden checkpoint in tests/format/golden/v1 (run once per format
version; the committed bytes must keep loading forever)."""

import pathlib
import shutil

import numpy as np

import pyckpt


def golden_tree() -> dict:
    return {
        "params": {"w": (np.arange(12, dtype=np.float32).reshape(3, 4) / 8),
                   "b": np.array([1, -2, 3], dtype=np.int16)},
        "opt": {"step": 42, "lr": 0.125, "betas": (0.9, 0.999), "flag": True},
        "text": np.array(["ab", "cde"]),
        "empty": np.zeros((2, 0), dtype=np.uint8),
        "c": np.array([1 + 2j, -1j], dtype=np.complex64),
        "name": "golden",
        "none": None,
    }


if __name__ == "__main__":
    out = pathlib.Path(__file__).parent / "golden" / "v1"
    shutil.rmtree(out, ignore_errors=True)
    pyckpt.save(golden_tree(), out, metadata={"purpose": "golden"})
    print("wrote", out)
