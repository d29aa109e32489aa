"""Hugging Face safetensors folders (API.md section 10, issue 24 item 3): export_hf and
``pyckpt cp --format hf`` write what transformers' save_pretrained writes; load and
load_checkpoint read such a folder (or its index file) as one checkpoint."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest

import pyckpt
from pyckpt.errors import CorruptCheckpointError
from pyckpt.interop.safetensors import export_hf, parse_size
from pyckpt.testing.thread_comm import ThreadGroup

safetensors_numpy = pytest.importorskip("safetensors.numpy")


def _state():
    rng = np.random.default_rng(0)
    return {"model.embed.weight": rng.random((100, 50), dtype=np.float32),  # 20,000 B
            "model.big": rng.random(3000),                                  # 24,000 B
            "model.b": np.arange(10, dtype=np.int64),                       # 80 B
            "lm_head.weight": rng.random((20, 50)).astype(np.float16)}      # 2,000 B


def _files(folder):
    return sorted(n for n in os.listdir(folder) if n.endswith(".safetensors"))


def test_files_and_index_as_transformers_writes_them(tmp_path):
    state = _state()
    pyckpt.save(state, tmp_path / "ck")
    url = export_hf(tmp_path / "ck", tmp_path / "hf", max_shard_size="21KB")
    assert url == str(tmp_path / "hf")
    # in order, a file takes tensors while they fit; 24,000 B > 21 KB gets a file alone
    assert _files(tmp_path / "hf") == [f"model-0000{i}-of-00003.safetensors" for i in (1, 2, 3)]
    index = json.loads((tmp_path / "hf" / "model.safetensors.index.json").read_text())
    assert index["metadata"] == {"total_size": 20_000 + 24_000 + 80 + 2_000}
    assert list(index["weight_map"]) == sorted(state)
    assert index["weight_map"] == {"model.embed.weight": "model-00001-of-00003.safetensors",
                                   "model.big": "model-00002-of-00003.safetensors",
                                   "model.b": "model-00003-of-00003.safetensors",
                                   "lm_head.weight": "model-00003-of-00003.safetensors"}
    seen = {}
    for f in _files(tmp_path / "hf"):  # every file is a plain safetensors file
        seen.update(safetensors_numpy.load_file(str(tmp_path / "hf" / f)))
    assert sorted(seen) == sorted(state)
    for k, v in state.items():
        np.testing.assert_array_equal(seen[k], v)
        assert seen[k].dtype == v.dtype


@pytest.mark.parametrize("given", ["folder", "index"])
def test_a_folder_loads_as_one_checkpoint(tmp_path, given):
    state = _state()
    pyckpt.save(state, tmp_path / "ck")
    export_hf(tmp_path / "ck", tmp_path / "hf", max_shard_size=25_000)
    path = tmp_path / "hf" if given == "folder" else tmp_path / "hf" / "model.safetensors.index.json"
    out = pyckpt.load(path)
    assert sorted(out) == sorted(state)
    for k, v in state.items():
        np.testing.assert_array_equal(out[k], v)
    reader = pyckpt.load_checkpoint(path)
    assert reader.get_variable_to_shape_map() == {k: v.shape for k, v in state.items()}
    np.testing.assert_array_equal(reader.get_tensor("model.b"), state["model.b"])
    into = {k: np.zeros_like(v) for k, v in state.items()}
    pyckpt.load(path, into=into)
    np.testing.assert_array_equal(into["model.big"], state["model.big"])


def test_select_and_key_map_pick_and_rename(tmp_path):
    state = _state()
    pyckpt.save(state, tmp_path / "ck")
    export_hf(tmp_path / "ck", tmp_path / "hf", select=["model.*"],
              key_map=lambda k: None if k == "model.b" else k.replace("model.", "m."))
    out = pyckpt.load(tmp_path / "hf")
    assert sorted(out) == ["m.big", "m.embed.weight"]
    np.testing.assert_array_equal(out["m.big"], state["model.big"])
    assert _files(tmp_path / "hf") == ["model-00001-of-00001.safetensors"]


def test_sharded_checkpoint_of_several_workers_exports_assembled_and_in_parallel(tmp_path):
    full = np.arange(64 * 40, dtype=np.float32).reshape(64, 40)
    repl = np.linspace(0, 1, 5000)

    def save(comm):
        rows = slice(32 * comm.rank, 32 * (comm.rank + 1))
        pyckpt.save({"w": pyckpt.ShardedArray(full[rows].copy(), (64, 40), (rows.start, 0)),
                     "r": repl}, tmp_path / "ck", comm=comm)

    def export(comm):
        return export_hf(tmp_path / "ck", tmp_path / "hf", max_shard_size="12KB", comm=comm)

    for fn in (save, export):
        for r in ThreadGroup(2).run(fn):
            assert not isinstance(r, BaseException), r
    assert _files(tmp_path / "hf") == ["model-00001-of-00002.safetensors",
                                       "model-00002-of-00002.safetensors"]
    out = pyckpt.load(tmp_path / "hf")
    np.testing.assert_array_equal(out["w"], full)
    np.testing.assert_array_equal(out["r"], repl)


def test_a_failing_worker_leaves_no_index(tmp_path, monkeypatch):
    from pyckpt.interop import safetensors as st
    pyckpt.save(_state(), tmp_path / "ck")
    real = st.write_file

    def write_file(src, store, path, *a, **k):
        if path.endswith("00002-of-00003.safetensors"):
            raise OSError(28, "No space left on device")
        return real(src, store, path, *a, **k)

    monkeypatch.setattr(st, "write_file", write_file)

    def export(comm):
        return export_hf(tmp_path / "ck", tmp_path / "hf", max_shard_size="21KB", comm=comm)

    results = ThreadGroup(2).run(export)
    assert all(isinstance(r, pyckpt.CheckpointError) and "rank 1: OSError" in str(r)
               for r in results), results
    assert not (tmp_path / "hf" / "model.safetensors.index.json").exists()


def test_a_new_export_removes_the_old_shards(tmp_path):
    pyckpt.save(_state(), tmp_path / "ck")
    export_hf(tmp_path / "ck", tmp_path / "hf", max_shard_size="21KB")
    export_hf(tmp_path / "ck", tmp_path / "hf")
    assert _files(tmp_path / "hf") == ["model-00001-of-00001.safetensors"]
    pyckpt.load_checkpoint(tmp_path / "hf").verify()


def test_sizes():
    assert parse_size("5GB") == 5 * 10**9 and parse_size("200KB") == 200_000
    assert parse_size("2GiB") == 2 * 2**30 and parse_size(123) == 123
    assert parse_size("1.5MB") == 1_500_000
    for bad in ("5 parsecs", "-1", 0, "GB"):
        with pytest.raises(ValueError, match="max_shard_size"):
            parse_size(bad)


def test_unsupported_dtypes_are_named(tmp_path):
    pyckpt.save({"ok": np.ones(3), "s": np.array([b"ab", b"c"])}, tmp_path / "ck")
    with pytest.raises(TypeError, match=r"cannot hold these tensors: s \(S2\)"):
        export_hf(tmp_path / "ck", tmp_path / "hf")
    assert not (tmp_path / "hf" / "model.safetensors.index.json").exists()


def _hostile(tmp_path, weight_map):
    pyckpt.save(_state(), tmp_path / "ck")
    export_hf(tmp_path / "ck", tmp_path / "hf", max_shard_size="21KB")
    index = tmp_path / "hf" / "model.safetensors.index.json"
    doc = json.loads(index.read_text())
    doc["weight_map"] = weight_map(doc["weight_map"])
    index.write_text(json.dumps(doc))
    return tmp_path / "hf"


@pytest.mark.parametrize("change, message", [
    (lambda m: {**m, "model.b": "../../etc/passwd.safetensors"}, "not a .safetensors file"),
    (lambda m: {**m, "ghost": "model-00001-of-00003.safetensors"}, "which lacks it"),
    (lambda m: {k: v for k, v in m.items() if k != "lm_head.weight"}, "does not name"),
    (lambda m: {**m, "model.b": "model-00001-of-00003.safetensors"}, "gives to"),
    (lambda m: [1, 2], "no weight_map"),
])
def test_a_hostile_index_is_refused(tmp_path, change, message):
    folder = _hostile(tmp_path, change)
    with pytest.raises(CorruptCheckpointError, match=message):
        pyckpt.load(folder)


def test_cp_format_hf(tmp_path):
    state = _state()
    pyckpt.save(state, tmp_path / "ck")
    cmd = [sys.executable, "-m", "pyckpt", "cp", str(tmp_path / "ck"), str(tmp_path / "hf"),
           "--format", "hf", "--max-shard-size", "21KB"]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert len(_files(tmp_path / "hf")) == 3
    again = subprocess.run(cmd, capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert again.returncode == 1 and "already holds a Hugging Face folder" in again.stderr
    out = pyckpt.load(tmp_path / "hf")
    for k, v in state.items():
        np.testing.assert_array_equal(out[k], v)


def test_read_ahead_keeps_order_and_raises_where_the_failed_tensor_is_due():
    import threading
    import time

    from pyckpt.codecs import safetensors as cs

    class Slow:
        keys = [f"k{i}" for i in range(20)]
        live = 0
        most = 0
        lock = threading.Lock()

        def shape(self, i):
            return (4,)

        def dtype(self, i):
            return np.dtype(np.float64)

        def read_new(self, idx):
            (i,) = idx
            with self.lock:
                Slow.live += 1
                Slow.most = max(Slow.most, Slow.live)
            time.sleep(0.02 * ((i * 7) % 3))  # finish out of order
            with self.lock:
                Slow.live -= 1
            if i == 13:
                raise OSError(5, "read failed")
            return [np.full(4, float(i))]

    got = []
    with pytest.raises(OSError, match="read failed"):
        for arr in cs.read_ahead(Slow(), list(range(20))):
            got.append(int(arr[0]))
    assert got == list(range(13))
    assert 1 < Slow.most <= cs.READ_AHEAD_TENSORS
