"""The TensorFlow "Training checkpoints" guide, step by step, with numpy.

A lazily built Dense layer in a Module, an Adam optimizer whose slot variables
are created on first use, and a dataset iterator whose position is
checkpointed; CheckpointManager(max_to_keep=3) saves every 10 steps. The run
is interrupted after 50 steps and resumed into fresh objects; the result must
equal an uninterrupted run bit for bit.

Issue 14 adds what a real run also has: the iterator is a plain object with
``state_dict()`` / ``load_state_dict()`` (its position, epoch and shuffling
generator's state, numbers kept as numbers), and the step is random (a dropout
mask from numpy's global generator, input noise from a ``np.random.Generator``):
``pyckpt.GlobalRNG()`` and the generator are in the checkpoint.
"""

import numpy as np

import pyckpt


class Dense(pyckpt.Module):
    def __init__(self, units):
        self.units = units

    def __call__(self, x):
        if "kernel" not in self.__dict__:  # built lazily, on the first call
            rng = np.random.default_rng(42)
            self.kernel = pyckpt.Variable(rng.standard_normal((x.shape[1], self.units)))
            self.bias = pyckpt.Variable(np.zeros(self.units))
        return x @ self.kernel.numpy() + self.bias.numpy()


class Net(pyckpt.Module):
    def __init__(self):
        self.l1 = Dense(5)

    def __call__(self, x):
        return self.l1(x)


class Adam(pyckpt.Trackable):
    """Adam with slot variables created lazily, one per trained variable."""

    def __init__(self, lr=0.1, b1=0.9, b2=0.999, eps=1e-7):
        self._hyper = (lr, b1, b2, eps)
        self.iterations = pyckpt.Variable(np.int64(0))
        self.m = []
        self.v = []

    def apply(self, grads, variables):
        lr, b1, b2, eps = self._hyper
        while len(self.m) < len(variables):  # slots appear on first use
            var = variables[len(self.m)]
            self.m.append(pyckpt.Variable(np.zeros(var.shape)))
            self.v.append(pyckpt.Variable(np.zeros(var.shape)))
        self.iterations.assign_add(1)
        t = int(self.iterations)
        for g, var, m, v in zip(grads, variables, self.m, self.v):
            m.assign(b1 * m.numpy() + (1 - b1) * g)
            v.assign(b2 * v.numpy() + (1 - b2) * g * g)
            mhat = m.numpy() / (1 - b1 ** t)
            vhat = v.numpy() / (1 - b2 ** t)
            var.assign(var.numpy() - lr * mhat / (np.sqrt(vhat) + eps))


class Iterator:
    """The guide's toy dataset (x = 0..9, y = 5x + [0..4]), repeated, batches of 2,
    in an order shuffled anew each epoch; a plain object with a state dict."""

    def __init__(self):
        self.position, self.epoch = 0, 0
        self._rng = np.random.default_rng(7)
        self._order = self._rng.permutation(5)
        self._x = np.arange(10.0)[:, None]
        self._y = self._x * 5 + np.arange(5.0)[None, :]

    def __next__(self):
        if self.position == 5:
            self.position, self.epoch = 0, self.epoch + 1
            self._order = self._rng.permutation(5)
        i = int(self._order[self.position])
        self.position += 1
        return self._x[2 * i:2 * i + 2], self._y[2 * i:2 * i + 2]

    def state_dict(self):
        return {"position": self.position, "epoch": self.epoch, "order": self._order.copy(),
                "rng": self._rng.bit_generator.state}  # PCG64: 128-bit integers

    def load_state_dict(self, sd):
        assert type(sd["position"]) is int and type(sd["epoch"]) is int
        self.position, self.epoch = sd["position"], sd["epoch"]
        self._order = sd["order"].copy()
        self._rng.bit_generator.state = sd["rng"]


