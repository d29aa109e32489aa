"""Run directories holding TensorFlow checkpoints (run_directory.py): the step scanner,
deletion of TensorFlow's files, and a CheckpointManager adopting a directory that
tf.train.CheckpointManager wrote."""

import os

import numpy as np
import pytest

import pyckpt
from pyckpt import run_directory
from pyckpt.storage import resolve


def test_committed_steps_and_recovery(fixture_copy):
    d = fixture_copy("training")
    store, p = resolve(d)
    assert run_directory.committed_steps(store, p, "ckpt") == {}
    assert run_directory.committed_steps(store, p, "ckpt", tensorflow=True) == \
        {"ckpt-3": 3, "ckpt-4": 4, "ckpt-5": 5}
    state = run_directory.recover_state(store, p, "ckpt", tensorflow=True)
    assert [e.name for e in state.active] == ["ckpt-3", "ckpt-4", "ckpt-5"]
    assert run_directory.is_tensorflow(store, p, "ckpt-4")
    assert [os.path.basename(f) for f in run_directory.tensorflow_files(store, p, "ckpt-4")] == \
        ["ckpt-4.index", "ckpt-4.data-00000-of-00001"]


def test_delete_checkpoint_removes_tensorflow_files_index_first(fixture_copy, tmp_path):
    d = fixture_copy("training")
    store, p = resolve(d)
    run_directory.delete_checkpoint(store, p, "ckpt-3")
    assert not [f for f in os.listdir(d) if f.startswith("ckpt-3.")]
    assert sorted(f for f in os.listdir(d) if f.startswith("ckpt-4.")) == \
        ["ckpt-4.data-00000-of-00001", "ckpt-4.index"]
    # an interrupted deletion (index gone, data left) is finished by a second call
    os.remove(os.path.join(d, "ckpt-4.index"))
    run_directory.delete_checkpoint(store, p, "ckpt-4")
    assert not [f for f in os.listdir(d) if f.startswith("ckpt-4.")]
    with pytest.raises(ValueError):
        run_directory.delete_checkpoint(store, p, "../ckpt-5")
    # pyckpt checkpoints and TF1 .meta files
    pyckpt.save({"x": np.ones(3)}, os.path.join(d, "ckpt-9"))
    run_directory.delete_checkpoint(store, p, "ckpt-9")
    assert not os.path.exists(os.path.join(d, "ckpt-9"))
    t = fixture_copy("tf1")
    store, p = resolve(os.path.join(t, "run_0"))
    run_directory.delete_checkpoint(store, p, "model.ckpt-5")
    assert os.listdir(os.path.join(t, "run_0")) == ["checkpoint"]


def test_manager_adopts_a_tensorflow_run(fixture_copy, tf_expected, same):
    """tf.train.CheckpointManager(max_to_keep=3) wrote ckpt-3..5: a pyckpt manager sees
    them, restores the latest, saves ckpt-6 in pyckpt's format and retires the oldest
    TensorFlow checkpoint (all its files)."""
    d = fixture_copy("training")
    net = {"l1": {"_kernel": pyckpt.Variable(np.zeros((1, 5), np.float32)),
                  "bias": pyckpt.Variable(np.zeros(5, np.float32))}}
    ckpt = pyckpt.Checkpoint(step=pyckpt.Variable(np.int32(0)), net=net)
    manager = pyckpt.CheckpointManager(ckpt, d, max_to_keep=3)
    assert manager.checkpoints == [os.path.join(d, f"ckpt-{n}") for n in (3, 4, 5)]
    assert manager.latest_checkpoint == os.path.join(d, "ckpt-5")
    restored = manager.restore_or_initialize()  # the iterator's state stays unmatched
    assert restored == os.path.join(d, "ckpt-5") and int(ckpt.step) == 50
    want = tf_expected("training")["ckpt-5"]
    assert same(net["l1"]["bias"].numpy(), want["net/l1/bias/.ATTRIBUTES/VARIABLE_VALUE"])
    path = manager.save()
    assert path == os.path.join(d, "ckpt-6")
    assert pyckpt.load_checkpoint(path).source.format == "pyckpt"
    assert manager.checkpoints == [os.path.join(d, f"ckpt-{n}") for n in (4, 5, 6)]
    assert not [f for f in os.listdir(d) if f.startswith("ckpt-3")]
    assert pyckpt.latest_checkpoint(d) == path
    again = pyckpt.CheckpointManager(pyckpt.Checkpoint(), d, max_to_keep=3)
    assert again.checkpoints == manager.checkpoints
