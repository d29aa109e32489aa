"""Checkpoints on object stores through fsspec (issue 5): memory://, S3 on
SeaweedFS and moto, GCS on the emulator; all real servers on 127.0.0.1."""

import threading

import fsspec
import numpy as np
import pytest

import pyckpt


def _join(prefix, name):
    return f"{prefix}/{name}"


def _tree(rng, big=200_000):
    return {"layers": [{"w": rng.standard_normal((64, 32)).astype(np.float32),
                        "b": np.zeros(32, np.float32)} for _ in range(3)],
            "embedding": rng.standard_normal(big).astype(np.float32),
            "strided": rng.standard_normal((30, 40)).T,
            "step": 17, "name": "run"}


def test_tree_round_trip_and_inspection(remote, rng):
    prefix, so = remote
    tree = _tree(rng)
    path = _join(prefix, "ckpt-3")
    assert pyckpt.save(tree, path, storage_options=so, metadata={"m": 1}) == path
    out = pyckpt.load(path, storage_options=so)
    np.testing.assert_array_equal(out["embedding"], tree["embedding"])
    np.testing.assert_array_equal(out["strided"], tree["strided"])
    assert out["step"] == 17 and out["name"] == "run"
    into = {"layers": [{"w": np.zeros((64, 32), np.float32)}], "strided": np.zeros((30, 40)).T}
    pyckpt.load(path, into=into, storage_options=so)
    np.testing.assert_array_equal(into["layers"][0]["w"], tree["layers"][0]["w"])
    np.testing.assert_array_equal(into["strided"], tree["strided"])
    reader = pyckpt.load_checkpoint(path, storage_options=so)
    reader.verify()
    assert reader.metadata == {"m": 1}
    np.testing.assert_array_equal(reader.get_tensor("layers/2/b"), tree["layers"][2]["b"])
    assert ("embedding", (200_000,)) in pyckpt.list_variables(path, storage_options=so)
    assert pyckpt.latest_checkpoint(prefix, storage_options=so) == path
    assert pyckpt.load(prefix, select=["step"], storage_options=so) == {"step": 17}


def test_object_graph_round_trip(remote):
    prefix, so = remote
    net = pyckpt.Module()
    net.w = pyckpt.Variable(np.arange(12.0).reshape(3, 4))
    path = pyckpt.Checkpoint(net=net).save(_join(prefix, "ckpt"), storage_options=so)
    other = pyckpt.Module()
    status = pyckpt.Checkpoint(net=other).restore(path, storage_options=so)
    other.w = pyckpt.Variable(np.zeros((3, 4)))  # deferred, read lazily from the store
    status.assert_consumed()
    np.testing.assert_array_equal(other.w.numpy(), net.w.numpy())


def test_manager_retention_and_recovery_on_a_bucket(remote):
    prefix, so = remote
    ck = pyckpt.Checkpoint(v=pyckpt.Variable(np.zeros(1000)))
    m = pyckpt.CheckpointManager(ck, prefix, max_to_keep=2, storage_options=so)
    for i in range(4):
        ck.v.assign(np.full(1000, float(i)))
        m.save(blocking=(i % 2 == 0))
    m.wait_until_finished()
    assert m.checkpoints == [_join(prefix, "ckpt-3"), _join(prefix, "ckpt-4")]
    fs, root = fsspec.core.url_to_fs(prefix, **(so or {}))
    fs.invalidate_cache()
    names = sorted(p.rsplit("/", 1)[-1] for p in fs.ls(root, detail=False))
    assert [n for n in names if n.startswith("ckpt-")] == ["ckpt-3", "ckpt-4"]
    m.close()
    m2 = pyckpt.CheckpointManager(pyckpt.Checkpoint(v=pyckpt.Variable(np.zeros(1000))), prefix,
                                  max_to_keep=2, storage_options=so)
    assert m2.checkpoints == m.checkpoints
    assert m2.restore_or_initialize() == _join(prefix, "ckpt-4")
    assert float(m2.checkpoint.v[0]) == 3.0


def test_concurrent_saves_of_different_checkpoints(remote, rng):
    prefix, so = remote
    trees = [{"x": rng.standard_normal(50_000), "i": i} for i in range(4)]
    errors = []

    def save(i):
        try:
            pyckpt.save(trees[i], _join(prefix, f"c{i}"), storage_options=so)
        except BaseException as e:  # pragma: no cover - reported below
            errors.append(e)

    threads = [threading.Thread(target=save, args=(i,)) for i in range(4)]
    [t.start() for t in threads]
    [t.join(120) for t in threads]
    assert not errors
    for i in range(4):
        out = pyckpt.load(_join(prefix, f"c{i}"), storage_options=so)
        assert out["i"] == i and np.array_equal(out["x"], trees[i]["x"])


def test_mmap_on_object_store_falls_back_to_a_copy(remote):
    prefix, so = remote
    pyckpt.save({"x": np.arange(10)}, _join(prefix, "m"), storage_options=so)
    out = pyckpt.load(_join(prefix, "m"), mmap=True, storage_options=so)
    np.testing.assert_array_equal(out["x"], np.arange(10))


def test_missing_and_resized_data_files_are_named_before_any_read(remote):
    # a checkpoint of several data files: their sizes are asked for all at once
    # (Store.sizes), and each missing or resized one is named with its byte range
    prefix, so = remote
    path = f"{prefix}/files"
    arrays = {f"w{i}": np.full(3 << 20, i, np.float32) for i in range(6)}  # 72 MiB
    pyckpt.save(arrays, path, storage_options=so)
    fs, root = fsspec.core.url_to_fs(path, **(so or {}))
    data = sorted(n for n in fs.ls(root, detail=False) if n.rsplit("/", 1)[-1].startswith("data-"))
    assert len(data) >= 2
    fs.rm(data[1])
    with pytest.raises(pyckpt.CorruptCheckpointError, match=r"data file '.*" +
                       data[1].rsplit("/", 1)[-1] + r"' is missing \(needed for bytes \[0, \d+\)\)"):
        pyckpt.load(path, storage_options=so)
    fs.pipe_file(data[1], b"short")
    with pytest.raises(pyckpt.CorruptCheckpointError, match=r"has 5 bytes, the index says \d+ "
                       r"\(bytes \[5, \d+\) differ"):
        pyckpt.load(path, storage_options=so)
