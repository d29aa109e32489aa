"""Checkpoint.restore of TensorFlow checkpoints: objects matched through the object
graph TensorFlow stored (_CHECKPOINTABLE_OBJECT_GRAPH), as TensorFlow matches them."""

import os

import numpy as np
import pytest

import pyckpt


def V(shape, dtype):
    return pyckpt.Variable(np.zeros(shape, dtype=dtype))


def keras_net():
    # Keras 3 names the Dense kernel `_kernel`: a tracked dict entry (attributes
    # starting with `_` are not tracked by pyckpt.Trackable)
    return {"l1": {"_kernel": V((1, 5), np.float32), "bias": V((5,), np.float32)}}


def keras_adam():
    return {"_iterations": pyckpt.Variable(np.int64(0)),
            "_learning_rate": pyckpt.Variable(np.float32(0)),
            "_momentums": [V((1, 5), np.float32), V((5,), np.float32)],
            "_velocities": [V((1, 5), np.float32), V((5,), np.float32)]}


def test_training_guide_checkpoint(fixtures, tf_expected, same):
    want = tf_expected("training")["ckpt-5"]
    net, opt = keras_net(), keras_adam()
    ckpt = pyckpt.Checkpoint(step=pyckpt.Variable(np.int32(0)), net=net, optimizer=opt)
    status = ckpt.restore(os.path.join(fixtures, "training"))  # the directory: its latest
    status.assert_existing_objects_matched().assert_nontrivial_match()
    # the dataset iterator's state has no object here (and no numpy form)
    assert status.unmatched_checkpoint_keys() == ["iterator/.ATTRIBUTES/ITERATOR_STATE"]
    with pytest.raises(AssertionError, match="ITERATOR_STATE"):
        status.assert_consumed()
    status.expect_partial()
    assert int(ckpt.step) == 50 and int(ckpt.save_counter) == 5
    assert same(ckpt.net["l1"]["_kernel"].numpy(), want["net/l1/_kernel/.ATTRIBUTES/VARIABLE_VALUE"])
    assert same(ckpt.optimizer["_momentums"][1].numpy(),
                want["optimizer/_variables/4/.ATTRIBUTES/VARIABLE_VALUE"])  # the same object
    assert same(ckpt.optimizer["_velocities"][0].numpy(),
                want["optimizer/_variables/3/.ATTRIBUTES/VARIABLE_VALUE"])
    assert int(ckpt.optimizer["_iterations"]) == 49  # the step counter started at 1


def test_deferred_restore(fixtures, tf_expected, same):
    want = tf_expected("training")["ckpt-4"]
    ckpt = pyckpt.Checkpoint(step=pyckpt.Variable(np.int32(0)))
    status = ckpt.restore(os.path.join(fixtures, "training", "ckpt-4"))
    assert int(ckpt.step) == 40
    ckpt.net = keras_net()  # created later: restored the moment it is attached
    assert same(ckpt.net["l1"]["bias"].numpy(), want["net/l1/bias/.ATTRIBUTES/VARIABLE_VALUE"])
    with pytest.raises(AssertionError):
        status.assert_consumed()  # the optimizer is still pending
    ckpt.optimizer = keras_adam()
    assert int(ckpt.optimizer["_iterations"]) == 39
    assert status.unmatched_checkpoint_keys() == ["iterator/.ATTRIBUTES/ITERATOR_STATE"]


class Model(pyckpt.Module):
    pass


def mixed_model():
    m = Model()
    m.f16 = V((3, 4), np.float16)
    ml_dtypes = pytest.importorskip("ml_dtypes")
    m.bf16 = V((2, 5), ml_dtypes.bfloat16)
    m.i64 = V((3,), np.int64)
    m.c64 = V((2,), np.complex64)
    m.c128 = V((1, 1), np.complex128)
    m.u8 = V((7,), np.uint8)
    m.flag = V((3,), np.bool_)
    m.scalar = pyckpt.Variable(np.float64(0))
    m.empty = V((0, 3), np.float32)
    m.big = V((256, 1024), np.float32)
    m.words = np.empty((4,), dtype=object)
    m.layers = [V((2,), np.float32) for _ in range(3)]
    m.table = {"a.b": pyckpt.Variable(np.int32(0)), "c/d": pyckpt.Variable(np.int32(0)),
               "e./.f": {"g": pyckpt.Variable(np.int32(0))}, "plain": [pyckpt.Variable(np.int16(0))]}
    return m


def test_lists_dicts_and_escaped_names(fixtures, tf_expected, same):
    want = tf_expected("mixed")["ckpt-1"]
    m = mixed_model()
    ckpt = pyckpt.Checkpoint(model=m)
    ckpt.restore(os.path.join(fixtures, "mixed")).assert_consumed()
    assert int(m.table["a.b"]) == 1 and int(m.table["c/d"]) == 2
    assert int(m.table["e./.f"]["g"]) == 3 and int(m.table["plain"][0]) == 4
    assert same(m.big.numpy(), want["model/big/.ATTRIBUTES/VARIABLE_VALUE"])
    assert same(m.bf16.numpy(), want["model/bf16/.ATTRIBUTES/VARIABLE_VALUE"])
    assert m.words.tolist() == [b"", b"a", b"hello world", bytes(range(256)) * 3]
    assert [float(v.numpy()[0]) for v in m.layers] == [0.0, 1.0, 2.0]
    assert "model/table/a..b/.ATTRIBUTES/VARIABLE_VALUE" in want  # TensorFlow's escaping
    assert "model/table/e...S..f/g/.ATTRIBUTES/VARIABLE_VALUE" in want


def test_sharded_checkpoint_restores(fixtures, tf_expected, same):
    want = tf_expected("mixed")["ckpt-1"]
    m = mixed_model()
    status = pyckpt.Checkpoint(model=m).read(os.path.join(fixtures, "mixed", "sharded"))
    assert status.unmatched_objects() == ["model.empty"]  # left out by TensorFlow's sharding
    assert same(m.big.numpy(), want["model/big/.ATTRIBUTES/VARIABLE_VALUE"])


def test_shape_mismatch_names_the_key(fixtures):
    ckpt = pyckpt.Checkpoint(step=pyckpt.Variable(np.int64(0)))  # TensorFlow's is int32
    with pytest.raises(ValueError, match="step/.ATTRIBUTES/VARIABLE_VALUE"):
        ckpt.restore(os.path.join(fixtures, "training", "ckpt-3"))


def test_restore_plan_and_name_based_checkpoint(fixtures):
    ckpt = pyckpt.Checkpoint(dense={"kernel": V((4, 3), np.float32), "bias": V((3,), np.float32)})
    status = ckpt.read(os.path.join(fixtures, "tf1", "run_2"))  # TF1: keys are the graph
    status.assert_existing_objects_matched()
    assert "global_step" in status.unmatched_checkpoint_keys()
    plan = ckpt.restore_plan(os.path.join(fixtures, "training"))
    assert plan is not None
