"""Issue 37 item 4: an incremental save never references data it has not checked (a
damaged base is reported and written around), and no save or copy onto a checkpoint
that later incremental checkpoints reference breaks them."""

from __future__ import annotations

import os
import pathlib
import sys
import warnings

import numpy as np
import pytest

import pyckpt

sys.path.insert(0, str(pathlib.Path(__file__).parent))
from inc_helpers import model, restored, same, train_step, values  # noqa: E402


def _flip(path: pathlib.Path, at: int = 1000) -> None:
    with open(path, "r+b") as f:
        f.seek(at)
        b = f.read(1)
        f.seek(at)
        f.write(bytes([b[0] ^ 0xFF]))


def _data(d: pathlib.Path) -> pathlib.Path:
    return d / [n for n in os.listdir(d) if n.startswith("data-")][0]


@pytest.mark.parametrize("full_save_every", [None, 10])
def test_damaged_base_is_reported_and_written_around(tmp_path, full_save_every):
    run = tmp_path / "run"
    ck = model()
    m = pyckpt.CheckpointManager(ck, run, max_to_keep=None, incremental=True,
                                 full_save_every=full_save_every)
    for step in (1, 2):
        train_step(ck, step)
        m.save()
    _flip(_data(run / "ckpt-1"))  # the frozen part, referenced by ckpt-2
    train_step(ck, 4)
    with pytest.warns(UserWarning, match="damaged") as w:
        p3 = m.save()
    assert any("ckpt-1" in str(x.message) for x in w)
    same(restored(p3), values(ck))            # the good copy in memory was written
    pyckpt.load_checkpoint(p3).verify()       # and nothing of ckpt-3 is damaged
    train_step(ck, 5)
    with warnings.catch_warnings():
        warnings.simplefilter("error")        # healed: no damaged data referenced again
        p4 = m.save()
    same(restored(p4), values(ck))
    refs = {f["in"] for f in pyckpt.load_checkpoint(p4).source.describe()["files"] if "in" in f}
    assert "ckpt-1" not in refs
    m.close()


def test_damaged_base_of_a_copy_is_written_around(tmp_path):
    """``pyckpt cp`` of an incremental checkpoint into a run referencing a base there
    (the tiers' persist) checks the base's bytes too."""
    from pyckpt.engine import copy as engine_copy
    from pyckpt.engine.incremental import Base
    from pyckpt.engine.reader import OpenCheckpoint
    from pyckpt.storage import resolve
    run, other = tmp_path / "run", tmp_path / "other"
    ck = model()
    train_step(ck, 1)
    saved = []
    for d in (run, other):
        with pyckpt.CheckpointManager(ck, d, max_to_keep=None, incremental=True) as m:
            saved.append(m.save())
    store, base_path = resolve(saved[0])
    base = Base("ckpt-1", base_path, OpenCheckpoint.open(store, base_path).manifest)
    _flip(_data(run / "ckpt-1"))
    src = OpenCheckpoint.open(*resolve(saved[1]))
    with pytest.warns(UserWarning, match="damaged"):
        engine_copy.copy_referencing(src, store, str(run / "ckpt-9"), base)
    same(restored(str(run / "ckpt-9")), values(ck))


def _referenced_run(tmp_path):
    ck = model()
    m = pyckpt.CheckpointManager(ck, tmp_path / "run", max_to_keep=None, incremental=True)
    for step in (1, 2, 3):
        train_step(ck, step)
        m.save()
    m.close()
    return ck, tmp_path / "run"


def test_save_over_a_referenced_checkpoint_is_refused(tmp_path):
    ck, run = _referenced_run(tmp_path)
    want = values(ck)
    with pytest.raises(ValueError, match="ckpt-2, ckpt-3"):
        pyckpt.save({"x": np.ones(3)}, run / "ckpt-1")
    same(restored(str(run / "ckpt-3")), want)
    assert not [n for n in os.listdir(run / "ckpt-1") if n.startswith("data-")
                and n not in {f["name"] for f in
                              pyckpt.load_checkpoint(run / "ckpt-1").source.describe()["files"]}]


def test_cp_force_over_a_referenced_checkpoint_is_refused(tmp_path, capsys):
    from pyckpt.cli import main
    ck, run = _referenced_run(tmp_path)
    want = values(ck)
    other = tmp_path / "other"
    pyckpt.save({"x": np.ones(3)}, other)
    assert main(["cp", str(other), str(run / "ckpt-1"), "--force"]) != 0
    assert "reference" in capsys.readouterr().err
    same(restored(str(run / "ckpt-3")), want)


def test_save_over_held_data_is_refused(tmp_path):
    """Held data (a retired checkpoint's files that kept ones reference, no index)."""
    ck, run = _referenced_run(tmp_path)
    want = values(ck)
    os.unlink(run / "ckpt-1" / "pyckpt.index")
    with pytest.raises(ValueError, match="reference"):
        pyckpt.save({"x": np.ones(3)}, run / "ckpt-1")
    same(restored(str(run / "ckpt-3")), want)