def train_step(net, opt, batch, noise):
    x, y = batch
    x = x + noise.normal(0, 0.01, x.shape)  # input noise from the checkpointed Generator
    out = net(x)
    d = np.sign(out - y) / out.size  # gradient of the mean absolute error
    d = d * (np.random.random(d.shape) > 0.2) / 0.8  # dropout, from numpy's global state
    opt.apply([x.T @ d, d.sum(0)], [net.l1.kernel, net.l1.bias])
    return np.abs(out - y).mean()


def make():
    net, opt, it = Net(), Adam(0.1), Iterator()
    ckpt = pyckpt.Checkpoint(step=pyckpt.Variable(np.int64(1)), optimizer=opt, net=net, iterator=it,
                             noise=np.random.default_rng(3), rng=pyckpt.GlobalRNG())
    return ckpt


def train_and_checkpoint(ckpt, manager, log):
    restored = manager.restore_or_initialize()
    log.append(f"restored from {restored}" if restored else "initializing from scratch")
    for _ in range(50):
        train_step(ckpt.net, ckpt.optimizer, next(ckpt.iterator), ckpt.noise)
        ckpt.step.assign_add(1)
        if int(ckpt.step) % 10 == 0:
            log.append(manager.save())


def test_guide_interrupted_run_equals_uninterrupted(tmp_path):
    d = tmp_path / "tf_ckpts"
    log = []
    np.random.seed(0)
    first = make()
    manager = pyckpt.CheckpointManager(first, d, max_to_keep=3)
    train_and_checkpoint(first, manager, log)
    assert log[0] == "initializing from scratch"
    assert log[1:] == [str(d / f"ckpt-{i}") for i in range(1, 6)]
    assert manager.checkpoints == [str(d / f"ckpt-{i}") for i in (3, 4, 5)]
    assert sorted(p.name for p in d.iterdir() if p.name.startswith("ckpt-")) == ["ckpt-3", "ckpt-4", "ckpt-5"]

    # A new program: fresh objects (nothing built yet), a new manager on the same directory.
    log = []
    np.random.seed(12345)  # a new program: another global random state, until restored
    second = make()
    manager = pyckpt.CheckpointManager(second, d, max_to_keep=3)
    assert manager.checkpoints == [str(d / f"ckpt-{i}") for i in (3, 4, 5)]
    train_and_checkpoint(second, manager, log)
    assert log[0] == f"restored from {d / 'ckpt-5'}"
    assert log[1:] == [str(d / f"ckpt-{i}") for i in range(6, 11)]
    assert manager.checkpoints == [str(d / f"ckpt-{i}") for i in (8, 9, 10)]

    # Without the interruption: the first run's 50th step came after its last save
    # (at step 50), so the resumed run trained 49 + 50 steps.
    after_second = np.random.random()
    np.random.seed(0)
    straight = make()
    for _ in range(99):
        train_step(straight.net, straight.optimizer, next(straight.iterator), straight.noise)
        straight.step.assign_add(1)
    for a, b in [(second.net.l1.kernel, straight.net.l1.kernel),
                 (second.net.l1.bias, straight.net.l1.bias),
                 (second.optimizer.iterations, straight.optimizer.iterations),
                 (second.step, straight.step)] + list(zip(second.optimizer.m, straight.optimizer.m)) \
            + list(zip(second.optimizer.v, straight.optimizer.v)):
        assert a.numpy().tobytes() == b.numpy().tobytes()
    assert (second.iterator.position, second.iterator.epoch) == \
        (straight.iterator.position, straight.iterator.epoch)
    assert second.noise.random() == straight.noise.random()
    assert np.random.random() == after_second  # the global random state too
    assert int(second.step) == 100 and int(second.save_counter) == 10

    # And the latest checkpoint restores everything into yet another fresh program.
    third = make()
    status = third.restore(pyckpt.latest_checkpoint(d))
    train_step(third.net, third.optimizer, next(third.iterator), third.noise)  # builds layer + slots
    status.assert_consumed()
