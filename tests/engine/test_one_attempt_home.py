"""One home of the save steps around every commit (issue 39 item 1, stage 2): a new
attempt id, its marker before the first data byte and its end are
``engine.commit.Attempt``'s, for every route (single-process saves, incremental saves,
copies, the workers' saves, DCP's).

- the source scan: ``attempts.begin``/``attempts.end`` and ``naming.new_attempt_id``
  are called in engine/commit.py only, and so is ``finish`` with a kind that commits
  its own attempt (SAVE, WORKERS, COPY: through ``Attempt.finish``);
- the object, per kind: the marker exists from ``begin`` until the commit, a failure
  or the end of its ``with`` block; it commits at most once;
- the routes: the marker exists while each one writes, and is gone after its commit
  and after a failed write."""

import ast
import os
import pathlib

import numpy as np
import pytest

import pyckpt
from pyckpt.engine import attempts, commit, copy as copies, incremental, writer
from pyckpt.engine.commit import Attempt, Kind
from pyckpt.errors import CheckpointError, WorkerTimeoutError
from pyckpt.format import INDEX_NAME
from pyckpt.storage.local import LocalStore
from pyckpt.testing.thread_comm import ThreadComm, ThreadGroup
from pyckpt.workers import incremental as winc
from pyckpt.workers.save import distributed_save

ROOT = pathlib.Path(pyckpt.__file__).parent
HOME = "engine/commit.py"
OWN = {k.name for k, s in commit.STEPS.items() if s.own}


def _scan(root=ROOT):
    for p in sorted(root.rglob("*.py")):
        rel = p.relative_to(root).as_posix()
        if rel == HOME:
            continue
        for node in ast.walk(ast.parse(p.read_text(), rel)):
            if not isinstance(node, ast.Call):
                continue
            f = node.func
            name = f.id if isinstance(f, ast.Name) else f.attr if isinstance(f, ast.Attribute) \
                else None
            owner = getattr(getattr(f, "value", None), "id", None)
            if name == "new_attempt_id" or (owner == "attempts" and name in ("begin", "end")):
                yield f"{rel}:{node.lineno}: {owner}.{name}" if owner else \
                    f"{rel}:{node.lineno}: {name}"
            if name == "finish" and node.args and isinstance(node.args[0], ast.Attribute) \
                    and node.args[0].attr in OWN:
                yield f"{rel}:{node.lineno}: finish({node.args[0].attr})"


def test_the_steps_around_a_commit_have_one_home():
    assert list(_scan()) == []


def test_the_scan_sees_the_calls_it_forbids(tmp_path):
    (tmp_path / "engine").mkdir()
    (tmp_path / "engine" / "probe.py").write_text(
        "from . import attempts, commit, naming\n"
        "def f(s, p):\n"
        "    a = naming.new_attempt_id()\n"
        "    attempts.begin(s, p, a)\n"
        "    commit.finish(commit.Kind.SAVE, s, p, None)\n"
        "    commit.finish(commit.Kind.RECORD, s, p, None)\n"
        "    attempts.end(s, p, a)\n")
    assert [x.split(": ", 1)[1] for x in _scan(tmp_path)] == [
        "naming.new_attempt_id", "attempts.begin", "finish(SAVE)", "attempts.end"]


# -- the object -----------------------------------------------------------------------------
def _markers(path):
    return sorted(n for n in os.listdir(path) if attempts.is_marker(n)) \
        if os.path.isdir(path) else []


def _index(tmp_path, attempt):
    """A committable index of ``attempt``: a copy of a saved checkpoint's, its files
    copied beside it under the attempt's names."""
    src = tmp_path / "src"
    pyckpt.save({"a": np.arange(4.0)}, src)
    m = commit.read_previous(LocalStore(), str(src))
    files = []
    for i, f in enumerate(m.files):
        name = f"data-{attempt}-00000-{i:04d}.bin"
        (tmp_path / "ck" / name).write_bytes((src / f.name).read_bytes())
        files.append(type(f)(name, f.size))
    return commit.copied_index(m, files, m.blocks, {**m.info, "attempt": attempt})


