"""CheckpointManager's options objects (issue 39 item 3, docs/API.md section 3,
"Options"): ``options=`` does what the old keyword-only arguments did, each old
keyword still works with one DeprecationWarning naming its replacement, a field
set both ways raises, every field is checked where it is built, and the
positional signature of /work/shared/API.md stays silent."""

import dataclasses
import os
import time
import warnings

import numpy as np
import pytest

import pyckpt
from pyckpt import (AsyncOptions, CheckpointManagerOptions, IncrementalOptions,
                    LocalTierOptions)
from pyckpt.manager.options import KEYWORDS


def _ck(value=0.0):
    return pyckpt.Checkpoint(step=pyckpt.Variable(np.int64(0)),
                             frozen=pyckpt.Variable(np.ones(4096)),
                             head=pyckpt.Variable(np.full(64, value)))


def _quiet(fn, *args, **kwargs):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        return fn(*args, **kwargs)


def _run(root, kw, blocking=True):
    """Three saves and a restore in a fresh manager with the same arguments: the
    checkpoints of every directory under ``root`` (relative), the restored values,
    the options in effect."""
    run = os.path.join(root, "run")
    ck = _ck()
    m = _quiet(pyckpt.CheckpointManager, ck, run, max_to_keep=2, **kw(root))
    for step in range(1, 4):
        ck.step.assign(step)
        ck.head.assign(np.full(64, float(step)))
        m.save(blocking=blocking)
    m.close()
    back = _ck(-1.0)
    m2 = _quiet(pyckpt.CheckpointManager, back, run, max_to_keep=2, **kw(root))
    restored = m2.restore_or_initialize()
    options = m2.options
    m2.close()
    kept = sorted(os.path.relpath(os.path.join(d, n), root) for d, subdirs, _ in os.walk(root)
                  for n in subdirs if n.startswith("ckpt-"))
    return (kept, os.path.relpath(restored, root), int(back.step),
            back.head.numpy().tolist()), options


def _local(root):
    return os.path.join(root, "local")


GROUPS = {
    "plain": (lambda root: dict(lease_seconds=60.0),
              lambda root: CheckpointManagerOptions(lease_seconds=60.0)),
    "async": (lambda root: dict(max_async_bytes=1 << 20),
              lambda root: CheckpointManagerOptions(
                  async_options=AsyncOptions(max_async_bytes=1 << 20))),
    "local tier": (lambda root: dict(local_dir=_local(root), local_max_to_keep=1,
                                     persist_every=2),
                   lambda root: CheckpointManagerOptions(
                       local_tier=LocalTierOptions(_local(root), max_to_keep=1,
                                                   persist_every=2))),
    "incremental": (lambda root: dict(incremental=True, full_save_every=3),
                    lambda root: CheckpointManagerOptions(
                        incremental=IncrementalOptions(full_save_every=3))),
}


@pytest.mark.parametrize("group", sorted(GROUPS))
def test_options_do_what_the_old_keywords_did(tmp_path, group):
    old, new = GROUPS[group]
    blocking = group != "async"
    before, old_options = _run(str(tmp_path / "old"), old, blocking)
    after, new_options = _run(str(tmp_path / "new"), lambda root: {"options": new(root)},
                              blocking)
    assert before == after
    assert after[2] == 3 and after[3] == [3.0] * 64
    if group == "local tier":  # the same but for the directory, which is each run's own
        old_options = dataclasses.replace(old_options, local_tier=dataclasses.replace(
            old_options.local_tier, directory=new_options.local_tier.directory))
    assert old_options == new_options == new(str(tmp_path / "new"))
    if group == "incremental":
        facts = pyckpt.load_checkpoint(os.path.join(tmp_path, "new", after[1])) \
            .source.describe()
        assert facts["referenced_bytes"] > 0  # ckpt-3 references ckpt-2's frozen data


