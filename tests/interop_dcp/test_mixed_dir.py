"""A directory holding pyckpt's index and DCP's ``.metadata``: torch's own DCP writer
saved into a directory pyckpt saved before (or the reverse). The commit record written
last is read, with a warning naming both files (docs/API.md section 17); equal or
missing modification times are refused."""

import os
import warnings

import numpy as np
import pytest

import pyckpt
from pyckpt.codecs.distcp import METADATA_NAME
from pyckpt.errors import CorruptCheckpointError
from pyckpt.format import INDEX_NAME
from pyckpt.sources import open_source
from pyckpt.storage import LocalStore, resolve

torch = pytest.importorskip("torch")
dcp = pytest.importorskip("torch.distributed.checkpoint")

OLD = np.ones((2, 3), np.float32)
NEW = np.full((2, 3), 2, np.float32)


def _dcp_save(value, path):
    """torch's own writer: FileSystemWriter locally, FsspecWriter for URLs."""
    if "://" in str(path):
        from torch.distributed.checkpoint._fsspec_filesystem import FsspecWriter
        writer = FsspecWriter(str(path))
    else:
        writer = dcp.FileSystemWriter(str(path))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "no process group: saving in a single process"
        dcp.save({"w": torch.from_numpy(value.copy())}, storage_writer=writer)


def _load(path):
    with pytest.warns(UserWarning, match="holds two checkpoints") as caught:
        got = pyckpt.load(path)["w"]
    return got, str(caught[0].message)


@pytest.mark.parametrize("where", ["local", "memory"])
def test_dcp_saved_last_is_read(tmp_path, where):
    """The directory was read as pyckpt's checkpoint: the older values, no word."""
    path = str(tmp_path / "ck") if where == "local" else f"memory://{tmp_path.name}/ck"
    pyckpt.save({"w": OLD}, path)
    _dcp_save(NEW, path)
    store, p = resolve(path)
    assert store.mtime(store.join(p, METADATA_NAME)) > store.mtime(store.join(p, INDEX_NAME))
    got, message = _load(path)
    np.testing.assert_array_equal(got, NEW)
    assert INDEX_NAME in message and METADATA_NAME in message and "reading DCP's" in message
    with pytest.warns(UserWarning, match="reading DCP's"):
        reader = pyckpt.load_checkpoint(path)
    assert type(reader.source).__name__ == "DCPCheckpoint"
    np.testing.assert_array_equal(reader.get_tensor("w"), NEW)


@pytest.mark.parametrize("where", ["local", "memory"])
def test_pyckpt_saved_last_is_read(tmp_path, where):
    path = str(tmp_path / "ck") if where == "local" else f"memory://{tmp_path.name}/ck"
    _dcp_save(OLD, path)
    pyckpt.save({"w": NEW}, path)
    got, message = _load(path)
    np.testing.assert_array_equal(got, NEW)
    assert INDEX_NAME in message and METADATA_NAME in message and "reading pyckpt's" in message


def test_a_run_directory_resolves_to_a_mixed_checkpoint(tmp_path):
    run = tmp_path / "run"
    path = run / "ckpt-1"
    pyckpt.save({"w": OLD}, path)
    _dcp_save(NEW, path)
    with pytest.warns(UserWarning, match="reading DCP's"):
        np.testing.assert_array_equal(pyckpt.load(run)["w"], NEW)


def test_equal_times_are_refused_naming_both_files(tmp_path):
    path = tmp_path / "ck"
    pyckpt.save({"w": OLD}, path)
    _dcp_save(NEW, path)
    t = os.stat(path / INDEX_NAME).st_mtime_ns
    os.utime(path / METADATA_NAME, ns=(t, t))
    with pytest.raises(CorruptCheckpointError, match="do not tell which was saved last") as e:
        pyckpt.load(path)
    assert str(path / INDEX_NAME) in str(e.value) and str(path / METADATA_NAME) in str(e.value)


def test_a_plain_pyckpt_checkpoint_costs_one_probe_and_no_warning(tmp_path, monkeypatch):
    path = str(tmp_path / "ck")
    pyckpt.save({"w": OLD}, path)
    probes = []
    real = LocalStore.exists

    def exists(self, p):
        probes.append(os.path.basename(p))
        return real(self, p)

    monkeypatch.setattr(LocalStore, "exists", exists)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        src = open_source(path)
    assert src.keys == ["w"]
    assert probes.count(METADATA_NAME) == 1


def test_a_damaged_newer_metadata_says_the_older_checkpoint_is_there(tmp_path):
    path = tmp_path / "ck"
    pyckpt.save({"w": OLD}, path)
    (path / METADATA_NAME).write_bytes(b"not a pickle")
    t = os.stat(path / INDEX_NAME).st_mtime_ns + 10**9
    os.utime(path / METADATA_NAME, ns=(t, t))
    with pytest.warns(UserWarning, match="reading DCP's"), \
            pytest.raises(CorruptCheckpointError) as e:
        pyckpt.load(path)
    assert any("also holds pyckpt's checkpoint" in n for n in getattr(e.value, "__notes__", []))