@pytest.mark.parametrize("kind", sorted(OWN))
def test_the_marker_lives_from_begin_to_the_commit(tmp_path, kind):
    store, path = LocalStore(), str(tmp_path / "ck")
    with Attempt.begin(Kind[kind], store, path) as a:
        assert a.live and _markers(path) == [attempts.marker_name(a.id)]
        assert attempts.is_live(store, path, a.id)
        manifest = a.finish(_index(tmp_path, a.id))
        assert not a.live and _markers(path) == []
    assert manifest.info["attempt"] == a.id
    assert pyckpt.load(path)["a"].tolist() == [0.0, 1.0, 2.0, 3.0]


@pytest.mark.parametrize("kind", sorted(OWN))
def test_the_marker_ends_after_a_failure(tmp_path, kind):
    path = str(tmp_path / "ck")
    with pytest.raises(OSError, match="disk full"):
        with Attempt.begin(Kind[kind], LocalStore(), path) as a:
            assert _markers(path) == [attempts.marker_name(a.id)]
            raise OSError("disk full")
    assert not a.live and _markers(path) == []


@pytest.mark.parametrize("kind", sorted(OWN))
def test_the_marker_ends_after_a_failed_commit(tmp_path, monkeypatch, kind):
    store, path = LocalStore(), str(tmp_path / "ck")
    real = LocalStore.write_atomic

    def write_atomic(self, p, data):
        if p.endswith(INDEX_NAME):
            raise OSError(5, "the index write failed")
        return real(self, p, data)

    a = Attempt.begin(Kind[kind], store, path)
    index = _index(tmp_path, a.id)
    monkeypatch.setattr(LocalStore, "write_atomic", write_atomic)
    with pytest.raises(OSError, match="index write failed"):
        a.finish(index)
    assert not a.live and _markers(path) == []
    assert not os.path.exists(os.path.join(path, INDEX_NAME))


def test_an_attempt_commits_once_and_not_after_its_end(tmp_path):
    store, path = LocalStore(), str(tmp_path / "ck")
    a = Attempt.begin(Kind.SAVE, store, path)
    index = _index(tmp_path, a.id)
    a.finish(index)
    with pytest.raises(CheckpointError, match=f"attempt {a.id} .* is finished"):
        a.finish(index)
    b = Attempt.begin(Kind.SAVE, store, path)
    b.end()
    b.end()  # once
    with pytest.raises(CheckpointError, match=f"attempt {b.id} .* is ended"):
        b.finish(index)
    assert commit.read_previous(store, path).info["attempt"] == a.id


def test_an_attempt_commits_only_its_own_index(tmp_path):
    store, path = LocalStore(), str(tmp_path / "ck")
    a = Attempt.begin(Kind.SAVE, store, path)
    with pytest.raises(ValueError, match=f"attempt {a.id} .* names attempt 'feedfeedfeed'"):
        a.finish(_index(tmp_path, "feedfeedfeed"))
    assert _markers(path) == [] and not os.path.exists(os.path.join(path, INDEX_NAME))


@pytest.mark.parametrize("kind", sorted(set(Kind.__members__) - OWN))
def test_kinds_that_commit_another_attempts_index_have_no_attempt(tmp_path, kind):
    with pytest.raises(ValueError, match=f"a {kind} commit has no attempt of its own"):
        Attempt.begin(Kind[kind], LocalStore(), str(tmp_path / "ck"))
    assert _markers(tmp_path / "ck") == []