def test_default_options(tmp_path):
    with pyckpt.CheckpointManager(_ck(), str(tmp_path)) as m:
        assert m.options == CheckpointManagerOptions()
    assert CheckpointManagerOptions() == CheckpointManagerOptions(
        AsyncOptions(None, None), None, None, 600.0, time.time, None)
    assert LocalTierOptions("d") == LocalTierOptions("d", 2, None, None, 0)
    assert IncrementalOptions().full_save_every == 10


SAMPLES = {"max_async_bytes": 1 << 20, "max_pinned_bytes": 1 << 20, "lease_seconds": 60.0,
           "clock": time.time, "comm": None, "local_dir": "LOCAL", "local_max_to_keep": 3,
           "persist_every": None, "persist_interval_seconds": None, "replicate": 0,
           "incremental": True, "full_save_every": 5}


@pytest.mark.parametrize("name", sorted(KEYWORDS))
def test_each_old_keyword_warns_once_naming_its_field(tmp_path, name):
    assert set(SAMPLES) == set(KEYWORDS)
    value = str(tmp_path / "local") if SAMPLES[name] == "LOCAL" else SAMPLES[name]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        m = pyckpt.CheckpointManager(_ck(), str(tmp_path / "run"), **{name: value})
    m.close()
    ours = [w for w in caught if issubclass(w.category, DeprecationWarning)]
    assert len(ours) == 1, [str(w.message) for w in caught]
    message = str(ours[0].message)
    assert f"{name}=" in message and f"options.{KEYWORDS[name]}" in message, message
    assert ours[0].filename == __file__  # points at the caller
    with pytest.warns(DeprecationWarning, match=f"keyword {name}= is deprecated"):
        _quiet_close(pyckpt.CheckpointManager(_ck(), str(tmp_path / "run2"), **{name: value}))
    if name in ("local_max_to_keep", "persist_every", "persist_interval_seconds",
                "replicate", "full_save_every"):  # alone, without their group: no effect
        assert m.options == CheckpointManagerOptions()
        return
    got = m.options
    for part in KEYWORDS[name].split("."):
        got = getattr(got, part)
    assert got == (IncrementalOptions() if name == "incremental" else value)


def _quiet_close(m):
    m.close()


def test_old_keywords_and_options_mix_when_they_set_different_fields(tmp_path):
    opts = CheckpointManagerOptions(incremental=IncrementalOptions(3))
    m = _quiet(pyckpt.CheckpointManager, _ck(), str(tmp_path), options=opts, lease_seconds=9.0,
               max_pinned_bytes=1 << 20)
    m.close()
    assert m.options == CheckpointManagerOptions(
        incremental=IncrementalOptions(3), lease_seconds=9.0,
        async_options=AsyncOptions(max_pinned_bytes=1 << 20))


CONFLICTS = [
    (dict(lease_seconds=5.0), CheckpointManagerOptions(lease_seconds=7.0),
     "lease_seconds= and options.lease_seconds"),
    (dict(clock=lambda: 0.0), CheckpointManagerOptions(clock=lambda: 1.0),
     "clock= and options.clock"),
    (dict(max_async_bytes=1), CheckpointManagerOptions(async_options=AsyncOptions(2)),
     "max_async_bytes= and options.async_options.max_async_bytes"),
    (dict(local_dir="/tmp/x"), CheckpointManagerOptions(local_tier=LocalTierOptions("/tmp/y")),
     "local_dir= and options.local_tier"),
    (dict(persist_every=2), CheckpointManagerOptions(local_tier=LocalTierOptions("/tmp/y")),
     "persist_every= and options.local_tier"),
    (dict(incremental=True), CheckpointManagerOptions(incremental=IncrementalOptions()),
     "incremental= and options.incremental"),
    (dict(full_save_every=4), CheckpointManagerOptions(incremental=IncrementalOptions()),
     "full_save_every= and options.incremental.full_save_every"),
]


