"""Tiered managers (docs/API.md section 13, docs/PROTOCOL.md section 7): saves to a
local directory, background persists to a durable store, restore from either tier."""

import glob
import os
import shutil
import threading
import uuid

import numpy as np
import pytest

import pyckpt
from pyckpt import saving  # a tier persists through saving.copy: its copy_checkpoint
from pyckpt.testing.crash import run_and_kill


def _ck(n=5000):
    return pyckpt.Checkpoint(step=pyckpt.Variable(np.int64(0)),
                             a=pyckpt.Variable(np.zeros(n)))


def _set(ck, step):
    ck.step.assign(step)
    ck.a.assign(np.full(ck.a.shape, float(step)))


def _names(urls):
    return [u.rstrip("/").rsplit("/", 1)[-1] for u in urls]


def _durable(m):
    return _names(m._tiers.durable.checkpoints)


def _local(m):
    return _names(m._tiers.local.checkpoints)


@pytest.fixture
def mem_url():
    return f"memory://pyckpt-tiers/{uuid.uuid4().hex[:12]}"


@pytest.fixture(scope="module")
def seaweed(seaweed_server):
    return seaweed_server


def _s3(seaweed):
    return f"s3://pyckpt/{uuid.uuid4().hex[:12]}", seaweed.options


# -- cadence and retention per tier ------------------------------------------------------

@pytest.mark.parametrize("blocking", [True, False])
def test_persist_every(tmp_path, mem_url, blocking):
    ck = _ck()
    m = pyckpt.CheckpointManager(ck, mem_url, local_dir=tmp_path / "local", persist_every=3,
                                 local_max_to_keep=2, max_to_keep=10)
    for step in range(1, 11):
        _set(ck, step)
        m.save(blocking=blocking)
        m.wait_until_finished()  # the persist of a due save is done before the next one
    assert _durable(m) == ["ckpt-3", "ckpt-6", "ckpt-9"]
    assert _local(m) == ["ckpt-9", "ckpt-10"]
    assert _names([m.latest_checkpoint]) == ["ckpt-10"]
    assert m.latest_checkpoint.startswith(str(tmp_path / "local"))
    assert _names(m.checkpoints) == ["ckpt-3", "ckpt-6", "ckpt-9", "ckpt-9", "ckpt-10"]
    m.close()
    # the durable copy is a checkpoint of its own, with its own state file
    assert pyckpt.latest_checkpoint(mem_url).endswith("ckpt-9")
    r = pyckpt.load_checkpoint(pyckpt.latest_checkpoint(mem_url))
    r.verify()
    assert int(r.get_tensor("step/.ATTRIBUTES/VARIABLE_VALUE")) == 9


def test_persist_interval_seconds(tmp_path, mem_url):
    ck = _ck()
    m = pyckpt.CheckpointManager(ck, mem_url, local_dir=tmp_path / "l1",
                                 persist_interval_seconds=3600)
    for step in range(1, 4):
        _set(ck, step)
        m.save()
        m.wait_until_finished()
    assert _durable(m) == []  # not due within the hour
    m.close()
    m = pyckpt.CheckpointManager(ck, mem_url, local_dir=tmp_path / "l2",
                                 persist_interval_seconds=0)
    for step in range(4, 7):
        _set(ck, step)
        m.save()
        m.wait_until_finished()
    assert _durable(m) == ["ckpt-4", "ckpt-5", "ckpt-6"]
    m.close()


def test_options_checked(tmp_path, mem_url):
    with pytest.raises(ValueError, match="local_dir"):
        pyckpt.CheckpointManager(_ck(), mem_url, persist_every=2)
    with pytest.raises(ValueError, match="persist_every"):
        pyckpt.CheckpointManager(_ck(), mem_url, local_dir=tmp_path, persist_every=0)
    with pytest.raises(ValueError, match="local_max_to_keep"):
        pyckpt.CheckpointManager(_ck(), mem_url, local_dir=tmp_path, local_max_to_keep=0)


def test_checkpoint_being_persisted_is_not_deleted(tmp_path, mem_url, monkeypatch):
    gate = threading.Event()
    entered = threading.Event()
    real = saving.copy_checkpoint

    def slow_copy(*args, **kwargs):
        entered.set()
        assert gate.wait(30)
        return real(*args, **kwargs)

    monkeypatch.setattr(saving, "copy_checkpoint", slow_copy)
    ck = _ck()
    local = tmp_path / "local"
    m = pyckpt.CheckpointManager(ck, mem_url, local_dir=local, persist_every=1,
                                 local_max_to_keep=1, max_to_keep=5)
    _set(ck, 1)
    m.save()
    assert entered.wait(30)
    for step in (2, 3, 4):  # persists due meanwhile are deferred: save never waits
        _set(ck, step)
        m.save(blocking=step % 2 == 0)
    m._tiers.local.wait_until_finished()
    assert (local / "ckpt-1" / "pyckpt.index").exists()  # pinned while it is copied
    assert not (local / "ckpt-2").exists() and not (local / "ckpt-3").exists()
    gate.set()
    m.wait_until_finished()  # also persists the newest local one, deferred meanwhile
    assert _durable(m) == ["ckpt-1", "ckpt-4"]
    _set(ck, 5)
    m.save()  # unpinned now: ckpt-1 and ckpt-4 are retired locally
    m.wait_until_finished()
    assert _durable(m) == ["ckpt-1", "ckpt-4", "ckpt-5"]
    assert _local(m) == ["ckpt-5"]
    assert not (local / "ckpt-1").exists()
    m.close()


