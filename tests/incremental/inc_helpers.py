"""Shared pieces of the incremental-save tests: a model with a large frozen part and
small trained parts, and what its values are after a given step."""

from __future__ import annotations

import os
import pathlib

import numpy as np

import pyckpt

FROZEN_SHAPE = (512, 256)   # 512 KiB of float32 that never changes
HEAD_SHAPE = (64, 16)       # 4 KiB that every step changes


def model() -> pyckpt.Checkpoint:
    rng = np.random.default_rng(7)
    return pyckpt.Checkpoint(
        step=pyckpt.Variable(np.int64(0)),
        frozen=pyckpt.Variable(rng.standard_normal(FROZEN_SHAPE).astype(np.float32)),
        head=pyckpt.Variable(np.zeros(HEAD_SHAPE, np.float32)),
        ema=pyckpt.Variable(np.zeros(1000)),
    )


def train_step(ck: pyckpt.Checkpoint, step: int) -> None:
    ck.step.assign(step)
    ck.head.assign(np.full(HEAD_SHAPE, step, np.float32))
    if step % 3 == 0:  # a slowly changing part
        ck.ema.assign(np.full(1000, step / 3.0))


def values(ck: pyckpt.Checkpoint) -> dict[str, np.ndarray]:
    return {k: np.array(getattr(ck, k).numpy()) for k in ("step", "frozen", "head", "ema")}


def restored(path: str) -> dict[str, np.ndarray]:
    ck = model()
    for k in ("frozen", "head", "ema"):
        v = getattr(ck, k)
        v.assign(np.zeros(v.shape, v.dtype))
    ck.restore(path).assert_consumed()
    return values(ck)


def same(a: dict, b: dict) -> None:
    assert a.keys() == b.keys()
    for k in a:
        assert a[k].dtype == b[k].dtype and a[k].tobytes() == b[k].tobytes(), k


def data_bytes(directory: str | pathlib.Path) -> int:
    """Bytes of data files under a checkpoint directory."""
    return sum(os.path.getsize(os.path.join(directory, n)) for n in os.listdir(directory)
               if n.startswith("data-"))
