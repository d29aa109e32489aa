"""The background jobs of pyckpt/jobs.py (issue 39 item 3: one background executor for
saves and persists, one shutdown path): order within a lane, concurrency across
lanes, errors kept on the handle, ``join`` from within a job, ``drain``, and the exit
path (a job running when the main thread ends still completes, then the finalizers
run)."""

import os
import subprocess
import sys
import textwrap
import threading
import time

import pytest

from pyckpt import jobs

WAIT = 60  # bounds a wait that only a broken executor makes long


@pytest.fixture(autouse=True)
def _no_job_left():
    yield
    assert jobs.drain(WAIT), "a test left a job running"


def test_jobs_of_one_lane_run_in_submission_order():
    done = []

    def job(i):
        def run():
            time.sleep((3 - i) * 0.05)  # the earlier a job, the longer it runs
            done.append(i)
        return run

    lane = object()
    handles = [jobs.submit(job(i), f"job-{i}", lane=lane) for i in range(4)]
    for h in handles:
        h.wait(WAIT)
    assert done == [0, 1, 2, 3]


def test_jobs_of_distinct_lanes_run_concurrently():
    """A job of lane a waits for one of lane b submitted after it (and a job without a
    lane for both): with one queue for all, they would never end."""
    b_ran, free_ran = threading.Event(), threading.Event()
    a = jobs.submit(lambda: b_ran.wait(WAIT) and free_ran.wait(WAIT), "a", lane="a")
    b = jobs.submit(b_ran.set, "b", lane="b")
    free = jobs.submit(free_ran.set, "free")
    assert a.wait(WAIT) is True
    assert b.done() and free.done()


def test_a_lane_outlives_a_failed_job():
    lane = object()
    failed = jobs.submit(lambda: 1 / 0, "fails", lane=lane)
    after = jobs.submit(lambda: "ran", "after", lane=lane)
    assert after.wait(WAIT) == "ran"
    assert isinstance(failed.error, ZeroDivisionError)


def test_an_error_is_kept_on_the_handle():
    def fails():
        raise ValueError("boom")

    job = jobs.submit(fails, "fails")
    assert job.join(WAIT) is True  # join never raises
    assert job.done()
    assert isinstance(job.error, ValueError)
    with pytest.raises(ValueError, match="boom"):
        job.wait(WAIT)
    assert "failed" in repr(job)


def test_wait_returns_the_result_and_times_out():
    gate = threading.Event()
    job = jobs.submit(lambda: gate.wait(WAIT) and 42, "held")
    with pytest.raises(TimeoutError, match="held"):
        job.wait(0.01)
    assert not job.done() and job.error is None
    gate.set()
    assert job.wait(WAIT) == 42


def test_join_from_within_the_job_is_a_no_op():
    me = []
    ready = threading.Event()

    def run():
        ready.wait(WAIT)
        return me[0].join(), me[0].running_here()

    me.append(jobs.submit(run, "self"))
    ready.set()
    assert me[0].wait(WAIT) == (False, True)
    assert not me[0].running_here()


def test_jobs_are_not_daemons_unless_asked():
    gate = threading.Event()
    job = jobs.submit(gate.wait, "plain")
    warm = jobs.submit(gate.wait, "warm", daemon=True)
    try:
        assert not job.thread.daemon and job.thread.name == "plain"
        assert warm.thread.daemon
        assert job in jobs.pending() and warm not in jobs.pending()  # exit waits for one
    finally:
        gate.set()
    warm.wait(WAIT)


def test_drain_waits_for_every_job_and_the_jobs_they_submit():
    gate = threading.Event()
    later = []

    def first():
        gate.wait(WAIT)
        later.append(jobs.submit(lambda: gate.wait(WAIT) and "second", "second"))

    job = jobs.submit(first, "first")
    assert jobs.drain(0.01) is False  # held by the gate: not drained
    assert job in jobs.pending()
    gate.set()
    assert jobs.drain(WAIT) is True
    assert job.done() and later[0].done() and later[0].wait() == "second"
    assert jobs.pending() == []


def test_drain_from_within_a_job_does_not_wait_for_itself():
    job = jobs.submit(lambda: jobs.drain(WAIT), "drains")
    assert job.wait(WAIT) is True


@pytest.mark.skipif(not hasattr(os, "fork"), reason="no os.fork")
def test_a_forked_child_drains_only_its_own_jobs():
    gate = threading.Event()
    held = jobs.submit(gate.wait, "held in the parent", lane="forked")
    try:
        pid = os.fork()
        if pid == 0:  # the child: the parent's job has no thread here
            ok = jobs.pending() == [] and held.done() and jobs.drain(0)
            ok = ok and jobs.submit(lambda: 1, "child", lane="forked").wait(5) == 1
            os._exit(0 if ok else 1)
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0
        assert not held.done()  # in the parent it still runs
    finally:
        gate.set()


CHILD = textwrap.dedent("""
    import os, sys, threading
    from pyckpt import jobs
    out = sys.argv[1]

    def job():
        threading.main_thread().join()  # runs on after the main thread ended
        with open(os.path.join(out, "job"), "w") as f:
            f.write("done")

    def finalizer(tag):
        def run():
            with open(os.path.join(out, "finalizers"), "a") as f:
                f.write(f"{tag}:{os.path.exists(os.path.join(out, 'job'))} ")
            if tag == "b":
                raise RuntimeError("a failing finalizer does not stop the others")
        return run

    a, b = finalizer("a"), finalizer("b")
    jobs.at_shutdown(a)
    jobs.at_shutdown(b)
    jobs.at_shutdown(a)  # registered once
    jobs.submit(job, "at-exit")
    print("main ends", flush=True)
""")


def test_a_job_running_at_exit_completes_then_the_finalizers_run(tmp_path):
    run = subprocess.run([sys.executable, "-c", CHILD, str(tmp_path)], capture_output=True,
                         text=True, timeout=120, cwd=tmp_path)
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip() == "main ends"
    assert (tmp_path / "job").read_text() == "done"
    # newest first, each after the job ended
    assert (tmp_path / "finalizers").read_text().split() == ["b:True", "a:True"]


def test_shutdown_runs_no_finalizer_while_a_job_runs():
    gate, ran = threading.Event(), []

    def finalizer():
        ran.append(1)

    jobs.at_shutdown(finalizer)
    try:
        job = jobs.submit(gate.wait, "held")
        assert jobs.shutdown(0.01) is False
        assert ran == []
        gate.set()
        job.wait(WAIT)
    finally:
        jobs._FINALIZERS.remove(finalizer)  # this process's other finalizers stay
