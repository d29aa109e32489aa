"""The one commit routine (pyckpt/engine/commit.py, docs/PROTOCOL.md section 1): an
index write that raised but landed counts as committed; one that did not land
deletes the attempt's files and raises; the replaced checkpoint's files go."""

import os

import numpy as np
import pytest

import pyckpt
from pyckpt.storage.local import LocalStore


def _data_files(path):
    return sorted(n for n in os.listdir(path) if n.startswith("data-"))


def _failing_index_write(monkeypatch, lands):
    real = LocalStore.write_atomic

    def write_atomic(self, path, data):
        if path.endswith("pyckpt.index"):
            if lands:
                real(self, path, data)
            raise OSError(5, "the answer was lost")
        return real(self, path, data)

    monkeypatch.setattr(LocalStore, "write_atomic", write_atomic)


def test_an_index_that_landed_counts_as_committed(tmp_path, monkeypatch):
    pyckpt.save({"a": np.zeros(4)}, tmp_path / "c")
    old = _data_files(tmp_path / "c")
    _failing_index_write(monkeypatch, lands=True)
    pyckpt.save({"a": np.ones(4)}, tmp_path / "c")  # no error: it is committed
    monkeypatch.undo()
    assert pyckpt.load(tmp_path / "c")["a"].tolist() == [1.0] * 4
    new = _data_files(tmp_path / "c")
    assert new and not set(new) & set(old)  # the replaced files were deleted


def test_an_index_that_did_not_land_raises_and_leaves_the_previous(tmp_path, monkeypatch):
    pyckpt.save({"a": np.zeros(4)}, tmp_path / "c")
    old = _data_files(tmp_path / "c")
    _failing_index_write(monkeypatch, lands=False)
    with pytest.raises(OSError, match="the answer was lost"):
        pyckpt.save({"a": np.ones(4)}, tmp_path / "c")
    monkeypatch.undo()
    assert pyckpt.load(tmp_path / "c")["a"].tolist() == [0.0] * 4
    assert _data_files(tmp_path / "c") == old  # the attempt's files are gone
    assert not [n for n in os.listdir(tmp_path / "c") if n.startswith("pyckpt-attempt-")]
