"""``saving.SavePlan`` (issue 39, stage 2): one object says everything a save needs,
built (and checked) in one place, with its route decided there; every door, the
manager's keeper included, hands one plan to ``saving.write``/``start``/``run``."""

import ast
import pathlib

import numpy as np
import pytest

import pyckpt
from pyckpt import saving
from pyckpt.sharded import ShardedArray
from pyckpt.workers.comm import SingleComm

KEEPER = pathlib.Path(pyckpt.__file__).parent / "manager" / "keeper.py"


def _items(n=2):
    return [saving.Item(f"v{i}", np.full(4, i, np.float32)) for i in range(n)]


class _TwoWorkers(SingleComm):
    """A communicator that says it has two workers (no collective is run here)."""

    world_size = 2


# -- the plan: built once, checked there --------------------------------------------------
def test_an_incremental_node_local_plan_is_refused_when_built(tmp_path):
    with pytest.raises(NotImplementedError, match="incremental saves of node-local tiers"):
        saving.SavePlan.build(_items(), tmp_path / "c", node_local=1, incremental=True)
    assert not (tmp_path / "c").exists()


@pytest.mark.parametrize("bad", [0, -1, 1.5, True])
def test_a_bad_budget_is_refused_when_built(tmp_path, bad):
    with pytest.raises(ValueError, match="max_pinned_bytes must be a positive int"):
        saving.SavePlan.build(_items(), tmp_path / "c", max_pinned_bytes=bad)


def test_a_base_needs_an_incremental_save_of_a_sibling(tmp_path):
    pyckpt.save({"a": np.ones(3)}, tmp_path / "run" / "ckpt-1")
    base = tmp_path / "run" / "ckpt-1"
    with pytest.raises(ValueError, match="incremental=True"):
        saving.SavePlan.build(_items(), tmp_path / "run" / "ckpt-2", base=base)
    with pytest.raises(ValueError, match="cannot reference the checkpoint it replaces"):
        saving.SavePlan.build(_items(), base, incremental=True, base=base)
    with pytest.raises(ValueError, match="same directory"):
        saving.SavePlan.build(_items(), tmp_path / "other" / "ckpt-2", incremental=True,
                              base=base)


def test_the_plan_reads_the_base_it_is_given(tmp_path):
    pyckpt.save({"a": np.ones(3)}, tmp_path / "ckpt-1")
    plan = saving.SavePlan.build(_items(), tmp_path / "ckpt-2", incremental=True,
                                 base=str(tmp_path / "ckpt-1"), full_save_every=4)
    assert plan.route is saving.Route.INCREMENTAL
    assert plan.base is not None and plan.base.name == "ckpt-1"
    assert plan.base.full_every == 4 and plan.base.manifest.keys == ["a"]
    # no committed checkpoint there: a full save that records fingerprints
    empty = saving.SavePlan.build(_items(), tmp_path / "ckpt-3", incremental=True,
                                  base=str(tmp_path / "ckpt-9"))
    assert empty.base is None and empty.route is saving.Route.INCREMENTAL


def test_the_route_is_decided_when_built(tmp_path):
    build = saving.SavePlan.build
    plain = build(_items(), tmp_path / "c")
    assert plain.route is saving.Route.FILES and not plain.multi and plain.comm is None
    assert plain.overlap and plain.ring_from is not None  # local files, native byte order
    assert plain.shown == str(tmp_path / "c") and plain.nbytes == 32
    sharded = [saving.Item("s", np.ones(2), ShardedArray(np.ones(2), (4,), (0,)))]
    one = build(sharded, tmp_path / "c")  # sharded values: saved as a multi-worker save
    assert one.route is saving.Route.WORKERS and isinstance(one.comm, SingleComm)
    assert one.ring_from is None
    nl = build(_items(), tmp_path / "c", comm=_TwoWorkers(), node_local=1,
               max_pinned_bytes=1 << 20)
    assert nl.route is saving.Route.NODE_LOCAL and nl.multi
    assert not nl.can_background  # its communicator cannot make a background one
    assert nl.max_pinned_bytes is None  # node-local saves stage the whole state
    assert build(_items(), "memory://plan/c").ring_from is None  # no StagedSave there


def test_every_door_builds_one_plan(tmp_path, monkeypatch):
    built = []
    real = saving.SavePlan.build.__func__

    def build(cls, *a, **k):
        plan = real(cls, *a, **k)
        built.append(plan)
        return plan

    monkeypatch.setattr(saving.SavePlan, "build", classmethod(build))
    pyckpt.save({"a": np.ones(3)}, tmp_path / "flat")
    pyckpt.save({"a": np.ones(3)}, tmp_path / "async", blocking=False).wait()
    ck = pyckpt.Checkpoint(v=pyckpt.Variable(np.zeros(4)))
    ck.write(tmp_path / "graph")
    assert [p.path for p in built] == [str(tmp_path / n) for n in ("flat", "async", "graph")]