# -- restores ----------------------------------------------------------------------------

def _restore(url, options, local_dir, n=5000, **kw):
    ck = _ck(n)
    m = pyckpt.CheckpointManager(ck, url, storage_options=options, local_dir=local_dir, **kw)
    return ck, m, m.restore_or_initialize()


def _train(url, options, local_dir, steps, **kw):
    ck = _ck()
    m = pyckpt.CheckpointManager(ck, url, storage_options=options, local_dir=local_dir, **kw)
    for step in steps:
        _set(ck, step)
        m.save()
        m.wait_until_finished()
    m.close()


def test_restore_after_wiping_the_local_tier(tmp_path, seaweed):
    url, options = _s3(seaweed)
    local = tmp_path / "local"
    _train(url, options, local, range(1, 8), persist_every=3)
    shutil.rmtree(local)  # a fresh node
    ck, m, restored = _restore(url, options, local, persist_every=3)
    assert restored == f"{url}/ckpt-6"
    assert int(ck.step) == 6 and (ck.a.numpy() == 6).all()
    _set(ck, 7)
    assert m.save().endswith("ckpt-7")  # numbering goes on from the restored checkpoint
    assert m.latest_checkpoint == str(local / "ckpt-7")
    m.close()


def test_restore_falls_back_from_a_corrupt_local_checkpoint(tmp_path, seaweed, flip):
    url, options = _s3(seaweed)
    local = tmp_path / "local"
    _train(url, options, local, range(1, 5), persist_every=2, local_max_to_keep=2)
    newest = sorted(glob.glob(str(local / "ckpt-4" / "data-*.bin")))[0]
    flip(newest, 100)
    with pytest.warns(UserWarning, match="ckpt-4"):
        ck, m, restored = _restore(url, options, local, persist_every=2)
    assert restored == f"{url}/ckpt-4"  # same step from the durable tier
    assert int(ck.step) == 4 and (ck.a.numpy() == 4).all()
    m.close()


def test_restore_skips_a_torn_local_checkpoint(tmp_path, mem_url):
    local = tmp_path / "local"
    _train(mem_url, None, local, range(1, 4), persist_every=2)
    os.remove(local / "ckpt-3" / "pyckpt.index")  # a local save cut by a crash
    ck, m, restored = _restore(mem_url, None, local, persist_every=2)
    assert restored == str(local / "ckpt-2")
    assert int(ck.step) == 2
    m.close()


def test_restore_from_nothing_initializes(tmp_path, mem_url):
    called = []
    ck = _ck()
    m = pyckpt.CheckpointManager(ck, mem_url, local_dir=tmp_path / "l",
                                 init_fn=lambda: called.append(1))
    assert m.restore_or_initialize() is None and called == [1]
    assert m.latest_checkpoint is None and m.checkpoints == []
    m.close()


# -- durable store failures --------------------------------------------------------------

def test_server_lost_during_upload(tmp_path, seaweed, monkeypatch):
    url, options = _s3(seaweed)
    real = saving.copy_checkpoint
    killed = []

    def copy_and_crash_the_server(src, dst, progress=None, **kwargs):
        def crash(done, total):
            if not killed:
                killed.append(done)
                seaweed.kill()  # mid-upload: the first window is written, the index is not
            if progress is not None:
                progress(done, total)
        return real(src, dst, progress=crash, **kwargs)

    monkeypatch.setattr(saving, "copy_checkpoint", copy_and_crash_the_server)
    ck = _ck(300_000)
    local = tmp_path / "local"
    m = pyckpt.CheckpointManager(ck, url, storage_options=options, local_dir=local,
                                 persist_every=2, local_max_to_keep=2)
    try:
        for step in (1, 2):
            _set(ck, step)
            m.save()
        with pytest.raises(OSError) as info:
            m.wait_until_finished()  # the background error surfaces here
        assert killed
        assert "persisting" in "\n".join(getattr(info.value, "__notes__", []))
    finally:
        seaweed.start()
    monkeypatch.setattr(saving, "copy_checkpoint", real)
    assert pyckpt.latest_checkpoint(url, storage_options=options) is None  # nothing committed
    _set(ck, 3)
    m.save()  # the failed persist is due again: this checkpoint is persisted
    m.wait_until_finished()
    assert _durable(m) == ["ckpt-3"]
    m.close()
    shutil.rmtree(local)
    ck2, m2, restored = _restore(url, options, local, n=300_000)
    assert restored == f"{url}/ckpt-3" and int(ck2.step) == 3
    m2.close()


