"""Issue 38 item 5: ``pyckpt cp`` of an incremental checkpoint copies the bytes it reads,
not whole referenced files (which hold the referenced checkpoint's other data too):
the copy's data is about its SIZE, every chunk of it checked, and its values equal."""

from __future__ import annotations

import os

import numpy as np
import pytest

import pyckpt
from pyckpt.cli import main
from pyckpt.errors import CorruptCheckpointError

from .inc_helpers import data_bytes

MIB = 1 << 20


def _run(tmp_path):
    """ckpt-3 reads 'frozen' (4 MiB) in ckpt-1's file, which also holds ckpt-1's
    'moving' (2 MiB, rewritten by every save)."""
    frozen = pyckpt.Variable(np.arange(MIB, dtype=np.float32))
    moving = pyckpt.Variable(np.zeros(MIB // 2, np.float32))
    small = pyckpt.Variable(np.zeros(100, np.int64))
    ck = pyckpt.Checkpoint(frozen=frozen, moving=moving, small=small)
    with pyckpt.CheckpointManager(ck, tmp_path / "run", max_to_keep=2, incremental=True) as m:
        for step in range(3):
            moving.assign(np.full(MIB // 2, step, np.float32))
            small.assign(np.full(100, step))
            m.save()
        return m.latest_checkpoint


def _flat(tree, prefix=""):
    if isinstance(tree, dict):
        for k, v in tree.items():
            yield from _flat(v, f"{prefix}/{k}")
    else:
        yield prefix, tree


def test_cp_copies_only_the_referenced_bytes_it_reads(tmp_path):
    latest = _run(tmp_path)
    facts = pyckpt.load_checkpoint(latest).source.describe()
    assert facts["referenced_bytes"] == 4 * MIB
    referenced = sum(f["bytes"] for f in facts["files"] if "in" in f)
    assert referenced > 6 * MIB  # ckpt-1's whole file: frozen and ckpt-1's moving
    copy = str(tmp_path / "copy")
    assert main(["cp", latest, copy]) == 0
    logical = facts["own_bytes"] + facts["referenced_bytes"]
    assert data_bytes(copy) < logical + 64 * 1024  # (alignment) not + ckpt-1's 2 MiB
    assert data_bytes(copy) < data_bytes(latest) + referenced - MIB
    want, got = dict(_flat(pyckpt.load(latest))), dict(_flat(pyckpt.load(copy)))
    assert want.keys() == got.keys()
    for k in want:
        assert np.array_equal(np.asarray(want[k]), np.asarray(got[k])), k
    pyckpt.load_checkpoint(copy).verify()


def _offset_of(directory, values: np.ndarray):
    for name in os.listdir(directory):
        if name.startswith("data-"):
            at = open(os.path.join(directory, name), "rb").read().find(values.tobytes())
            if at >= 0:
                return os.path.join(directory, name), at
    raise AssertionError("not found")


def _flip(path, pos):
    with open(path, "r+b") as f:
        f.seek(pos)
        b = f.read(1)
        f.seek(pos)
        f.write(bytes([b[0] ^ 1]))


def test_cp_checks_the_bytes_it_copies_and_only_those(tmp_path, capsys):
    latest = _run(tmp_path)
    held = tmp_path / "run" / "ckpt-1"
    # a bit of ckpt-1's own 'moving' (no one reads it any more): the copy does not care
    path, at = _offset_of(held, np.zeros(1024, np.float32))
    _flip(path, at + 4096)
    assert main(["cp", latest, str(tmp_path / "copy")]) == 0
    # a bit of 'frozen', which ckpt-3 reads there: the copy fails and commits nothing
    path, at = _offset_of(held, np.arange(1024, dtype=np.float32))
    _flip(path, at + 4096)
    assert main(["cp", latest, str(tmp_path / "copy2")]) == 1
    assert "ckpt-1" in capsys.readouterr().err
    with pytest.raises(CorruptCheckpointError):
        pyckpt.load(latest)  # (the damage is real)
    assert not os.path.exists(tmp_path / "copy2" / "pyckpt.index")