# -- write / start / run take the plan ----------------------------------------------------
def test_run_starts_in_the_background_only_what_may_go_there(tmp_path):
    plan = saving.SavePlan.build(_items(), tmp_path / "a")
    assert saving.run(plan, blocking=True) is None
    assert pyckpt.load(tmp_path / "a")["v1"].tolist() == [1.0] * 4
    over = saving.SavePlan.build(_items(), tmp_path / "b")
    assert saving.run(over, blocking=False, max_async_bytes=plan.nbytes - 1) is None
    handle = saving.run(saving.SavePlan.build(_items(), tmp_path / "c"), blocking=False,
                        max_async_bytes=plan.nbytes)
    assert isinstance(handle, saving.PendingSave)
    assert handle.wait() == str(tmp_path / "c")


def test_a_plan_with_progress_is_not_started(tmp_path):
    plan = saving.SavePlan.build(_items(), tmp_path / "c", progress=lambda d, t: None)
    with pytest.raises(ValueError, match="blocking=False"):
        saving.start(plan)
    assert not (tmp_path / "c").exists()


def test_warm_allocates_nothing_for_host_values():
    bg = saving.Background()
    items = _items()
    bg.warm([it.key for it in items], [it.array for it in items])
    assert bg._warming is None  # host values need no staging buffers ahead


# -- the keeper: a client of saving ---------------------------------------------------------
@pytest.mark.parametrize("mode", ["blocking", "async", "budget", "sync_by_size",
                                  "incremental", "incremental_async"])
def test_every_save_of_the_keeper_goes_through_one_plan(tmp_path, monkeypatch, mode):
    calls = []
    real_write, real_start = saving.write, saving.start

    def write(plan):
        calls.append(("write", plan))
        return real_write(plan)

    def start(plan, **kw):
        calls.append(("start", plan))
        return real_start(plan, **kw)

    monkeypatch.setattr(saving, "write", write)
    monkeypatch.setattr(saving, "start", start)
    inc = mode.startswith("incremental")
    opts = pyckpt.CheckpointManagerOptions(
        incremental=pyckpt.IncrementalOptions() if inc else None,
        async_options=pyckpt.AsyncOptions(
            max_async_bytes=0 if mode == "sync_by_size" else None,
            max_pinned_bytes=1 << 20 if mode == "budget" else None))
    ck = pyckpt.Checkpoint(v=pyckpt.Variable(np.zeros(4)))
    blocking = mode in ("blocking", "budget", "incremental")
    with pyckpt.CheckpointManager(ck, tmp_path, options=opts) as m:
        for _ in range(2):
            m.save(blocking=blocking)
            m.wait_until_finished()
    kinds = [k for k, _ in calls]
    assert kinds == ["write" if blocking or mode == "sync_by_size" else "start"] * 2
    plans = [p for _, p in calls]
    assert all(isinstance(p, saving.SavePlan) for p in plans)
    assert [p.path for p in plans] == [str(tmp_path / f"ckpt-{n}") for n in (1, 2)]
    assert plans[0].base is None
    if inc:  # the second references the first: the plan read its manifest
        assert plans[1].route is saving.Route.INCREMENTAL and plans[1].base.name == "ckpt-1"
    if mode == "budget":
        assert plans[0].max_pinned_bytes == 1 << 20


def _imported_modules(path: pathlib.Path, package: str) -> set[str]:
    """Every module an ``import`` or ``from ... import`` of ``path`` names (a name
    imported from a package counts as its submodule too), resolved absolutely."""
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = package.split(".")
            base = base[:len(base) - node.level + 1] if node.level else []
            mod = ".".join(base + ([node.module] if node.module else []))
            out.add(mod)
            out |= {f"{mod}.{a.name}" for a in node.names}
    return out


def test_the_keeper_imports_no_save_internals():
    imported = _imported_modules(KEEPER, "pyckpt.manager")
    assert "pyckpt.saving" in imported and "pyckpt.errors.DistributedSaveError" in imported
    banned = {"pyckpt.engine.commit", "pyckpt.engine.incremental", "pyckpt.workers.background",
              "pyckpt.workers.save", "pyckpt.device.staging"}
    assert not imported & banned, sorted(imported & banned)
