"""Incremental CheckpointManager runs on object stores (memory://, SeaweedFS and moto
over S3, the GCS emulator): references between objects, retention that holds
referenced objects, self-contained copies, tampering."""

import numpy as np
import pytest

import pyckpt
from pyckpt.engine.copy import copy_checkpoint
from pyckpt.engine.reader import open_checkpoint
from pyckpt.storage import resolve


def _model():
    rng = np.random.default_rng(3)
    return pyckpt.Checkpoint(step=pyckpt.Variable(np.int64(0)),
                             frozen=pyckpt.Variable(rng.standard_normal((256, 256))),
                             head=pyckpt.Variable(np.zeros(100)))


def _step(ck, s):
    ck.step.assign(s)
    ck.head.assign(np.full(100, float(s)))


def _restored(path, so):
    ck = _model()
    ck.head.assign(np.zeros(100))
    ck.frozen.assign(np.zeros((256, 256)))
    ck.restore(path, storage_options=so).assert_consumed()
    return int(ck.step), ck.frozen.numpy().copy(), ck.head.numpy().copy()


def test_incremental_run_on_a_bucket(remote, tmp_path):
    url, so = remote
    run = f"{url}/run"
    ck = _model()
    frozen = ck.frozen.numpy().copy()
    m = pyckpt.CheckpointManager(ck, run, max_to_keep=2, storage_options=so, incremental=True)
    for s in range(1, 6):
        _step(ck, s)
        m.save(blocking=s % 2 == 1)
        m.wait_until_finished()
    store, root = resolve(run, so)
    names = sorted(store.listdir(root))
    assert "ckpt-1" in names  # retired, but its data is referenced: held
    assert not store.exists(store.join(root, "ckpt-1", "pyckpt.index"))
    for p in m.checkpoints:
        man = open_checkpoint(p, so).manifest
        own, ref = man.own_and_referenced_bytes()
        assert ref == frozen.nbytes and own < 2000 and man.version == 2
        step, f, h = _restored(p, so)
        assert f.tobytes() == frozen.tobytes() and (h == step).all()
        pyckpt.load_checkpoint(p, storage_options=so).verify()
    # a self-contained copy to local disk
    copy = tmp_path / "copy"
    copy_checkpoint(m.latest_checkpoint, str(copy), src_options=so)
    assert not open_checkpoint(str(copy)).manifest.has_references
    assert _restored(str(copy), None)[0] == 5
    # tampering: the referenced object disappears
    data = [n for n in store.listdir(store.join(root, "ckpt-1")) if n.startswith("data-")]
    store.delete([store.join(root, "ckpt-1", data[0])])
    with pytest.raises(pyckpt.CorruptCheckpointError, match=data[0]):
        pyckpt.load(m.latest_checkpoint, storage_options=so)
    m.close()
