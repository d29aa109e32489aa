import os

import numpy as np
import pytest


@pytest.fixture
def rng():
    return np.random.default_rng(1234)


@pytest.fixture
def ckpt_dir(tmp_path):
    """A path for one checkpoint (not yet existing)."""
    return str(tmp_path / "ckpt")


def flip_byte(path: str, pos: int, bit: int = 0x01) -> None:
    with open(path, "r+b") as f:
        f.seek(pos)
        b = f.read(1)
        f.seek(pos)
        f.write(bytes([b[0] ^ bit]))


@pytest.fixture
def flip():
    return flip_byte


def data_files(path: str) -> list[str]:
    return sorted(os.path.join(path, n) for n in os.listdir(path) if n.startswith("data-"))


@pytest.fixture
def shard_files():
    return data_files
