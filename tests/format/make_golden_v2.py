"""Writes the golden run directory tests/format/golden/v2: ckpt-1, a full save with
fingerprints (format version 1), and ckpt-2, an incremental save that references
ckpt-1's data file (format version 2). Run once; the committed bytes must keep
loading forever."""

import pathlib
import shutil

import numpy as np

import pyckpt


def golden_values(step: int) -> dict:
    return {"frozen": np.arange(2048, dtype=np.float32).reshape(32, 64) / 4,
            "head": np.full((4, 3), step, dtype=np.float64),
            "ids": np.array([7, -1, 3], dtype=np.int64)}


def model() -> pyckpt.Checkpoint:
    return pyckpt.Checkpoint(**{k: pyckpt.Variable(v) for k, v in golden_values(0).items()})


if __name__ == "__main__":
    out = pathlib.Path(__file__).parent / "golden" / "v2"
    shutil.rmtree(out, ignore_errors=True)
    ck = model()
    m = pyckpt.CheckpointManager(ck, out, max_to_keep=None, incremental=True)
    for step in (1, 2):
        for k, v in golden_values(step).items():
            getattr(ck, k).assign(v)
        m.save()
    m.close()
    for name in ("pyckpt-manager.json", "pyckpt-manager.lock"):
        (out / name).unlink(missing_ok=True)
    print("wrote", out)