def test_close_persists_a_deferred_checkpoint(tmp_path, mem_url, monkeypatch):
    gate = threading.Event()
    real = saving.copy_checkpoint

    def slow_copy(*args, **kwargs):
        assert gate.wait(30)
        return real(*args, **kwargs)

    monkeypatch.setattr(saving, "copy_checkpoint", slow_copy)
    ck = _ck()
    m = pyckpt.CheckpointManager(ck, mem_url, local_dir=tmp_path / "local", persist_every=2)
    for step in range(1, 5):  # ckpt-2 persists slowly; ckpt-4's persist is deferred
        _set(ck, step)
        m.save()
    assert _durable(m) == []
    gate.set()
    m.close()
    assert _names([pyckpt.latest_checkpoint(mem_url)]) == ["ckpt-4"]


# -- kill -9 -----------------------------------------------------------------------------

def _check_tier(directory, max_kept):
    """The tier's latest checkpoint loads, verifies and holds one step; leftovers are
    bounded. Returns its step (0: none)."""
    if not os.path.isdir(directory):
        return 0
    latest = pyckpt.latest_checkpoint(directory)
    names = [n for n in os.listdir(directory) if n.startswith("ckpt-")]
    committed = [n for n in names if os.path.exists(os.path.join(directory, n, "pyckpt.index"))]
    # retention per tier: a pinned (being persisted), an unrecorded commit, a leftover
    assert len(committed) <= max_kept + 2, names
    assert len(names) <= max_kept + 3, names
    if latest is None:
        return 0
    reader = pyckpt.load_checkpoint(latest)
    reader.verify()
    step = int(reader.get_tensor("step/.ATTRIBUTES/VARIABLE_VALUE"))
    for key in reader.keys():
        assert (reader.get_tensor(key) == step).all(), f"{latest}: {key} is not all {step}"
    return step


def test_sigkill_during_tiered_saves(tmp_path):
    import random

    child = os.path.join(os.path.dirname(__file__), "crash_child.py")
    local, durable = str(tmp_path / "local"), str(tmp_path / "durable")
    rng = random.Random(20261123)
    last = 0
    persisted = []
    for round_ in range(10):
        if round_ in (4, 8):
            shutil.rmtree(local, ignore_errors=True)  # a lost node: restart from durable
            last = _check_tier(durable, 3)
        start, saved = run_and_kill([child, local, durable], rng)
        # the restart continued from the newest complete checkpoint of either tier
        assert start >= last
        local_step = _check_tier(local, 2)
        durable_step = _check_tier(durable, 3)
        if saved:
            assert local_step >= saved[-1]
        persisted.append(durable_step)
        last = max(local_step, durable_step)
    assert last > 0 and max(persisted) > 0
    ck = pyckpt.Checkpoint(step=pyckpt.Variable(np.int64(0)), a=pyckpt.Variable(np.zeros(400_000)),
                           b=pyckpt.Variable(np.zeros((200, 300), np.float32)))
    m = pyckpt.CheckpointManager(ck, durable, max_to_keep=3, local_dir=local, persist_every=2)
    assert m.restore_or_initialize() is not None
    assert int(ck.step) == last
    m.close()


def test_persist_error_surfaces_at_the_next_save(tmp_path, mem_url, monkeypatch):
    real = saving.copy_checkpoint
    calls = []

    def failing_copy(*args, **kwargs):
        calls.append(1)
        if len(calls) == 1:
            raise ConnectionError("durable store unreachable")
        return real(*args, **kwargs)

    monkeypatch.setattr(saving, "copy_checkpoint", failing_copy)
    ck = _ck()
    m = pyckpt.CheckpointManager(ck, mem_url, local_dir=tmp_path / "local", persist_every=3)
    _set(ck, 1)
    m.save()  # not due
    m._tiers.join()
    _set(ck, 2)
    m.save()
    _set(ck, 3)
    m.save()  # due: its persist fails in the background
    m._tiers.join()
    _set(ck, 4)
    with pytest.raises(ConnectionError, match="unreachable") as info:
        m.save()  # raised here, as an async save's error; this save did not happen
    assert "the local checkpoint is intact" in "\n".join(info.value.__notes__)
    assert _local(m)[-1] == "ckpt-3" and _durable(m) == []
    m.save()  # due again at once
    m.wait_until_finished()
    assert _durable(m) == ["ckpt-4"]
    assert pyckpt.latest_checkpoint(mem_url).endswith("ckpt-4")
    m.close()


def test_persist_yields_to_a_running_save(tmp_path, mem_url):
    """Between its windows a persist waits while a local save runs (Tiers.saving)."""
    m = pyckpt.CheckpointManager(_ck(), mem_url, local_dir=tmp_path / "local")
    tiers = m._tiers
    passed = threading.Event()
    with tiers.saving():
        t = threading.Thread(target=lambda: (tiers.yield_to_saves(0, 1), passed.set()))
        t.start()
        assert not passed.wait(0.3)  # held while the save runs
    assert passed.wait(10)  # and released when it ends
    t.join()
    m.close()
