"""snapshot()'s new device buffers (issue 40 item 4): ``_snapshot_buffers`` asks each
engine once for all the buffers it needs (``CopyEngine.empties_like``), without a
look at each key when there is no ``into`` and one engine."""

import numpy as np

from pyckpt.device.array import DeviceArray
from pyckpt.device.buffers import PinnedPool
from pyckpt.device.engine import HostCopyEngine
from pyckpt.graph import snapshot as snapshot_mod


class _Engine(HostCopyEngine):
    """A host engine that records what each ``empties_like`` / ``empty_like`` call got."""

    def __init__(self):
        super().__init__()
        self.batches, self.singles = [], []

    def empties_like(self, srcs):
        self.batches.append(list(srcs))
        return super().empties_like(srcs)

    def empty_like(self, src):
        self.singles.append(src)
        return super().empty_like(src)


def _values(engine, n, seed=0):
    rng = np.random.default_rng(seed)
    arrays = [rng.standard_normal((i + 1, 2)).astype(np.float32) for i in range(n)]
    return [DeviceArray(a, a.shape, a.dtype, "host", engine) for a in arrays]


def test_new_buffers_are_one_empties_like_call_per_engine():
    eng, other = _Engine(), _Engine()
    srcs = _values(eng, 3) + _values(other, 2) + [np.zeros(4, np.float32)]
    keys = [f"k{i}" for i in range(len(srcs))]
    out = snapshot_mod._snapshot_buffers(keys, srcs, None, False, PinnedPool())
    assert [len(b) for b in eng.batches] == [3] and [len(b) for b in other.batches] == [2]
    assert eng.batches[0] == srcs[:3] and other.batches[0] == srcs[3:5]
    for s, d in zip(srcs, out):
        assert d is not s and d.shape == s.shape and d.dtype == s.dtype
        assert type(d) is type(s)
    assert out[0].engine is eng and out[4].engine is other


def test_one_engine_without_into_skips_the_per_key_loop():
    eng = _Engine()
    srcs = _values(eng, 4)
    out = snapshot_mod._snapshot_buffers([f"k{i}" for i in range(4)], srcs, None, False,
                                         PinnedPool())
    assert len(eng.batches) == 1 and len(eng.singles) == 4 and len(out) == 4

