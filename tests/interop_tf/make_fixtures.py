"""Writes the TensorFlow checkpoints under tests/interop_tf/fixtures/ with TensorFlow itself.

Run it (with tensorflow-cpu installed; pyckpt is not imported) to regenerate them:

    python tests/interop_tf/make_fixtures.py [OUT_DIR]

What it writes (each directory holds TensorFlow's own files and ``checkpoint``
state file, plus ``expected.npz``: the values TensorFlow read back, under keys
``<prefix name>:<checkpoint key>``, for the reading tests to compare against):

- ``training/``: the "Training checkpoints" guide: a Keras model with a Dense
  layer, Adam, a step counter and a dataset iterator, saved every 10 steps by a
  ``tf.train.CheckpointManager(max_to_keep=3)`` (ckpt-3, -4, -5 are kept);
- ``tf1/run_0..run_2``: three ``tf.compat.v1.train.Saver`` checkpoints of one graph
  (the same variables, different initial values: an ensemble);
- ``mixed/``: ``tf.train.Checkpoint`` of f16, bf16, i64, complex, unsigned and bool
  variables, a 1 MiB float32 array, lists and dicts whose keys hold ``.`` and
  ``/``, and a string variable (``mixed/ckpt-1``), and the same state written in
  2 data files (``mixed/sharded``, ``MaxShardSizePolicy``; its values are ckpt-1's);
- ``raw/``: bundles written by the SaveV2 op: every numeric dtype and string
  tensors (``raw/dtypes``), and a tensor saved as slices of a partitioned
  variable (``raw/sliced``).
"""

from __future__ import annotations

import os
import shutil
import sys

import numpy as np

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
import tensorflow as tf  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))


def read_back(prefix: str, name: str, out: dict) -> None:
    """Every tensor of prefix as TensorFlow's own reader returns it."""
    reader = tf.train.load_checkpoint(prefix)
    for key in reader.get_variable_to_shape_map():
        if key == "_CHECKPOINTABLE_OBJECT_GRAPH":
            continue
        try:
            value = reader.get_tensor(key)
        except Exception:  # variant tensors (the iterator's state) have no numpy form
            continue
        out[f"{name}:{key}"] = np.asarray(value)


# -- the training guide ----------------------------------------------------------------

class Net(tf.keras.Model):
    """A simple linear model (the guide's)."""

    def __init__(self):
        super().__init__()
        self.l1 = tf.keras.layers.Dense(5)

    def call(self, x):
        return self.l1(x)


def toy_dataset():
    inputs = tf.range(10.0)[:, None]
    labels = inputs * 5.0 + tf.range(5.0)[None, :]
    return tf.data.Dataset.from_tensor_slices(dict(x=inputs, y=labels)).repeat().batch(2)


def training(out: str, expected: dict) -> None:
    tf.keras.utils.set_random_seed(7)
    net = Net()
    opt = tf.keras.optimizers.Adam(0.1)
    iterator = iter(toy_dataset())
    ckpt = tf.train.Checkpoint(step=tf.Variable(1), optimizer=opt, net=net, iterator=iterator)
    manager = tf.train.CheckpointManager(ckpt, out, max_to_keep=3)

    @tf.function
    def train_step(example):
        with tf.GradientTape() as tape:
            output = net(example["x"])
            loss = tf.reduce_mean(tf.abs(output - example["y"]))
        variables = net.trainable_variables
        opt.apply_gradients(zip(tape.gradient(loss, variables), variables))
        return loss

    for _ in range(50):
        train_step(next(iterator))
        ckpt.step.assign_add(1)
        if int(ckpt.step) % 10 == 0:
            manager.save()
    for path in manager.checkpoints:
        read_back(path, os.path.basename(path), expected)


# -- TF1 Saver ensemble -------------------------------------------------------------------

def tf1_ensemble(out: str, expected: dict) -> None:
    v1 = tf.compat.v1
    for member in range(3):
        run = os.path.join(out, f"run_{member}")
        os.makedirs(run)
        with tf.Graph().as_default():
            v1.set_random_seed(100 + member)
            x = v1.placeholder(tf.float32, [None, 4])
            y = v1.placeholder(tf.float32, [None, 3])
            with v1.variable_scope("dense"):
                kernel = v1.get_variable("kernel", [4, 3])
                bias = v1.get_variable("bias", [3], initializer=v1.zeros_initializer())
            step = v1.train.get_or_create_global_step()
            loss = tf.reduce_mean(tf.square(tf.matmul(x, kernel) + bias - y))
            train = v1.train.AdamOptimizer(0.01).minimize(loss, global_step=step)
            saver = v1.train.Saver()
            with v1.Session() as sess:
                sess.run(v1.global_variables_initializer())
                rng = np.random.default_rng(member)
                for _ in range(5 + member):
                    sess.run(train, {x: rng.standard_normal((8, 4)), y: rng.standard_normal((8, 3))})
                path = saver.save(sess, os.path.join(run, "model.ckpt"), global_step=step)
        read_back(path, f"run_{member}/{os.path.basename(path)}", expected)


# -- mixed dtypes, containers with awkward names, strings, shards ---------------------------

