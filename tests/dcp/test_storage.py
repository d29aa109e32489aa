"""pyckpt.dcp.StorageWriter / StorageReader under torch.distributed.checkpoint: single
process here (DCP without a process group), real torchrun jobs in test_torchrun.py."""

import gc
import os
import subprocess
import sys
import warnings

import numpy as np
import pytest

torch = pytest.importorskip("torch")
dcp = pytest.importorskip("torch.distributed.checkpoint")

import pyckpt  # noqa: E402
import pyckpt.dcp  # noqa: E402
from pyckpt.errors import CorruptCheckpointError  # noqa: E402
from torch.distributed.checkpoint.api import CheckpointException  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore:torch.distributed is disabled")


def state():
    g = torch.Generator().manual_seed(3)
    return {"model": {"w": torch.randn(5, 3, generator=g), "b": torch.randn(7, generator=g).bfloat16(),
                      "ids": torch.arange(6, dtype=torch.int64),
                      "col": torch.randn(4, 6, generator=g)[:, 2],  # a non-contiguous view
                      "empty": torch.zeros(0, 3), "scalar": torch.tensor(2.5)},
            "step": 9, "sched": {"lr": 0.25, "name": "cosine", "milestones": [3, 5]}}


def blank():
    s = state()
    for k, v in s["model"].items():
        s["model"][k] = torch.zeros_like(v)
    s["step"], s["sched"] = 0, {"lr": 0.0, "name": "", "milestones": []}
    return s


def cause(exc):
    """The error a rank raised inside DCP's CheckpointException (DCP wraps them)."""
    failures = getattr(exc, "failures", None)
    if failures:
        first = next(iter(failures.values()))
        return first[0] if isinstance(first, tuple) else first
    return exc


def check_equal(got, want):
    for k, v in want["model"].items():
        assert got["model"][k].dtype == v.dtype and torch.equal(got["model"][k], v), k
    assert got["step"] == want["step"] and got["sched"] == want["sched"]


def test_round_trip(tmp_path):
    path = str(tmp_path / "ck")
    dcp.save(state(), storage_writer=pyckpt.dcp.StorageWriter(path))
    got = blank()
    dcp.load(got, storage_reader=pyckpt.dcp.StorageReader(path))
    check_equal(got, state())


def test_written_checkpoint_is_pyckpts(tmp_path):
    path = str(tmp_path / "ck")
    dcp.save(state(), storage_writer=pyckpt.dcp.StorageWriter(path))
    assert sorted(os.listdir(path))[-1] == "pyckpt.index"
    flat = pyckpt.load(path)
    want = state()
    assert set(flat) == {f"model.{k}" for k in want["model"]} | {
        "step", "sched.lr", "sched.name", "sched.milestones"}
    for k, v in want["model"].items():
        assert isinstance(flat[f"model.{k}"], torch.Tensor)
        assert torch.equal(flat[f"model.{k}"], v), k
    # DCP's non-tensor values: its own pickled bytes, kept and never unpickled by pyckpt
    assert isinstance(flat["step"], bytes) and flat["step"].startswith(b"PK\x03\x04")
    reader = pyckpt.load_checkpoint(path)
    assert dict(reader.get_variable_to_shape_map())["model.w"] in ([5, 3], (5, 3))
    np.testing.assert_array_equal(reader.get_tensor("model.ids"), np.arange(6))
    r = subprocess.run([sys.executable, "-m", "pyckpt", "verify", path],
                       capture_output=True, text=True, cwd=tmp_path)
    assert r.returncode == 0 and "every checksum matches" in r.stdout, r.stdout + r.stderr


def test_pyckpt_load_resharded_block(tmp_path):
    path = str(tmp_path / "ck")
    dcp.save(state(), storage_writer=pyckpt.dcp.StorageWriter(path))
    block = pyckpt.ShardedArray(np.zeros((2, 3), np.float32), (5, 3), (3, 0))
    pyckpt.load(path, into={"model.w": block}, strict=False)
    np.testing.assert_array_equal(block.local, state()["model"]["w"].numpy()[3:5])


def test_flipped_byte_is_refused(tmp_path, shard_files, flip):
    path = str(tmp_path / "ck")
    dcp.save(state(), storage_writer=pyckpt.dcp.StorageWriter(path))
    flip(shard_files(path)[0], 0)
    with pytest.raises(CheckpointException) as e:
        dcp.load(blank(), storage_reader=pyckpt.dcp.StorageReader(path))
    err = cause(e.value)
    assert isinstance(err, CorruptCheckpointError), repr(err)
    assert "'model." in str(err) and "bytes [" in str(err)  # names the key and byte range


def test_save_replaces_previous_checkpoint(tmp_path, shard_files):
    path = str(tmp_path / "ck")
    dcp.save(state(), storage_writer=pyckpt.dcp.StorageWriter(path))
    first = shard_files(path)
    s = state()
    s["model"]["w"] += 1
    dcp.save(s, storage_writer=pyckpt.dcp.StorageWriter(path))
    assert not set(first) & set(shard_files(path))  # the replaced files are gone
    got = blank()
    dcp.load(got, storage_reader=pyckpt.dcp.StorageReader(path))
    check_equal(got, s)


