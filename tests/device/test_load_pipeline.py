"""The load pipeline of ``device/loading.py``: reader threads fill several pinned
bounce buffers while the calling thread issues each batch's copies, one ticket per
batch; copies land late and shuffled (LateCopyEngine), which the values check."""

from __future__ import annotations

import contextvars
import threading
import time

import numpy as np
import pytest

import pyckpt
from pyckpt.device import DeviceArray, loading
from pyckpt.device.engine import HostCopyEngine
from pyckpt.testing.late_copies import LateCopyEngine

from .conftest import FakeTensor


class Recording(LateCopyEngine):
    """A LateCopyEngine that keeps each batch's ticket and what it allocated."""

    def __init__(self, delay: float = 0.05, seed: int = 3) -> None:
        super().__init__(delay=delay, seed=seed)
        self.batch_tickets: list = []
        self.allocated: list[int] = []
        self.freed = 0
        self.in_flight_at_free: list[int] = []

    def to_device_batch(self, srcs, dsts):
        t = super().to_device_batch(srcs, dsts)
        with self._lock:
            self.batch_tickets.append(t)
        return t

    def in_flight(self) -> int:
        with self._lock:
            return sum(not t.done() for t in self.batch_tickets)

    def alloc_host(self, nbytes):
        self.allocated.append(int(nbytes))
        return super().alloc_host(nbytes)

    def free_host(self, buf):
        self.freed += 1
        self.in_flight_at_free.append(self.in_flight())


class Interrupted(BaseException):
    """Stands for KeyboardInterrupt (which pytest would take as the user's)."""


def _settings(monkeypatch, batch, buffers, readers=2):
    monkeypatch.setattr(loading, "BATCH_BYTES", batch)
    monkeypatch.setattr(loading, "BUFFERS", buffers)
    monkeypatch.setattr(loading, "READERS", readers)
    for name in ("PYCKPT_LOAD_BATCH_MB", "PYCKPT_LOAD_BUFFERS", "PYCKPT_LOAD_READERS"):
        monkeypatch.delenv(name, raising=False)


