"""One home of manifests and commits (issue 39 item 1, stage 1a): pyckpt/engine/commit.py
builds every checkpoint's index from what was written and commits it; the steps a
commit runs follow from its ``Kind`` (the module doc's table), never from flags.

- the source scan: ``build_manifest``, ``Manifest(...)``, ``encode_index``, ``Commit``
  and ``commit_checkpoint`` are called in commit.py only (the format layer defines
  them); no caller passes step flags;
- the table of commit.py's docstring is the one ``STEPS`` holds;
- each kind's distinguishing steps, on a local store;
- each door commits with its kind (a spy on ``commit.finish``).

Already covered elsewhere, through the doors: an index that landed though its write
raised counts as committed, one that did not deletes the attempt's files and keeps the
previous checkpoint (tests/engine/test_commit.py); the sweep of a save
(tests/engine/test_orphans.py); node-local records, replicas and their restore
(tests/manager/test_tiers_nodes.py); persists (tests/manager/test_tiers.py); the
multi-worker commit's failures (tests/test_save_nonblocking.py,
tests/manager/test_save_outcomes.py)."""

import ast
import json
import os
import pathlib
import shutil
import socket
import time

import numpy as np
import pytest

import pyckpt
from pyckpt.engine import commit, incremental
from pyckpt.engine.commit import Kind
from pyckpt.engine.copy import commit_copied, copy_checkpoint
from pyckpt.format import INDEX_NAME
from pyckpt.storage.local import LocalStore
from pyckpt.testing.thread_comm import ThreadGroup
from pyckpt.workers.save import distributed_save

ROOT = pathlib.Path(pyckpt.__file__).parent
HOME = "engine/commit.py"
#: none left: workers/planned_save.py (torch DCP's saves) moved in stage 1b
ALLOWED: set[str] = set()
#: building and committing an index: called in HOME only (the format layer defines them)
CALLS = {"build_manifest", "Manifest", "encode_index", "Commit", "commit_checkpoint"}
FLAGS = {"new_files", "delete_replaced", "sweep", "end_attempt"}


def _calls(tree):
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            f = node.func
            name = f.id if isinstance(f, ast.Name) else f.attr if isinstance(f, ast.Attribute) \
                else None
            yield node, name


def test_manifests_are_built_and_committed_in_one_module():
    found = []
    for p in sorted(ROOT.rglob("*.py")):
        rel = p.relative_to(ROOT).as_posix()
        if rel == HOME or rel in ALLOWED or rel.startswith("format/"):
            continue
        for node, name in _calls(ast.parse(p.read_text(), rel)):
            if name in CALLS or (name == "commit" and isinstance(node.func, ast.Attribute)
                                 and getattr(node.func.value, "id", None) == "writer"):
                found.append(f"{rel}:{node.lineno}: {name}")
            if name == "finish" and {k.arg for k in node.keywords} & FLAGS:
                found.append(f"{rel}:{node.lineno}: step flags")
    assert found == []


def test_the_old_entry_point_is_gone():
    assert not hasattr(commit, "Commit") and not hasattr(commit, "commit_checkpoint")


def test_the_docstring_table_is_the_steps():
    rows = {}
    for line in commit.__doc__.splitlines():
        words = line.split()
        if words and words[0] in Kind.__members__ and {*words[-4:]} <= {"yes", "no"}:
            rows[Kind[words[0]]] = tuple(w == "yes" for w in words[-4:])
    assert rows == {k: (s.own, s.abandon, s.delete, s.sweep) for k, s in commit.STEPS.items()}


# -- each kind's steps -----------------------------------------------------------------------
#: kind: (own: a landed index counts, abandon: a failed commit deletes the new files,
#:        delete: the replaced index's files go, sweep: a dead attempt's files go)
EXPECTED = {
    Kind.SAVE: (True, True, True, True),
    Kind.WORKERS: (True, False, True, True),
    Kind.COPY: (True, True, True, False),
    Kind.PERSIST: (False, False, False, True),
    Kind.RECORD: (False, False, False, False),
}


def _data(path):
    return {n for n in os.listdir(path) if n.startswith("data-")}


def _setup(tmp_path):
    """A committed checkpoint at ``ck`` (its files: ``old``, of an attempt marked live:
    only step 4 deletes them, never the sweep), a dead attempt's file there (``orphan``),
    and the files of a new index (``manifest``, ``new``) beside them."""
    path, src = tmp_path / "ck", tmp_path / "src"
    pyckpt.save({"a": np.zeros(4)}, path)
    attempt = commit.read_previous(LocalStore(), str(path)).info["attempt"]
    (path / f"pyckpt-attempt-{attempt}.json").write_text(json.dumps(
        {"host": socket.gethostname(), "pid": os.getppid(), "time": time.time()}))
    pyckpt.save({"a": np.ones(4)}, src)
    old, new = _data(path), _data(src)
    for n in new:
        shutil.copy(src / n, path / n)
    orphan = "data-0123456789ab-00000-0000.bin"
    (path / orphan).write_bytes(b"\0" * 64)
    store = LocalStore()
    return store, str(path), old, new, orphan, commit.read_previous(store, str(src))


