"""The tiers are clients of the save pipeline (issue 39, stage 3): a persist is a
``saving.CopyPlan`` handed to ``saving.copy`` (one worker) or ``saving.upload`` and
``saving.commit_upload`` (several workers), the restore from peers is
``saving.from_peers``, and no module of the manager reaches the engine's writer,
copy, commit or attempt modules or the workers' save modules. The persist cadence is
checked once, by ``LocalTierOptions``."""

import ast
import dataclasses
import importlib.util
import os
import pathlib
import shutil

import numpy as np
import pytest

import pyckpt
from pyckpt import saving
from pyckpt.manager import options as options_module
from pyckpt.testing.thread_comm import ThreadGroup

MANAGER = pathlib.Path(pyckpt.__file__).parent / "manager"
SAVE_INTERNALS = {"pyckpt.engine.copy", "pyckpt.engine.writer", "pyckpt.engine.commit",
                  "pyckpt.engine.attempts", "pyckpt.workers.save",
                  "pyckpt.workers.background", "pyckpt.workers.node_local",
                  "pyckpt.workers.incremental", "pyckpt.workers.planned_save"}


def _names_imported(path: pathlib.Path) -> set[str]:
    """The absolute names every import statement of ``path`` (a module of
    pyckpt.manager) binds, a name taken from a package counted as its submodule."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            origin = importlib.util.resolve_name("." * node.level + (node.module or ""),
                                                 "pyckpt.manager") if node.level \
                else node.module
            found.add(origin)
            found.update(f"{origin}.{alias.name}" for alias in node.names)
    return found


def test_no_module_of_the_manager_imports_save_internals():
    modules = sorted(MANAGER.glob("*.py"))
    assert {p.name for p in modules} >= {"tiers.py", "node_tiers.py", "keeper.py"}
    reached = {f"{p.name}: {name}" for p in modules for name in _names_imported(p)
               if any(name == m or name.startswith(m + ".") for m in SAVE_INTERNALS)}
    assert reached == set(), "the manager hands plans to pyckpt.saving (issue 39)"


def _ck(n=2000):
    return pyckpt.Checkpoint(step=pyckpt.Variable(np.int64(0)),
                             w=pyckpt.Variable(np.zeros(n, np.float32)))


def _set(ck, step):
    ck.step.assign(step)
    ck.w.assign(np.full(ck.w.numpy().shape, float(step), np.float32))


def _record(monkeypatch, name):
    """Records the plans handed to ``saving.<name>`` (which still runs)."""
    seen = []
    real = getattr(saving, name)

    def recording(plan, *args):
        seen.append((plan, args))
        return real(plan, *args)

    monkeypatch.setattr(saving, name, recording)
    return seen


@pytest.mark.parametrize("incremental", [False, True])
def test_a_persist_is_one_copy_plan(tmp_path, monkeypatch, incremental):
    copies = _record(monkeypatch, "copy")
    ck = _ck()
    local, durable = tmp_path / "local", tmp_path / "durable"
    options = pyckpt.CheckpointManagerOptions(
        local_tier=pyckpt.LocalTierOptions(local, persist_every=1),
        incremental=pyckpt.IncrementalOptions() if incremental else None)
    with pyckpt.CheckpointManager(ck, durable, options=options) as m:
        for step in (1, 2):
            _set(ck, step)
            m.save()
            m.wait_until_finished()
        tiers = m._tiers
    assert [(p.source_path, p.path, p.options) for p, _ in copies] == [
        (str(local / f"ckpt-{s}"), str(durable / f"ckpt-{s}"), None) for s in (1, 2)]
    assert all(p.progress == tiers.yield_to_saves for p, _ in copies)
    assert copies[0][0].base is None
    # an incremental run's persist references the durable tier's previous checkpoint
    assert (copies[1][0].base is not None) is incremental
    if incremental:
        assert copies[1][0].base.name == "ckpt-1"
    restored = _ck()
    restored.restore(str(durable / "ckpt-2"))
    assert int(restored.step) == 2 and float(restored.w.numpy()[0]) == 2.0


W = 2


def test_the_node_tiers_persist_and_restore_through_saving(tmp_path, monkeypatch):
    uploads = _record(monkeypatch, "upload")
    commits = _record(monkeypatch, "commit_upload")
    peers = []
    real_from_peers = saving.from_peers

    def recording_from_peers(*args):
        found = real_from_peers(*args)
        peers.append(found)
        return found

    monkeypatch.setattr(saving, "from_peers", recording_from_peers)
    base = str(tmp_path)

    def train(comm, steps):
        ck = pyckpt.Checkpoint(w=pyckpt.Variable(np.zeros(1000, np.float32)),
                               mine=pyckpt.PerWorker(np.zeros(100, np.float64)))
        with pyckpt.CheckpointManager(ck, os.path.join(base, "durable"), comm=comm,
                                      local_dir=os.path.join(base, f"node{comm.rank}"),
                                      persist_every=2, replicate=1) as m:
            got = m.restore_or_initialize()
            for step in range(int(ck.save_counter) + 1, int(ck.save_counter) + steps + 1):
                ck.w.assign(np.full(1000, float(step), np.float32))
                ck.mine.value[:] = 100 * comm.rank + step
                m.save()
        return got, float(ck.w.numpy()[0]), float(ck.mine.value[0])

    def run(fn):
        out = ThreadGroup(W, timeout=60).run(fn)
        for o in out:
            if isinstance(o, BaseException):
                raise o
        return out

    run(lambda comm: train(comm, 3))
    # ckpt-2 was persisted: each worker uploaded its own files, rank 0 committed
    assert sorted(args for _, args in uploads) == [(0, 16 << 20), (1, 16 << 20)]
    assert {p.path for p, _ in uploads} == {os.path.join(base, "durable", "ckpt-2")}
    assert [p.source_path for p, _ in commits] == [os.path.join(base, "node0", "ckpt-2")]
    pyckpt.load_checkpoint(os.path.join(base, "durable", "ckpt-2")).verify()
    shutil.rmtree(tmp_path / "node1")  # a replaced node: it receives ckpt-3 from its peer
    peers.clear()
    out = run(lambda comm: train(comm, 0))
    assert [p.name for p in peers] == ["ckpt-3", "ckpt-3"]
    for r, (got, w, mine) in enumerate(out):
        assert got == os.path.join(base, f"node{r}", "ckpt-3")
        assert (w, mine) == (3.0, 100 * r + 3.0)


# -- the persist cadence: checked once, by LocalTierOptions ----------------------------------

@pytest.mark.parametrize("field, value", [("persist_every", 0), ("persist_every", 1.5),
                                          ("persist_interval_seconds", -1)])
def test_every_way_to_set_the_cadence_is_checked_by_the_options(tmp_path, field, value):
    tier = pyckpt.LocalTierOptions(tmp_path / "local")
    with pytest.raises(ValueError, match=f"local_tier.{field}"):
        pyckpt.LocalTierOptions(tmp_path / "local", **{field: value})
    with pytest.raises(ValueError, match=f"local_tier.{field}"):
        dataclasses.replace(tier, **{field: value})
    with pytest.raises(ValueError, match=f"local_tier.{field}"), \
            pytest.warns(DeprecationWarning):
        pyckpt.CheckpointManager(_ck(), tmp_path / "durable", local_dir=tmp_path / "local",
                                 **{field: value})


def test_the_cadence_is_checked_once_per_manager(tmp_path, monkeypatch):
    checked = []
    real = options_module._check_count

    def counting(field, *args, **kwargs):
        checked.append(field)
        return real(field, *args, **kwargs)

    monkeypatch.setattr(options_module, "_check_count", counting)
    tier = pyckpt.LocalTierOptions(tmp_path / "local", persist_every=2)
    with pyckpt.CheckpointManager(
            _ck(), tmp_path / "durable",
            options=pyckpt.CheckpointManagerOptions(local_tier=tier)) as m:
        assert (m._tiers._every, m._tiers._interval) == (2, None)
    assert checked.count("local_tier.persist_every") == 1


def test_neither_cadence_persists_every_save(tmp_path):
    ck = _ck()
    with pyckpt.CheckpointManager(ck, tmp_path / "durable", local_dir=tmp_path / "local") as m:
        assert (m._tiers._every, m._tiers._interval) == (1, None)
        for step in (1, 2):
            _set(ck, step)
            m.save()
            m.wait_until_finished()
    assert pyckpt.latest_checkpoint(str(tmp_path / "durable")) == str(
        tmp_path / "durable" / "ckpt-2")