@pytest.mark.parametrize("old,options,names", CONFLICTS)
def test_a_field_set_both_ways_raises(tmp_path, old, options, names):
    with pytest.raises(ValueError, match=names):
        _quiet(pyckpt.CheckpointManager, _ck(), str(tmp_path), options=options, **old)
    assert not os.listdir(tmp_path)


INVALID = [
    (lambda: AsyncOptions(max_async_bytes=-1), "max_async_bytes"),
    (lambda: AsyncOptions(max_pinned_bytes=0), "max_pinned_bytes"),
    (lambda: LocalTierOptions("d", max_to_keep=0), "local_tier.max_to_keep"),
    (lambda: LocalTierOptions("d", persist_every=0), "local_tier.persist_every"),
    (lambda: LocalTierOptions("d", persist_interval_seconds=-1),
     "local_tier.persist_interval_seconds"),
    (lambda: LocalTierOptions("d", replicate=-1), "local_tier.replicate"),
    (lambda: LocalTierOptions(None), "LocalTierOptions.directory"),
    (lambda: IncrementalOptions(full_save_every=0), "full_save_every"),
    (lambda: CheckpointManagerOptions(lease_seconds=0), "lease_seconds"),
    (lambda: CheckpointManagerOptions(clock=5), "clock"),
]


@pytest.mark.parametrize("make,field", INVALID)
def test_invalid_fields_raise_naming_the_field(make, field):
    with pytest.raises(ValueError, match=field.replace(".", r"\.")):
        make()


def test_wrong_types_raise(tmp_path):
    with pytest.raises(TypeError, match="local_tier must be a LocalTierOptions"):
        CheckpointManagerOptions(local_tier="/tmp/x")
    with pytest.raises(TypeError, match="options must be a pyckpt.CheckpointManagerOptions"):
        pyckpt.CheckpointManager(_ck(), str(tmp_path), options={"lease_seconds": 1})
    with pytest.raises(TypeError, match="unexpected keyword argument 'local_directory'"):
        pyckpt.CheckpointManager(_ck(), str(tmp_path), local_directory="/tmp/x")


def test_an_invalid_old_keyword_names_the_keyword(tmp_path):
    with pytest.raises(ValueError, match=r"local_tier\.max_to_keep .*local_max_to_keep="):
        _quiet(pyckpt.CheckpointManager, _ck(), str(tmp_path), local_dir=str(tmp_path / "l"),
               local_max_to_keep=0)


def test_checks_that_need_the_job_size_run_with_options_too(tmp_path):
    tier = LocalTierOptions(str(tmp_path / "local"), replicate=1)
    with pytest.raises(ValueError, match="replicate needs a multi-worker job"):
        pyckpt.CheckpointManager(_ck(), str(tmp_path / "run"),
                                 options=CheckpointManagerOptions(local_tier=tier))


def test_the_positional_signature_raises_no_warning(tmp_path):
    """/work/shared/API.md section 3: checkpoint, directory, max_to_keep,
    keep_checkpoint_every_n_hours, checkpoint_name, step_counter,
    checkpoint_interval, init_fn, best_fn, best_mode, storage_options."""
    step = pyckpt.Variable(np.int64(0))
    ck = pyckpt.Checkpoint(step=step)
    inits = []
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        m = pyckpt.CheckpointManager(ck, str(tmp_path / "a"), 3, None, "step", step, 1,
                                     lambda: inits.append(1), lambda metrics: 0.0, "max", None)
        assert m.restore_or_initialize() is None and inits == [1]
        step.assign(1)
        assert m.save().endswith("step-1")
        m.close()
        m = pyckpt.CheckpointManager(
            checkpoint=ck, directory=str(tmp_path / "b"), max_to_keep=None,
            keep_checkpoint_every_n_hours=1.0, checkpoint_name="ckpt", step_counter=None,
            checkpoint_interval=None, init_fn=None, best_fn=None, best_mode="min",
            storage_options=None, options=CheckpointManagerOptions())
        assert m.save().endswith("ckpt-2")  # the checkpoint's save_counter goes on
        m.close()