def mixed_state() -> tf.Module:
    rng = np.random.default_rng(3)
    m = tf.Module()
    m.f16 = tf.Variable(rng.standard_normal((3, 4)).astype(np.float16))
    m.bf16 = tf.Variable(tf.constant(rng.standard_normal((2, 5)), dtype=tf.bfloat16))
    m.i64 = tf.Variable(np.array([-(2 ** 62), 0, 2 ** 62 + 5], dtype=np.int64))
    m.c64 = tf.Variable(np.array([1 + 2j, -3.5j], dtype=np.complex64))
    m.c128 = tf.Variable(np.array([[1e-300 + 1j]], dtype=np.complex128))
    m.u8 = tf.Variable(np.arange(7, dtype=np.uint8))
    m.flag = tf.Variable(np.array([True, False, True]))
    m.scalar = tf.Variable(np.float64(2.5))
    m.empty = tf.Variable(np.zeros((0, 3), dtype=np.float32))
    m.big = tf.Variable(rng.standard_normal((256, 1024)).astype(np.float32))
    m.words = tf.Variable(tf.constant([b"", b"a", b"hello world", bytes(range(256)) * 3]))
    m.layers = [tf.Variable(np.full((2,), i, dtype=np.float32)) for i in range(3)]
    m.table = {"a.b": tf.Variable(np.int32(1)), "c/d": tf.Variable(np.int32(2)),
               "e./.f": {"g": tf.Variable(np.int32(3))}, "plain": [tf.Variable(np.int16(4))]}
    return m


def mixed(out: str, expected: dict) -> None:
    m = mixed_state()
    ckpt = tf.train.Checkpoint(model=m)
    path = ckpt.save(os.path.join(out, "ckpt"))
    read_back(path, "ckpt-1", expected)
    # just below the largest variable plus a little: two data files, no variable split
    # into slices (a smaller size makes TensorFlow save `big` as slices of a partitioned
    # variable, which pyckpt refuses to read, like raw/sliced)
    policy = tf.train.experimental.MaxShardSizePolicy(max_shard_size=1_049_000)
    path = tf.train.Checkpoint(model=m).write(
        os.path.join(out, "sharded"), options=tf.train.CheckpointOptions(
            experimental_sharding_callback=policy))


def raw(out: str, expected: dict) -> None:
    tensors = {
        "f32": np.linspace(-1, 1, 6, dtype=np.float32).reshape(2, 3),
        "f64": np.array([np.pi, -0.0, np.inf], dtype=np.float64),
        "f16": np.array([1.5, -2.25], dtype=np.float16),
        "i8": np.array([-128, 127], dtype=np.int8),
        "i16": np.array([-32768, 32767], dtype=np.int16),
        "i32": np.array([[-(2 ** 31)], [2 ** 31 - 1]], dtype=np.int32),
        "i64": np.array(2 ** 63 - 1, dtype=np.int64),
        "u8": np.array([0, 255], dtype=np.uint8),
        "u16": np.array([0, 65535], dtype=np.uint16),
        "u32": np.array([0, 2 ** 32 - 1], dtype=np.uint32),
        "u64": np.array([0, 2 ** 64 - 1], dtype=np.uint64),
        "bool": np.array([[True], [False]]),
        "c64": np.array([1 - 1j], dtype=np.complex64),
        "c128": np.array([2 + 0.5j, 0j], dtype=np.complex128),
        "empty": np.zeros((2, 0), dtype=np.float32),
    }
    names = sorted(tensors)
    values = [tf.constant(tensors[n]) for n in names]
    values.append(tf.constant(np.arange(4, dtype=np.float32), dtype=tf.bfloat16))
    names.append("bf16")
    values.append(tf.constant([[b"x", b""], [b"longer string " * 20, b"\x00\xff"]]))
    names.append("strings")
    values.append(tf.constant(b"a scalar string"))
    names.append("string_scalar")
    values.append(tf.constant(np.zeros((0,), dtype=object).astype(bytes), dtype=tf.string))
    names.append("string_empty")
    prefix = os.path.join(out, "dtypes")
    tf.raw_ops.SaveV2(prefix=prefix, tensor_names=names, shape_and_slices=[""] * len(names),
                      tensors=values)
    read_back(prefix, "dtypes", expected)

    # a partitioned variable saved as two slices, beside a plain tensor
    full = np.arange(8, dtype=np.float32).reshape(4, 2)
    prefix = os.path.join(out, "sliced")
    tf.raw_ops.SaveV2(prefix=prefix, tensor_names=["part", "part", "plain"],
                      shape_and_slices=["4 2 0,2:-", "4 2 2,2:-", ""],
                      tensors=[full[:2], full[2:], np.float32(1)])
    read_back(prefix, "sliced", expected)


def main() -> None:
    out = sys.argv[1] if len(sys.argv) > 1 else os.path.join(HERE, "fixtures")
    if os.path.exists(out):
        shutil.rmtree(out)
    for name, make in [("training", training), ("tf1", tf1_ensemble), ("mixed", mixed),
                       ("raw", raw)]:
        d = os.path.join(out, name)
        os.makedirs(d, exist_ok=True)
        expected: dict = {}
        make(d, expected)
        np.savez(os.path.join(d, "expected.npz"), **expected)
    total = sum(os.path.getsize(os.path.join(r, f)) for r, _, fs in os.walk(out) for f in fs)
    print(f"wrote {out}: {total / 2 ** 20:.2f} MiB (TensorFlow {tf.__version__})")


if __name__ == "__main__":
    main()
