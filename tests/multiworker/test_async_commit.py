"""Async multi-worker manager saves with real processes (torchrun, gloo,
docs/PROTOCOL.md section 6b): the background commit goes through the store and
never collides with the training job's own collectives."""

import os
import pathlib

import numpy as np

import pyckpt
from pyckpt.testing.launch import run_workers

WORKERS = pathlib.Path(__file__).with_name("async_workers.py")


def launch(scenario, directory, n=4, timeout=240):
    return run_workers(WORKERS, [scenario, directory], n=n, timeout=timeout)


def _value(reader, suffix):
    keys = [k for k in reader.keys() if k.endswith(suffix)]
    assert len(keys) == 1, (suffix, reader.keys())
    return reader.get_tensor(keys[0])


def test_async_saves_beside_the_jobs_collectives_then_restore(tmp_path):
    directory = str(tmp_path / "run")
    results, r = launch("train", directory)
    assert sorted(results) == [0, 1, 2, 3], r.stdout + r.stderr[-3000:]
    for rank, text in results.items():
        assert text.startswith("ok ckpt-2,ckpt-3,ckpt-4 "), (rank, text)
    assert sorted(n for n in os.listdir(directory) if n.startswith("ckpt-")) == \
        ["ckpt-2", "ckpt-3", "ckpt-4"]
    for n in (2, 3, 4):  # each checkpoint holds the values at its save() call
        path = os.path.join(directory, f"ckpt-{n}")
        step = 3 * n
        reader = pyckpt.load_checkpoint(path)
        reader.verify()
        assert (_value(reader, "model/weight/.ATTRIBUTES/VARIABLE_VALUE") == step).all()
        assert (_value(reader, "model/bias/.ATTRIBUTES/VARIABLE_VALUE") == -step).all()
        own = _value(reader, "own/per_worker/.ATTRIBUTES/VARIABLE_VALUE")
        np.testing.assert_array_equal(own, np.repeat(step * 10 + np.arange(4.0), 1000)
                                      .reshape(4, 1000))
        assert int(_value(reader, "step/.ATTRIBUTES/VARIABLE_VALUE")) == step
        assert sorted(set(os.listdir(path)) - {"pyckpt.index"}) == \
            sorted(f.name for f in reader._ck.manifest.files)  # nothing else left behind
    assert pyckpt.latest_checkpoint(directory) == os.path.join(directory, "ckpt-4")


def test_a_failed_background_write_raises_on_every_worker(tmp_path):
    directory = str(tmp_path / "run")
    results, r = launch("fail", directory)
    assert results == {k: "ok ckpt-1,ckpt-2" for k in range(4)}, r.stdout + r.stderr[-3000:]
    assert sorted(os.listdir(directory)) == ["ckpt-1", "ckpt-2", "pyckpt-manager.json"]
    reader = pyckpt.load_checkpoint(os.path.join(directory, "ckpt-2"))
    reader.verify()
    assert int(_value(reader, "step/.ATTRIBUTES/VARIABLE_VALUE")) == 3
