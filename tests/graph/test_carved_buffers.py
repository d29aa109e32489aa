"""snapshot()'s new device buffers (issue 40 item 4): ``_snapshot_buffers`` asks each
engine once for all the buffers it needs (``CopyEngine.empties_like``), and torch's
engines carve them out of one allocation per dtype (``torch_device.carve_empties``):
each a view of new memory, shared with no source, aligned, shaped as its source.
(CUDA: tests/gpu/test_device_objects.py.)"""

import numpy as np
import pytest

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


torch = pytest.importorskip("torch")
from pyckpt.adapters import torch_device as td  # noqa: E402


def _torch_values(eng, tensors):
    return [DeviceArray.trusted(t, tuple(t.shape), np.dtype(str(t.dtype).split(".")[1]), "cpu",
                                eng) for t in tensors]


def test_carve_empties_one_allocation_per_dtype_aligned_and_new():
    eng = HostCopyEngine()
    tensors = [torch.ones(3, 5), torch.ones(7, dtype=torch.float64), torch.ones(()),
               torch.ones(0, 4), torch.ones(2, 2, dtype=torch.float64), torch.ones(33)]
    out = td.carve_empties(torch, _torch_values(eng, tensors), eng)
    bases = {}
    spans = []
    for t, d in zip(tensors, out):
        v = d.obj
        assert v.shape == t.shape and v.dtype == t.dtype and v.is_contiguous()
        assert d.engine is eng and d.shape == tuple(t.shape)
        assert v.numel() == 0 or (v.data_ptr() - v.untyped_storage().data_ptr()) % td.CARVE_ALIGN == 0
        bases.setdefault(v.dtype, set()).add(v.untyped_storage().data_ptr())
        if v.numel():
            spans.append((v.data_ptr(), v.data_ptr() + v.nbytes))
        assert v.untyped_storage().data_ptr() != t.untyped_storage().data_ptr()
    assert all(len(b) == 1 for b in bases.values()) and len(bases) == 2  # one per dtype
    spans.sort()
    assert all(a[1] <= b[0] for a, b in zip(spans, spans[1:]))  # no two overlap
    for d in out:
        d.obj.fill_(2)
    assert all(bool((t == 1).all()) for t in tensors)  # the sources are untouched


def test_carve_empties_of_non_contiguous_sources_are_contiguous_tensors_of_their_own():
    eng = HostCopyEngine()
    tensors = [torch.ones(4, 6)[:, ::2], torch.ones(3, 4).t()]
    out = td.carve_empties(torch, _torch_values(eng, tensors), eng)
    for t, d in zip(tensors, out):
        assert d.obj.shape == t.shape and d.obj.is_contiguous()
    assert out[0].obj.untyped_storage().data_ptr() != out[1].obj.untyped_storage().data_ptr()
