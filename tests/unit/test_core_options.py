"""The extension's entry points take named arguments and an options object
(issue 11), never long runs of positional literals."""

import numpy as np
import pytest

from pyckpt import _core


def test_options_are_keyword_constructed_with_named_fields():
    c = _core.ProgressCounter()
    r = _core.ReadOptions(chunk_size=4096, threads=2, verify=False, piece_size=8192,
                          max_gap=0, progress=c)
    assert (r.chunk_size, r.threads, r.verify, r.piece_size, r.max_gap) == (4096, 2, False, 8192, 0)
    assert r.progress is c
    r.progress = None
    assert r.progress is None
    w = _core.WriteOptions(sync=False)
    assert (w.chunk_size, w.threads, w.piece_size, w.sync, w.progress) == (1 << 20, 0, 8 << 20,
                                                                           False, None)
    with pytest.raises(TypeError):
        _core.ReadOptions(4096)            # keywords only
    with pytest.raises(TypeError):
        _core.WriteOptions(progress=3)     # a ProgressCounter or None


def test_entry_points_refuse_positional_arguments():
    with pytest.raises(TypeError):
        _core.compute_checksums(["a"], [np.zeros(3)])
    with pytest.raises(TypeError):
        _core.read_shards([], [], [], [], np.zeros(0, np.uint32), np.zeros(0, np.uint64),
                          np.zeros(0, np.uint64), np.zeros(0, np.uint32),
                          np.zeros(1, np.uint64), [])


def test_read_shards_verifies_with_its_options():
    data = np.arange(10_000, dtype=np.uint8)
    opts = _core.WriteOptions(chunk_size=4096)
    crcs, crc_begin = _core.compute_checksums(keys=["x"], arrays=[data], options=opts)
    assert len(crcs) == 3
    assert crcs[0] == _core.crc32c_mask(_core.crc32c(data[:4096].tobytes()))
    out = np.empty_like(data)
    counter = _core.ProgressCounter()
    kw = dict(names=["mem"], bases=[0], keys=["x"], sources=np.zeros(1, np.uint32),
              offsets=np.zeros(1, np.uint64), nbytes=np.array([data.nbytes], np.uint64),
              crcs=crcs, crc_begin=crc_begin, dsts=[out])
    _core.read_shards(buffers=[data.tobytes()], **kw,
                      options=_core.ReadOptions(chunk_size=4096, progress=counter))
    np.testing.assert_array_equal(out, data)
    assert counter.value == data.nbytes
    bad = bytearray(data.tobytes())
    bad[5000] ^= 1
    with pytest.raises(ValueError, match="mem"):
        _core.read_shards(buffers=[bytes(bad)], **kw, options=_core.ReadOptions(chunk_size=4096))
    _core.read_shards(buffers=[bytes(bad)], **kw,
                      options=_core.ReadOptions(chunk_size=4096, verify=False))
