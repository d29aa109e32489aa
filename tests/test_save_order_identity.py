"""Saves of one process to one directory commit in the order of their calls, whatever
the spelling of the directory and whether they block (pyckpt/ordering.py).

Each race is made deterministic: the first save's commit is held (``pyckpt.engine.
commit.finish`` patched to wait on an Event) until the later save either finished
(the old code: it overtook the held one, whose older values then won) or queued
behind it; every wait is bounded."""

import os
import sys
import threading
import time

import numpy as np
import pytest

import pyckpt
from pyckpt import ordering, saving
from pyckpt.engine import commit as commits
from pyckpt.storage import resolve

WAIT = 60  # s: only reached when something is broken

OLD = {"a": np.ones(4, np.float32)}
NEW = {"a": np.full(4, 2, np.float32)}


class Gate:
    """Holds the first commit made while it is installed until ``release`` is set."""

    def __init__(self, monkeypatch):
        self.entered, self.release = threading.Event(), threading.Event()
        self._lock = threading.Lock()
        self._used = False
        real = commits.finish

        def commit(*a):
            with self._lock:
                first, self._used = not self._used, True
            if first:
                self.entered.set()
                self.release.wait(WAIT)
            return real(*a)

        monkeypatch.setattr(commits, "finish", commit)


def _queued(thread):
    """Whether ``thread`` waits for an earlier save's turn (ordering.Turn.wait)."""
    frame = sys._current_frames().get(thread.ident)
    while frame is not None:
        code = frame.f_code
        if code.co_name == "wait" and code.co_filename.endswith(
                os.path.join("pyckpt", "ordering.py")):
            return True
        frame = frame.f_back
    return False


def _finished_or_queued(thread, finished, bound=10.0):
    """Waits until the later save finished or queued behind the held one (bounded:
    a save waiting in some other way is let go after ``bound`` seconds)."""
    end = time.monotonic() + bound
    while time.monotonic() < end:
        if finished() or _queued(thread):
            return
        time.sleep(0.005)


def _in_thread(fn):
    errors = []

    def run():
        try:
            fn()
        except BaseException as e:  # noqa: BLE001 - re-raised by the test
            errors.append(e)

    t = threading.Thread(target=run)
    t.start()
    return t, errors


def _join(t, errors):
    t.join(WAIT)
    assert not t.is_alive(), "the save did not finish (deadlock?)"
    if errors:
        raise errors[0]


def _spellings(tmp_path, kind):
    """(first spelling, later spelling) of one checkpoint directory."""
    a = tmp_path / "a"
    a.mkdir()
    if kind == "symlinked parent":
        os.symlink(a, tmp_path / "link")
        return str(a / "ckpt"), str(tmp_path / "link" / "ckpt")
    if kind == "a/../a/ckpt":
        return str(a / "ckpt"), f"local://{tmp_path}/a/../a/ckpt"
    if kind == "// and ./":
        return str(a / "ckpt"), f"local://{tmp_path}//a/./ckpt"
    if kind == "trailing slash":
        return str(a / "ckpt"), f"local://{tmp_path}/a/ckpt/"
    assert kind == "plain trailing slash"
    return str(a / "ckpt"), str(a / "ckpt") + "/"


SPELLINGS = ["symlinked parent", "a/../a/ckpt", "// and ./", "trailing slash",
             "plain trailing slash"]


@pytest.mark.parametrize("kind", SPELLINGS)
def test_a_later_blocking_save_through_another_spelling_commits_last(tmp_path, monkeypatch,
                                                                      kind):
    """The order was keyed on the path's spelling: a save through a link (or another
    spelling) of the directory did not wait for the background save still running
    there, and that older save's values won."""
    first_path, later_path = _spellings(tmp_path, kind)
    gate = Gate(monkeypatch)
    first = pyckpt.save(OLD, first_path, blocking=False)
    assert gate.entered.wait(WAIT)
    t, errors = _in_thread(lambda: pyckpt.save(NEW, later_path))
    _finished_or_queued(t, lambda: not t.is_alive())
    gate.release.set()
    _join(t, errors)
    first.wait(WAIT)
    for p in (first_path, later_path):
        np.testing.assert_array_equal(pyckpt.load(p)["a"], NEW["a"])


@pytest.mark.parametrize("kind", SPELLINGS[:3])
def test_a_later_background_save_through_another_spelling_commits_last(tmp_path, monkeypatch,
                                                                        kind):
    one, other = _spellings(tmp_path, kind)
    gate = Gate(monkeypatch)
    first = pyckpt.save(OLD, other, blocking=False)
    assert gate.entered.wait(WAIT)
    later = pyckpt.save(NEW, one, blocking=False)
    _finished_or_queued(later._job.thread, later.done)
    gate.release.set()
    first.wait(WAIT)
    later.wait(WAIT)
    np.testing.assert_array_equal(pyckpt.load(one)["a"], NEW["a"])


