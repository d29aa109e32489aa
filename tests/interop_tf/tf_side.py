"""The TensorFlow side of the writing tests: run in its own process (never beside
torch or pyckpt), it reads what pyckpt wrote with TensorFlow's own API and prints
one JSON line with what it found. Usage:

    python tf_side.py read PREFIX EXPECTED.npz
    python tf_side.py restore-mixed PREFIX EXPECTED.npz
    python tf_side.py restore-tree PREFIX EXPECTED.npz
    python tf_side.py restore-guide PREFIX EXPECTED.npz
    python tf_side.py latest DIRECTORY

``EXPECTED.npz`` holds the values pyckpt wrote, by checkpoint key (``bfloat16``
values as uint16, strings as object arrays).
"""

from __future__ import annotations

import json
import os
import sys

import numpy as np

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
import tensorflow as tf  # noqa: E402


def load_expected(path: str) -> dict[str, np.ndarray]:
    with np.load(path, allow_pickle=True) as z:
        return {k: z[k] for k in z.files}


def same(got, want) -> bool:
    got = np.asarray(got)
    if want.dtype == object or got.dtype == object:
        return got.shape == want.shape and \
            [bytes(x) for x in got.reshape(-1)] == [bytes(x) for x in want.reshape(-1)]
    if got.dtype.name == "bfloat16":
        got = got.view(np.uint16)
    return got.shape == want.shape and got.dtype == want.dtype and \
        np.ascontiguousarray(got).tobytes() == np.ascontiguousarray(want).tobytes()


def read(prefix: str, expected_path: str) -> dict:
    """tf.train.load_checkpoint + get_tensor of every key: dtypes, shapes and values."""
    want = load_expected(expected_path)
    reader = tf.train.load_checkpoint(prefix)
    shapes = reader.get_variable_to_shape_map()
    dtypes = reader.get_variable_to_dtype_map()
    bad = []
    for key, value in want.items():
        got = reader.get_tensor(key)
        if dtypes[key] == tf.string:
            got = np.asarray(got, dtype=object)
        if tuple(shapes[key]) != value.shape or not same(got, value):
            bad.append(key)
    extra = sorted(set(shapes) - set(want) - {"_CHECKPOINTABLE_OBJECT_GRAPH"})
    return {"checked": len(want), "bad": bad, "extra": extra,
            "object_graph": "_CHECKPOINTABLE_OBJECT_GRAPH" in shapes}


def mixed_module() -> tf.Module:
    """The structure of tests/interop_tf/test_write_tf.py's pyckpt model."""
    m = tf.Module()
    m.w = tf.Variable(np.zeros((3, 4), np.float32))
    m.half = tf.Variable(np.zeros((2,), np.float16))
    m.bf = tf.Variable(tf.zeros((2, 2), tf.bfloat16))
    m.steps = tf.Variable(np.int64(0))
    m.flags = tf.Variable(np.zeros((3,), bool))
    m.z = tf.Variable(np.zeros((2,), np.complex128))
    m.layers = [tf.Variable(np.zeros((2,), np.float32)) for _ in range(3)]
    m.table = {"a.b": tf.Variable(np.int32(0)), "c/d": tf.Variable(np.int32(0)),
               "nested": {"x": tf.Variable(np.zeros((1,), np.float64))}}
    m.child = tf.Module()
    m.child.v = tf.Variable(np.zeros((5,), np.int8))
    m.shared = m.child.v  # the same object under two names
    return m


def restore_mixed(prefix: str, expected_path: str) -> dict:
    """tf.train.Checkpoint(...).restore(...).assert_consumed() into mirrored objects."""
    want = load_expected(expected_path)
    m = mixed_module()
    ckpt = tf.train.Checkpoint(model=m)
    ckpt.restore(prefix).assert_consumed()
    got = {
        "model/w": m.w, "model/half": m.half, "model/bf": m.bf, "model/steps": m.steps,
        "model/flags": m.flags, "model/z": m.z, "model/layers/0": m.layers[0],
        "model/layers/2": m.layers[2], "model/table/a..b": m.table["a.b"],
        "model/table/c.Sd": m.table["c/d"], "model/table/nested/x": m.table["nested"]["x"],
        "save_counter": ckpt.save_counter,
    }
    # an object reachable twice is stored once, under its first breadth-first path
    shared = "model/shared" if "model/shared/.ATTRIBUTES/VARIABLE_VALUE" in want else "model/child/v"
    got[shared] = m.child.v
    bad = [k for k, v in got.items()
           if not same(v.numpy(), want[k + "/.ATTRIBUTES/VARIABLE_VALUE"])]
    return {"bad": bad, "save_counter": int(ckpt.save_counter), "checked": len(got)}


def restore_tree(prefix: str, expected_path: str) -> dict:
    """A tree written with object_graph=True restores into tf.train.Checkpoint(**tree)."""
    want = load_expected(expected_path)
    enc = {"w": tf.Variable(np.zeros((4, 4), np.float32)),
           "layers": [tf.Variable(np.zeros((2,), np.float64)), tf.Variable(np.zeros((), np.int64))]}
    ckpt = tf.train.Checkpoint(encoder=enc, step=tf.Variable(np.int64(0)))
    ckpt.read(prefix).assert_consumed()  # read: the tree has no save_counter
    got = {"encoder/w": ckpt.encoder["w"], "encoder/layers/0": ckpt.encoder["layers"][0],
           "encoder/layers/1": ckpt.encoder["layers"][1], "step": ckpt.step}
    bad = [k for k, v in got.items() if not same(v.numpy(), want[k])]
    return {"bad": bad, "checked": len(got)}


class Net(tf.keras.Model):
    def __init__(self):
        super().__init__()
        self.l1 = tf.keras.layers.Dense(5)

    def call(self, x):
        return self.l1(x)


def restore_guide(prefix: str, expected_path: str) -> dict:
    """The training guide's objects restored from a checkpoint pyckpt converted."""
    want = load_expected(expected_path)
    net = Net()
    net(tf.zeros((1, 1)))
    opt = tf.keras.optimizers.Adam(0.1)
    opt.build(net.trainable_variables)
    ckpt = tf.train.Checkpoint(step=tf.Variable(1), optimizer=opt, net=net)
    status = ckpt.restore(prefix)
    status.assert_existing_objects_matched()
    got = {"net/l1/_kernel": net.l1.kernel, "net/l1/bias": net.l1.bias, "step": ckpt.step,
           "optimizer/_iterations": opt.iterations, "save_counter": ckpt.save_counter,
           "optimizer/_variables/2": opt.variables[2], "optimizer/_variables/5": opt.variables[5]}
    bad = [k for k, v in got.items()
           if not same(v.numpy(), want[k + "/.ATTRIBUTES/VARIABLE_VALUE"])]
    return {"bad": bad, "checked": len(got)}


def latest(directory: str) -> dict:
    manager = tf.train.CheckpointManager(tf.train.Checkpoint(), directory, max_to_keep=10)
    return {"latest": tf.train.latest_checkpoint(directory),
            "manager_latest": manager.latest_checkpoint, "checkpoints": manager.checkpoints}


def main() -> None:
    command, args = sys.argv[1], sys.argv[2:]
    fn = {"read": read, "restore-mixed": restore_mixed, "restore-tree": restore_tree,
          "restore-guide": restore_guide, "latest": latest}[command]
    print(json.dumps(fn(*args)))


if __name__ == "__main__":
    main()