def test_reader_serves_checkpoints_pyckpt_saved(tmp_path):
    """Any pyckpt checkpoint is a DCP source: each tensor is one chunk to DCP."""
    path = str(tmp_path / "ck")
    w = np.arange(12, dtype=np.float32).reshape(4, 3)
    pyckpt.save({"w": w, "v": np.ones(2)}, path)
    got = {"w": torch.zeros(4, 3), "v": torch.zeros(2, dtype=torch.float64)}
    dcp.load(got, storage_reader=pyckpt.dcp.StorageReader(path))
    assert torch.equal(got["w"], torch.from_numpy(w)) and torch.equal(got["v"], torch.ones(2).double())


def test_load_casts_like_dcp(tmp_path):
    """A target of another dtype gets the values copied in (as DCP's own reader does)."""
    path = str(tmp_path / "ck")
    dcp.save({"w": torch.arange(6.0)}, storage_writer=pyckpt.dcp.StorageWriter(path))
    got = {"w": torch.zeros(6, dtype=torch.float64)}
    dcp.load(got, storage_reader=pyckpt.dcp.StorageReader(path))
    assert torch.equal(got["w"], torch.arange(6.0).double())


def test_missing_key_raises(tmp_path):
    path = str(tmp_path / "ck")
    dcp.save({"w": torch.ones(2)}, storage_writer=pyckpt.dcp.StorageWriter(path))
    with pytest.raises(CheckpointException) as e:
        dcp.load({"w": torch.zeros(2), "other": torch.zeros(2)},
                 storage_reader=pyckpt.dcp.StorageReader(path))
    assert "other" in str(cause(e.value))


def test_memory_url_and_checkpoint_id(tmp_path):
    url = "memory://dcp-test/ck"
    dcp.save(state(), checkpoint_id=url, storage_writer=pyckpt.dcp.StorageWriter("unused"))
    got = blank()
    dcp.load(got, checkpoint_id=url, storage_reader=pyckpt.dcp.StorageReader("unused"))
    check_equal(got, state())


def test_failed_write_commits_nothing(tmp_path):
    path = str(tmp_path / "ck")
    dcp.save({"w": torch.ones(3)}, storage_writer=pyckpt.dcp.StorageWriter(path))
    writer = pyckpt.dcp.StorageWriter(path)
    s = {"w": torch.full((3,), 5.0)}
    real = pyckpt.dcp.writer.planned_save.write_blocks

    def broken(*a, **k):
        raise OSError("injected write failure")
    pyckpt.dcp.writer.planned_save.write_blocks = broken
    try:
        with pytest.raises(CheckpointException) as e:
            dcp.save(s, storage_writer=writer)
        assert "injected write failure" in str(cause(e.value))
    finally:
        pyckpt.dcp.writer.planned_save.write_blocks = real
    del writer, e  # its attempt ends with the writer: the next commit sweeps what it left
    gc.collect()
    assert torch.equal(pyckpt.load(path)["w"], torch.ones(3))
    dcp.save({"w": torch.full((3,), 2.0)}, storage_writer=pyckpt.dcp.StorageWriter(path))
    assert not [n for n in os.listdir(path) if n.startswith("pyckpt-attempt-")]
    assert len([n for n in os.listdir(path) if n.startswith("data-")]) == 1


def test_async_save_keeps_values_of_the_call(tmp_path):
    path = str(tmp_path / "ck")
    s = {"w": torch.arange(8.0)}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        fut = dcp.async_save(s, storage_writer=pyckpt.dcp.StorageWriter(path))
    s["w"].fill_(-1)
    fut.result()
    assert torch.equal(pyckpt.load(path)["w"], torch.arange(8.0))


def test_s3(tmp_path, seaweed_server):
    url = "s3://pyckpt/dcp/ck"
    opts = seaweed_server.options
    dcp.save(state(), storage_writer=pyckpt.dcp.StorageWriter(url, storage_options=opts))
    got = blank()
    dcp.load(got, storage_reader=pyckpt.dcp.StorageReader(url, storage_options=opts))
    check_equal(got, state())


def test_missing_torch_names_the_extra(tmp_path):
    code = ("import sys; sys.modules['torch'] = None\n"
            "try:\n    import pyckpt.dcp\nexcept ImportError as e:\n    print(e)\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path)
    assert 'pip install "pyckpt[torch]"' in r.stdout, r.stdout + r.stderr


def test_cp_to_hf_folder_leaves_bytes_out_with_a_warning(tmp_path):
    path, out = str(tmp_path / "ck"), str(tmp_path / "hf")
    dcp.save(state(), storage_writer=pyckpt.dcp.StorageWriter(path))
    r = subprocess.run([sys.executable, "-m", "pyckpt", "cp", path, out, "--format", "hf"],
                       capture_output=True, text=True, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert "left out" in r.stderr and "step (bytes)" in r.stderr
    got = pyckpt.load(out)
    assert sorted(got) == sorted(f"model.{k}" for k in state()["model"])
    assert torch.equal(torch.as_tensor(np.asarray(got["model.w"])), state()["model"]["w"])


def test_reader_serves_dcps_own_checkpoints(tmp_path):
    """A directory DCP's FileSystemWriter wrote loads through pyckpt's reader too (read
    by pyckpt's DCP-format reader, every zip entry's CRC checked)."""
    path = str(tmp_path / "dcp-own")
    dcp.save(state(), checkpoint_id=path)
    assert ".metadata" in os.listdir(path)
    got = blank()
    dcp.load(got, storage_reader=pyckpt.dcp.StorageReader(path))
    check_equal(got, state())