# -- the routes ------------------------------------------------------------------------------
def _single_process_routes(tmp_path):
    store = LocalStore()
    src = tmp_path / "src"
    pyckpt.save({"a": np.arange(8.0)}, src)
    run = tmp_path / "run"
    first = incremental.save_incremental(store, str(run / "ck-1"), [("a", np.arange(8.0))],
                                         None)
    base = incremental.Base("ck-1", str(run / "ck-1"), first)
    return {
        "save": (lambda p: writer.save_tensors(store, p, [("a", np.ones(4))]), "write_data"),
        "incremental": (lambda p: incremental.save_incremental(
            store, p, [("a", np.arange(8.0))], base), "write_data"),
        "copy": (lambda p: copies.copy_checkpoint(str(src), p), "copy_file"),
        "copy_referencing": (lambda p: copies.copy_checkpoint(
            str(run / "ck-1"), p, base=base), "write_data"),
    }, run


ROUTES = ["save", "incremental", "copy", "copy_referencing"]
_MODULES = {"write_data": writer, "copy_file": copies}


@pytest.mark.parametrize("route", ROUTES)
@pytest.mark.parametrize("fails", [False, True])
def test_each_route_writes_inside_its_attempt(tmp_path, monkeypatch, route, fails):
    routes, run = _single_process_routes(tmp_path)
    save, step = routes[route]
    path = str(run / "ck-2")
    module = _MODULES[step]
    real = getattr(module, step)
    seen = []

    def spy(*a, **k):
        seen.append(_markers(path))
        if fails:
            raise OSError("the write failed")
        return real(*a, **k)

    for m in (writer, copies, incremental):  # the name each route calls it by
        if hasattr(m, step):
            monkeypatch.setattr(m, step, spy)
    if fails:
        with pytest.raises(OSError, match="the write failed"):
            save(path)
    else:
        save(path)
        assert commit.read_previous(LocalStore(), path) is not None
    assert seen and len(seen[0]) == 1  # the marker, before the first data byte
    assert _markers(path) == []


def test_a_multi_worker_save_leaves_the_marker_to_rank_0(tmp_path, monkeypatch):
    path = str(tmp_path / "ck")
    seen = {}
    real = writer.write_data

    def spy(store, p, tensors, *, attempt, rank=0, **k):
        seen[rank] = (attempt, _markers(path))
        return real(store, p, tensors, attempt=attempt, rank=rank, **k)

    monkeypatch.setattr(writer, "write_data", spy)

    def body(comm):
        distributed_save(comm, LocalStore(), path,
                         [("rows", pyckpt.PerWorker(np.full((2, 4), float(comm.rank))))])

    for r in ThreadGroup(2).run(body):
        assert not isinstance(r, BaseException), r
    attempt = commit.read_previous(LocalStore(), path).info["attempt"]
    assert seen == {r: (attempt, [attempts.marker_name(attempt)]) for r in (0, 1)}
    assert _markers(path) == []


def test_a_refused_incremental_multi_worker_save_ends_its_attempt(tmp_path, monkeypatch):
    path = str(tmp_path / "ck")

    def broken(*a, **k):
        raise OSError("cannot fingerprint")

    monkeypatch.setattr(winc, "block_hashes", broken)

    def body(comm):
        distributed_save(comm, LocalStore(), path,
                         [("rows", pyckpt.PerWorker(np.full((2, 4), float(comm.rank))))],
                         incremental=True)

    for r in ThreadGroup(2).run(body):
        assert isinstance(r, ValueError) and "cannot fingerprint" in str(r), r
    assert _markers(path) == []


def test_rank_0_ends_its_attempt_when_the_plan_cannot_reach_the_workers(tmp_path, monkeypatch):
    """Before: a collective that failed after rank 0 began the attempt left its marker
    (live for the rest of the process: the attempt's files were never swept)."""
    path = str(tmp_path / "ck")

    def broadcast(self, obj=None, root=0):  # the plan's, on every worker
        raise WorkerTimeoutError("the plan did not reach the workers")

    monkeypatch.setattr(ThreadComm, "broadcast", broadcast)

    def body(comm):
        distributed_save(comm, LocalStore(), path,
                         [("rows", pyckpt.PerWorker(np.full((2, 4), float(comm.rank))))])

    for r in ThreadGroup(2).run(body):
        assert isinstance(r, WorkerTimeoutError), r
    assert os.path.isdir(path) and _markers(path) == []
