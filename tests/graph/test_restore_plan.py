"""Checkpoint.restore_plan: a dry run that touches no value (API.md section 2)."""

import numpy as np

import pyckpt


def _model():
    m = pyckpt.Module()
    m.w = pyckpt.Variable(np.arange(6.0).reshape(2, 3))
    m.b = pyckpt.Variable(np.ones(3))
    return m


def test_plan_reports_restored_pending_unmatched_and_conflicts(tmp_path):
    src = pyckpt.Checkpoint(model=_model(), opt=pyckpt.Checkpoint(m=pyckpt.Variable(np.ones(3))))
    path = src.save(tmp_path / "c")

    target = pyckpt.Checkpoint(model=pyckpt.Module(), opt=pyckpt.Checkpoint())
    target.model.w = pyckpt.Variable(np.zeros((3, 2)))    # shape conflict
    target.model.extra = pyckpt.Variable(np.zeros(1))     # no value in the checkpoint
    before = target.model.w.numpy()
    plan = target.restore_plan(path)
    assert ("save_counter/.ATTRIBUTES/VARIABLE_VALUE", "save_counter") not in plan.restore
    assert [c.key for c in plan.conflicts] == ["model/w/.ATTRIBUTES/VARIABLE_VALUE"]
    assert plan.conflicts[0].checkpoint_shape == (2, 3) and plan.conflicts[0].object_shape == (3, 2)
    assert "model/b/.ATTRIBUTES/VARIABLE_VALUE" in plan.pending
    assert "opt/m/.ATTRIBUTES/VARIABLE_VALUE" in plan.pending
    assert plan.unmatched_objects == ["model.w", "model.extra"]
    assert not plan.ok
    assert "conflict" in str(plan)
    np.testing.assert_array_equal(target.model.w.numpy(), before)  # nothing touched
    assert target.__dict__.get("_pyckpt_pending") is None           # nothing registered


def test_plan_suggests_a_prefix_map_when_structures_differ_by_a_prefix(tmp_path):
    path = pyckpt.Checkpoint(model=_model()).write(tmp_path / "c")
    target = pyckpt.Checkpoint(net=pyckpt.Checkpoint(encoder=_model()))
    plan = target.restore_plan(path)
    assert plan.restore == []
    assert plan.suggested_prefix_map == {"model/": "net/encoder/"}


def test_plan_ok_when_everything_matches(tmp_path):
    path = pyckpt.Checkpoint(model=_model()).write(tmp_path / "c")
    plan = pyckpt.Checkpoint(model=_model()).restore_plan(path)
    assert plan.ok and len(plan.restore) == 2 and plan.suggested_prefix_map is None


def test_suggested_prefix_map_can_be_applied(tmp_path):
    src = pyckpt.Checkpoint(model=_model())
    path = src.save(tmp_path / "c")
    target = pyckpt.Checkpoint(net=pyckpt.Checkpoint(encoder=pyckpt.Module()))
    target.net.encoder.w = pyckpt.Variable(np.zeros((2, 3)))
    plan = target.restore_plan(path)
    status = target.restore(path, prefix_map=plan.suggested_prefix_map)
    np.testing.assert_array_equal(target.net.encoder.w.numpy(), src.model.w.numpy())
    target.net.encoder.b = pyckpt.Variable(np.zeros(3))  # deferred under the mapped subtree
    np.testing.assert_array_equal(target.net.encoder.b.numpy(), np.ones(3))
    status.assert_consumed()
    assert int(target.save_counter) == 1
    import pytest

    with pytest.raises(KeyError, match="no object"):
        target.restore(path, prefix_map={"model/": "nowhere/"})


def test_plan_treats_the_save_counter_as_restore_does(tmp_path):
    """The plan of a save() checkpoint into a Checkpoint without a counter reported
    the counter pending, and of a write() checkpoint into one with a counter reported
    it unmatched, while the restores themselves passed assert_consumed."""
    V = pyckpt.Variable
    saved = pyckpt.Checkpoint(x=V(1.0)).save(tmp_path / "ck")
    written = pyckpt.Checkpoint(x=V(1.0)).write(tmp_path / "w")
    for path, with_counter in ((saved, False), (saved, True), (written, True), (written, False)):
        ck = pyckpt.Checkpoint(x=V(0.0))
        if with_counter:
            ck.save_counter.assign(3)
        plan = ck.restore_plan(path)
        assert plan.ok and not plan.pending and not plan.unmatched_objects, (path, with_counter)
        assert ("_save_counter" in ck.__dict__) == with_counter  # a plan creates nothing
        ck.restore(path).assert_consumed()