def _arrays(n, size=256, seed=0):
    rng = np.random.default_rng(seed)
    return [rng.standard_normal(size // 4).astype(np.float32) for _ in range(n)]


def _reader(arrays, engine=None, log=None, fail_at=None):
    """A read_host that copies ``arrays[i]`` (verified, as far as the test goes) and logs
    each batch's first index with the batches in flight when its read started."""
    def read_host(indices, views):
        if log is not None:
            log.append((indices[0], engine.in_flight()))
        if fail_at is not None and fail_at in indices:
            raise pyckpt.CorruptCheckpointError(f"tensor 't{fail_at}': bytes [0, 256) bad")
        for i, v in zip(indices, views):
            v[...] = arrays[i]
    return read_host


def _loader_threads():
    return [t for t in threading.enumerate() if t.name.startswith("pyckpt-load")]


@pytest.fixture(autouse=True)
def _release():
    yield
    pyckpt.device.release_staging_memory()


def test_reads_run_ahead_of_the_copies_up_to_the_buffers(monkeypatch):
    """Batch k+1 (and later ones) is read while batch k's copies are still in flight,
    and never more batches are read or in flight than there are buffers; every
    target holds its exact value although copies land late and shuffled."""
    _settings(monkeypatch, batch=512, buffers=4)  # 2 tensors per batch: 12 batches
    eng = Recording(delay=0.05)
    arrays = _arrays(24)
    dsts = [eng.array(np.zeros_like(a), f"t{i}") for i, a in enumerate(arrays)]
    log: list = []
    read = _reader(arrays, eng, log)
    eng.pause()  # the first copies stay in flight until the third batch's read began

    def read_host(indices, views):
        if indices[0] == 4:  # (not a timing: waits, boundedly, for batches 0 and 1 issued)
            deadline = time.monotonic() + 10
            while eng.in_flight() < 2 and time.monotonic() < deadline:
                time.sleep(0.001)
        read(indices, views)
        if indices[0] == 4:
            eng.resume()

    loading.fill_targets(read_host, list(range(24)), dsts)
    for a, d in zip(arrays, dsts):
        np.testing.assert_array_equal(d.obj, a)
    assert len(eng.batch_tickets) == 12  # one ticket per batch
    assert sorted(first for first, _ in log) == list(range(0, 24, 2))
    in_flight = [n for _, n in log]
    assert max(in_flight) >= 2       # reads ran ahead of copies still flying
    assert max(in_flight) <= 4 - 1   # the batch being read holds the 4th buffer
    assert eng.allocated == [512] * 4
    assert _loader_threads() == []


def test_a_single_buffer_still_loads_every_value(monkeypatch):
    _settings(monkeypatch, batch=256, buffers=1, readers=3)
    eng = Recording(delay=0.002)
    arrays = _arrays(7)
    dsts = [eng.array(np.zeros_like(a), f"t{i}") for i, a in enumerate(arrays)]
    log: list = []
    loading.fill_targets(_reader(arrays, eng, log), list(range(7)), dsts)
    for a, d in zip(arrays, dsts):
        np.testing.assert_array_equal(d.obj, a)
    assert [n for _, n in log] == [0] * 7  # each read waited for the copies before it
    assert eng.allocated == [256]


def test_a_read_error_leaves_no_copy_in_flight(monkeypatch):
    _settings(monkeypatch, batch=512, buffers=3)
    eng = Recording(delay=0.05)
    arrays = _arrays(20)
    dsts = [eng.array(np.zeros_like(a), f"t{i}") for i, a in enumerate(arrays)]
    log: list = []
    with pytest.raises(pyckpt.CorruptCheckpointError, match="t11"):
        loading.fill_targets(_reader(arrays, eng, log, fail_at=11), list(range(20)), dsts)
    assert eng.in_flight() == 0      # every issued copy landed before the error was raised
    assert _loader_threads() == []   # the readers were stopped and joined
    assert len(eng.batch_tickets) <= 5  # nothing issued from the failed batch on
    for i in (10, 11):               # the failed batch: never copied to the device
        assert not dsts[i].obj.any()
    for i in range(2 * len(eng.batch_tickets)):
        np.testing.assert_array_equal(dsts[i].obj, arrays[i])


def test_a_copy_error_leaves_no_copy_in_flight(monkeypatch):
    _settings(monkeypatch, batch=512, buffers=3)
    eng = Recording(delay=0.02)
    eng.fail_on("t5")
    arrays = _arrays(20)
    dsts = [eng.array(np.zeros_like(a), f"t{i}") for i, a in enumerate(arrays)]
    with pytest.raises(RuntimeError, match="t5"):
        loading.fill_targets(_reader(arrays), list(range(20)), dsts)
    assert eng.in_flight() == 0
    assert _loader_threads() == []
    assert len(eng.batch_tickets) < 10  # the load stopped issuing


def test_an_interrupted_caller_leaves_no_copy_in_flight(monkeypatch):
    """An error raised in the issuing thread itself (here: by the engine's issue of
    the 3rd batch) stops the readers and waits for the copies already issued."""
    _settings(monkeypatch, batch=512, buffers=4)
    eng = Recording(delay=0.05)
    real = eng.to_device_batch
    calls = []

    def issue(srcs, dsts):
        calls.append(len(srcs))
        if len(calls) == 3:
            raise Interrupted
        return real(srcs, dsts)

    monkeypatch.setattr(eng, "to_device_batch", issue)
    arrays = _arrays(20)
    dsts = [eng.array(np.zeros_like(a), f"t{i}") for i, a in enumerate(arrays)]
    with pytest.raises(Interrupted):
        loading.fill_targets(_reader(arrays), list(range(20)), dsts)
    assert len(eng.batch_tickets) == 2 and eng.in_flight() == 0
    assert _loader_threads() == []


def test_pinned_memory_is_bounded_kept_and_released(monkeypatch):
    """At most ``buffers`` buffers of one batch, and for a target larger than a batch
    at most 2 of its size; kept for the next load, freed by release_staging_memory
    once no copy reads them."""
    _settings(monkeypatch, batch=1024, buffers=3)
    eng = Recording(delay=0.01)
    arrays = _arrays(12) + [np.ones(1024, np.float32)]  # one target of 4096 bytes > batch
    dsts = [eng.array(np.zeros_like(a), f"t{i}") for i, a in enumerate(arrays)]
    loading.fill_targets(_reader(arrays), list(range(13)), dsts)
    for a, d in zip(arrays, dsts):
        np.testing.assert_array_equal(d.obj, a)
    assert eng.allocated == [1024] * 3 + [4096]  # one large target: one buffer of its size
    assert loading.bounce_bytes() == 3 * 1024 + 4096
    loading.fill_targets(_reader(arrays), list(range(13)), dsts)  # reuses them
    assert len(eng.allocated) == 4
    pyckpt.device.release_staging_memory()
    assert loading.bounce_bytes() == 0 and eng.freed == 4
    assert eng.in_flight_at_free == [0] * 4


def test_plan_buffers_bounds():
    s = loading.LoadSettings(batch=1000, buffers=4, readers=2)
    p = loading.plan_buffers([256] * 10, s)  # 2,560 bytes in all
    assert p.sizes == [1000] * 4 and [len(b) for b in p.batches] == [3, 3, 3, 1]
    assert p.slot == [0, 1, 2, 3] and p.prev == [-1, -1, -1, -1]
    p = loading.plan_buffers([100], s)  # a small load pins little
    assert (p.sizes, p.batches) == ([256], [[0]])
    # targets larger than a batch: their own buffers (2 at most), reused in turn
    p = loading.plan_buffers([5000, 10, 6000, 10, 10, 4000, 900, 900], s._replace(batch=1024))
    assert p.batches == [[0], [1], [2], [3, 4], [5], [6], [7]]
    assert p.sizes == [1024] * 4 + [6144] * 2
    assert p.slot == [4, 0, 5, 1, 4, 2, 3]
    assert p.prev == [-1, -1, -1, -1, 0, -1, -1]
    p = loading.plan_buffers([256] * 40, s._replace(buffers=1))
    assert p.sizes == [1000] and p.prev[1:] == list(range(13))


def test_settings_come_from_the_environment(monkeypatch):
    monkeypatch.setenv("PYCKPT_LOAD_BATCH_MB", "0.5")
    monkeypatch.setenv("PYCKPT_LOAD_BUFFERS", "6")
    monkeypatch.setenv("PYCKPT_LOAD_READERS", "3")
    assert loading.load_settings() == (512 << 10, 6, 3)
    monkeypatch.setenv("PYCKPT_LOAD_BUFFERS", "0")
    with pytest.raises(ValueError, match="PYCKPT_LOAD_BUFFERS"):
        loading.load_settings()


def test_one_upload_call_per_batch(monkeypatch):
    """The engine is asked once per batch (``to_device_batch``), not once per tensor."""
    _settings(monkeypatch, batch=1024, buffers=2)
    calls = []

    class Counting(HostCopyEngine):
        def to_device_batch(self, srcs, dsts):
            calls.append(len(srcs))
            return super().to_device_batch(srcs, dsts)

        def to_device(self, srcs, dsts):
            calls.append(("per copy", len(srcs)))
            return super().to_device(srcs, dsts)

    eng = Counting()
    arrays = _arrays(10)
    dsts = [DeviceArray(z, z.shape, z.dtype, "host", eng) for z in map(np.zeros_like, arrays)]
    loading.fill_targets(_reader(arrays), list(range(10)), dsts)
    assert calls == [4, ("per copy", 4), 4, ("per copy", 4), 2, ("per copy", 2)]
    for a, d in zip(arrays, dsts):
        np.testing.assert_array_equal(d.obj, a)


def _corrupt(path, key):
    """Flips a byte of ``key``'s stored bytes; returns the checkpoint's source."""
    from pyckpt.sources import open_source
    src = open_source(path)
    i = src.index[key]
    p = src.block_reads([i])
    name = src.file_path(int(p.file[0]))
    with open(name, "r+b") as f:
        f.seek(int(p.offset[0]) + 3)
        b = f.read(1)
        f.seek(int(p.offset[0]) + 3)
        f.write(bytes([b[0] ^ 0xFF]))


def test_corrupt_tensor_mid_load_is_never_copied(fake_device, tmp_path, monkeypatch):
    """load(into=) of device values with many batches: the corrupt tensor's error names
    its key, file and bytes; its target and those of later batches keep their values."""
    _settings(monkeypatch, batch=1024, buffers=3)
    state = {f"p{i:02d}": np.full((64,), i + 1, np.float32) for i in range(16)}
    pyckpt.save(state, tmp_path / "c")
    _corrupt(tmp_path / "c", "p09")
    into = {k: FakeTensor(np.zeros_like(v), key=k) for k, v in state.items()}
    with pytest.raises(pyckpt.CorruptCheckpointError, match=r"'p09'.*bytes \[") as e:
        pyckpt.load(tmp_path / "c", into=into)
    assert str(tmp_path / "c") in str(e.value)  # the file
    for k in ("p09", "p12", "p13", "p14", "p15"):  # its batch and the next: never copied
        assert not into[k]._data.any(), k
    for k in ("p00", "p03", "p07"):
        np.testing.assert_array_equal(into[k]._data, state[k])
    assert _loader_threads() == []


_CALLER = contextvars.ContextVar("caller", default="unset")


def test_readers_run_in_the_callers_context(monkeypatch):
    """Reads on the reader threads see the caller's context variables (the progress
    counter of ``pyckpt.progress`` is one)."""
    _settings(monkeypatch, batch=512, buffers=3)
    eng = Recording(delay=0.001)
    arrays = _arrays(8)
    dsts = [eng.array(np.zeros_like(a), f"t{i}") for i, a in enumerate(arrays)]
    seen = []
    read = _reader(arrays)

    def read_host(indices, views):
        seen.append((threading.current_thread().name, _CALLER.get()))
        read(indices, views)

    token = _CALLER.set("load 1")
    try:
        loading.fill_targets(read_host, list(range(8)), dsts)
    finally:
        _CALLER.reset(token)
    assert len(seen) == 4 and all(name.startswith("pyckpt-load") for name, _ in seen)
    assert {value for _, value in seen} == {"load 1"}