@pytest.mark.parametrize("later_blocks", [False, True])
def test_a_blocking_save_in_another_thread_is_not_overtaken(tmp_path, monkeypatch,
                                                            later_blocks):
    """A blocking save running in one thread was overtaken by a later save from another
    thread (blocking saves took no turn): its older values were committed last."""
    path = str(tmp_path / "ckpt")
    gate = Gate(monkeypatch)
    t, errors = _in_thread(lambda: pyckpt.save(OLD, path))  # blocking, held in its commit
    assert gate.entered.wait(WAIT)
    if later_blocks:
        t2, errors2 = _in_thread(lambda: pyckpt.save(NEW, path))
        _finished_or_queued(t2, lambda: not t2.is_alive())
    else:
        later = pyckpt.save(NEW, path, blocking=False)
        _finished_or_queued(later._job.thread, later.done)
    gate.release.set()
    _join(t, errors)
    if later_blocks:
        _join(t2, errors2)
    else:
        later.wait(WAIT)
    np.testing.assert_array_equal(pyckpt.load(path)["a"], NEW["a"])


def test_a_blocking_save_from_a_completion_callback_does_not_deadlock(tmp_path, monkeypatch):
    """A background save's turn ends with its commit, before its callback: a blocking
    save made there (after another background save queued) waits for that one only."""
    path = str(tmp_path / "ckpt")
    gate = Gate(monkeypatch)
    third = {"a": np.full(4, 3, np.float32)}
    called = []

    def then(error):
        assert error is None
        pyckpt.save(third, path)  # called last: commits last
        called.append(True)

    first = saving.start(saving.SavePlan.build([saving.Item("a", OLD["a"])], path), then=then)
    assert gate.entered.wait(WAIT)
    second = pyckpt.save(NEW, path, blocking=False)  # queued behind the first
    _finished_or_queued(second._job.thread, second.done)
    gate.release.set()
    first.wait(WAIT)
    second.wait(WAIT)
    assert called
    np.testing.assert_array_equal(pyckpt.load(path)["a"], third["a"])


def test_a_save_from_a_progress_callback_does_not_deadlock(tmp_path, monkeypatch):
    """The progress monitor (its own thread) is joined after the save's turn ended: a
    callback that saves to the same place waits for the running save's commit, then
    commits after it (a turn held across the join would wait for it forever)."""
    path = str(tmp_path / "ckpt")
    gate = Gate(monkeypatch)
    called, nested_done, where = threading.Event(), threading.Event(), []

    def progress(done_bytes, total):
        if not called.is_set():
            where.append(threading.current_thread())
            called.set()
            pyckpt.save(NEW, path)  # called later than the save reporting progress
            nested_done.set()

    t, errors = _in_thread(lambda: pyckpt.save(OLD, path, progress=progress))
    assert gate.entered.wait(WAIT) and called.wait(WAIT)  # the monitor calls it meanwhile
    _finished_or_queued(where[0], nested_done.is_set)
    gate.release.set()
    _join(t, errors)
    assert nested_done.is_set()
    np.testing.assert_array_equal(pyckpt.load(path)["a"], NEW["a"])


def test_a_nested_blocking_save_takes_no_turn():
    """A thread holding a turn never waits for one (no deadlock): a blocking save made
    inside a save of the same thread is not ordered."""
    key = "/x/ckpt#0"
    outer = ordering.take(key, blocking=True)
    with outer.held():
        inner = ordering.take(key, blocking=True)
        with inner.held():  # would wait for ``outer`` forever if it took a turn
            pass
        background = ordering.take(key, blocking=False)  # waited for in its own thread

    def run():
        with background.held():
            pass

    t, errors = _in_thread(run)
    _join(t, errors)
    assert key not in ordering._NEWEST  # ended turns are forgotten


def test_the_identity_of_a_directory(tmp_path):
    (tmp_path / "real").mkdir()
    os.symlink(tmp_path / "real", tmp_path / "link")
    want = os.path.join(os.path.realpath(tmp_path), "real", "new", "ckpt")
    for spelling in (f"{tmp_path}/link/new/ckpt", f"{tmp_path}/real/new/ckpt/",
                     f"file://{tmp_path}/real/../link/new/ckpt",
                     f"local://{tmp_path}//link/./new/ckpt"):
        assert ordering.identity(*resolve(spelling)) == want, spelling
    keys = {ordering.identity(*resolve(u)) for u in (
        "memory://bucket/run/ckpt", "memory://bucket/run/ckpt/", "memory://bucket//run/./ckpt")}
    assert keys == {"memory://bucket/run/ckpt"}
    assert ordering.place(*resolve("memory://bucket/run/ckpt"), 3).endswith("#3")