@pytest.mark.parametrize("kind", list(Kind))
def test_steps_of_a_commit(tmp_path, kind):
    _, _, delete, sweep = EXPECTED[kind]
    store, path, old, new, orphan, manifest = _setup(tmp_path)
    assert commit.finish(kind, store, path, manifest) is manifest
    assert pyckpt.load(path)["a"].tolist() == [1.0] * 4
    left = _data(path)
    assert new <= left
    assert (old & left == set()) == delete
    assert (orphan not in left) == sweep


def _failing_index_write(monkeypatch, lands):
    real = LocalStore.write_atomic

    def write_atomic(self, path, data):
        if path.endswith(INDEX_NAME):
            if lands:
                real(self, path, data)
            raise OSError(5, "the answer was lost")
        return real(self, path, data)

    monkeypatch.setattr(LocalStore, "write_atomic", write_atomic)


@pytest.mark.parametrize("kind", list(Kind))
def test_a_failed_commit(tmp_path, monkeypatch, kind):
    _, abandon, _, _ = EXPECTED[kind]
    store, path, old, new, orphan, manifest = _setup(tmp_path)
    _failing_index_write(monkeypatch, lands=False)
    with pytest.raises(OSError, match="answer was lost"):
        commit.finish(kind, store, path, manifest)
    monkeypatch.undo()
    assert pyckpt.load(path)["a"].tolist() == [0.0] * 4  # the previous one stays
    left = _data(path)
    assert old | {orphan} <= left
    assert (new & left == set()) == abandon


@pytest.mark.parametrize("kind", list(Kind))
def test_an_index_that_landed_counts_only_for_its_own_attempt(tmp_path, monkeypatch, kind):
    own = EXPECTED[kind][0]
    store, path, _, new, _, manifest = _setup(tmp_path)
    _failing_index_write(monkeypatch, lands=True)
    if own:
        commit.finish(kind, store, path, manifest)
    else:
        with pytest.raises(OSError, match="answer was lost"):
            commit.finish(kind, store, path, manifest)
    monkeypatch.undo()
    assert pyckpt.load(path)["a"].tolist() == [1.0] * 4
    assert new <= _data(path)


def test_an_own_commit_needs_its_attempt_in_the_index(tmp_path):
    store, path, _, _, _, manifest = _setup(tmp_path)
    manifest.info.pop("attempt")
    with pytest.raises(ValueError, match="names no attempt"):
        commit.finish(Kind.SAVE, store, path, manifest)


# -- each door commits with its kind ---------------------------------------------------------
@pytest.fixture
def kinds(monkeypatch):
    seen = []
    real = commit.finish

    def spy(kind, *a):
        seen.append(kind)
        return real(kind, *a)

    monkeypatch.setattr(commit, "finish", spy)
    return seen


def test_single_process_doors(tmp_path, kinds):
    store = LocalStore()
    pyckpt.save({"a": np.ones(4)}, tmp_path / "plain")
    assert kinds == [Kind.SAVE]
    run = tmp_path / "run"
    first = incremental.save_incremental(store, str(run / "ck-1"), [("a", np.ones(4))], None)
    assert kinds[1:] == [Kind.SAVE]
    base = incremental.Base("ck-1", str(run / "ck-1"), first)
    copy_checkpoint(str(tmp_path / "plain"), str(tmp_path / "copy"))
    copy_checkpoint(str(run / "ck-1"), str(run / "ck-2"), base=base)  # copy_referencing
    assert kinds[2:] == [Kind.COPY, Kind.COPY]
    assert commit.read_previous(store, str(run / "ck-2")).has_references
    (tmp_path / "persist").mkdir()
    for n in _data(tmp_path / "plain"):
        shutil.copy(tmp_path / "plain" / n, tmp_path / "persist" / n)
    commit_copied(store, str(tmp_path / "plain"), store, str(tmp_path / "persist"))
    assert kinds[4:] == [Kind.PERSIST]
    assert pyckpt.load(tmp_path / "persist")["a"].tolist() == [1.0] * 4


@pytest.mark.parametrize("blocking", [True, False])
def test_multi_worker_saves_commit_once_as_workers(tmp_path, kinds, blocking):
    path = str(tmp_path / "ck")

    def body(comm):
        state = {"rows": pyckpt.PerWorker(np.full((2, 8), float(comm.rank)))}
        h = pyckpt.save(state, path, comm=comm, blocking=blocking)
        return h if blocking else h.wait(timeout=60)

    for r in ThreadGroup(2).run(body):
        assert not isinstance(r, BaseException), r
    assert kinds == [Kind.WORKERS]


def test_a_node_local_save_commits_a_record_on_every_node(tmp_path, kinds):
    store = LocalStore()

    def body(comm):
        distributed_save(comm, store, str(tmp_path / f"node{comm.rank}" / "ck"),
                         [("rows", pyckpt.PerWorker(np.full((2, 8), float(comm.rank))))],
                         node_local=True, replicate=1)

    for r in ThreadGroup(2).run(body):
        assert not isinstance(r, BaseException), r
    assert kinds == [Kind.RECORD, Kind.RECORD]
