import os

import numpy as np
import pytest

# `pytest -m "not slow"` (README, "Building and testing"): the quick run leaves out
# the multi-process jobs (torchrun, mpiexec), the tests that stall or kill storage
# servers, TensorFlow in subprocesses, the type check and the longest end-to-end
# runs. CI runs everything. One table, by file or by test (node id prefix):
SLOW = (
    "tests/multiworker/test_processes.py", "tests/multiworker/test_tiers_torchrun.py",
    "tests/multiworker/test_async_commit.py", "tests/multiworker/test_per_worker.py",
    "tests/multiworker/test_readme_workers.py",
    "tests/stores/test_stalls.py", "tests/stores/test_fault_proxy.py",
    "tests/stores/test_exit_when_store_dies.py", "tests/stores/test_server_leftovers.py",
    "tests/stores/test_readme_s3.py", "tests/stores/test_cli_s3.py",
    "tests/stores/test_store_errors.py::test_cli_gs_check",
    "tests/interop_tf/test_write_tf.py", "tests/manager/test_crash.py",
    "tests/manager/test_tiers.py::test_server_lost_during_upload",
    "tests/manager/test_tiers.py::test_sigkill_during_tiered_saves",
    "tests/integration/", "tests/unit/test_typing.py",
    "tests/commands/test_cli_errors_and_help.py::test_closed_port", "tests/commands/test_cli_errors_and_help.py::test_endpoint_that",
    "tests/commands/test_cli_errors_and_help.py::test_gcs_endpoint",
)


# Tests run in parallel (pytest-xdist, `-n` in pyproject.toml): most of the suite waits
# on servers, subprocesses and disks, not on the 2 cores. These measure the machine
# itself (stall deadlines, processes left running, exit times) and run alone:
# each takes every other worker's turn (`_Turn` below), one at a time.
EXCLUSIVE = (
    "tests/stores/test_stalls.py", "tests/stores/test_server_leftovers.py",
    "tests/stores/test_exit_when_store_dies.py", "tests/stores/test_fault_proxy.py",
    "tests/stores/test_route_conformance.py", "tests/multiworker/test_protocol.py",
)


#: modules whose module-scoped fixture does the work of all their tests at once (the
#: memory suite starts every case's child process up front): under pytest-xdist each
#: worker has every collected item, so such a module spread over 4 workers ran its
#: children 4 times. Each runs on one worker (an xdist_group per file).
ONE_WORKER = ("tests/memory/test_flat_memory.py",)


@pytest.hookimpl(tryfirst=True)  # before xdist reads the xdist_group markers
def pytest_collection_modifyitems(config, items):
    root = str(config.rootpath)
    for item in items:
        node = os.path.relpath(str(item.path), root).replace(os.sep, "/") + "::" + item.name
        if node.startswith(SLOW):
            item.add_marker(pytest.mark.slow)
        if node.startswith(ONE_WORKER):
            item.add_marker(pytest.mark.xdist_group(node.split("::", 1)[0]))
        if node.startswith(EXCLUSIVE):
            item.add_marker(pytest.mark.exclusive)
            # and each such file on one worker, in its order, as in one process (their
            # module's server and its "stopped answering" state pass from test to test)
            item.add_marker(pytest.mark.xdist_group(node.split("::", 1)[0]))


@pytest.hookimpl(trylast=True)
def pytest_collection_finish(session):
    """The groups hold (on an xdist worker, after xdist named each grouped item's group
    in its node id): pytest 9.2 derives node ids from another field than the one
    pytest-xdist 3.8 sets, and every group was silently spread over the workers (the
    memory suite ran 4 times, an exclusive module's shared server state broke)."""
    if not (os.environ.get("PYTEST_XDIST_WORKER") and session.config.getvalue("loadgroup")):
        return
    lost = [it.nodeid for it in session.items
            if it.get_closest_marker("xdist_group") is not None and "@" not in it.nodeid]
    if lost:
        raise pytest.UsageError(
            f"pytest-xdist's --dist loadgroup cannot group tests with pytest "
            f"{pytest.__version__} ({len(lost)} grouped tests lost their group, e.g. "
            f"{lost[0]}): install the test extra's pytest (pyproject.toml)")


class _Turn:
    """This worker's hold on the machine-wide turn (lock files all workers see, beside
    their base temporary directories): a shared lock while one test runs; an exclusive
    one for an exclusive module (EXCLUSIVE: its tests run on one worker, in order), taken
    once for all its tests. Every taker passes a gate lock, which an exclusive holder
    keeps throughout: no new test starts while it waits for the running ones to end, and
    it gets in without waiting for the workers to run dry.

    Taken in ``pytest_runtest_protocol`` outside pytest-timeout's timer: waiting for
    other workers' exclusive modules is not this test's time. Taken in a fixture, that
    wait counted against the test's 600 s, and a test that lost the gate to several
    exclusive modules in a row timed out in its setup (CI of stop 42)."""

    def __init__(self):
        self.files = None  # (gate, main) while held
        self.module = None  # the exclusive module held for, if any

    def take(self, config, exclusive: bool) -> None:
        import fcntl
        import pathlib

        shared = pathlib.Path(config.option.basetemp).parent  # xdist: <base>/popen-gwN
        gate = open(shared / "pyckpt-turn-gate", "a+b")
        main = open(shared / "pyckpt-turn", "a+b")
        try:
            fcntl.flock(gate, fcntl.LOCK_EX)
            fcntl.flock(main, fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH)
            if not exclusive:
                fcntl.flock(gate, fcntl.LOCK_UN)
        except BaseException:
            gate.close()
            main.close()
            raise
        self.files = (gate, main)

    def release(self) -> None:
        """Closing the files releases the locks."""
        for f in self.files or ():
            f.close()
        self.files = self.module = None


_TURN = _Turn()


def _exclusive_module(item) -> str | None:
    if item is None:
        return None
    rel = os.path.relpath(str(item.path), str(item.config.rootpath)).replace(os.sep, "/")
    return rel if rel.startswith(EXCLUSIVE) else None


@pytest.hookimpl(hookwrapper=True, tryfirst=True)
def pytest_runtest_protocol(item, nextitem):
    """Under pytest-xdist, every test runs holding its turn (``_Turn``); an exclusive
    module keeps its turn from its first test to its last (taken per test, each of its
    ~40 tests waited for the longest test then running on the other workers).

    ``PYCKPT_TEST_TIMELINE=<file>``: one line per test (worker, start, end, node id,
    setup and teardown included, the wait for the turn not) appended to that file: where
    a parallel run's wall time goes (idle workers, exclusive modules)."""
    parallel = bool(os.environ.get("PYTEST_XDIST_WORKER")) and item.config.option.basetemp
    module = _exclusive_module(item)
    if parallel and _TURN.files is None:
        _TURN.take(item.config, exclusive=module is not None)
        _TURN.module = module
    import time

    t0 = time.time()
    try:
        yield
    finally:
        t1 = time.time()
        if _TURN.files is not None and (
                _TURN.module is None or _exclusive_module(nextitem) != _TURN.module):
            _TURN.release()
    path = os.environ.get("PYCKPT_TEST_TIMELINE")
    if path:
        import json

        with open(path, "a") as f:
            f.write(json.dumps([os.environ.get("PYTEST_XDIST_WORKER", "main"), t0, t1,
                                item.nodeid]) + "\n")


@pytest.fixture
def late_engine():
    """A copy engine whose copies land late and shuffled (pyckpt.testing.late_copies),
    for the device paths of the doors without a GPU; synchronized, and the staging
    memory it used released, after the test."""
    import pyckpt.device
    from pyckpt.testing.late_copies import LateCopyEngine

    eng = LateCopyEngine(delay=0.01, seed=5)
    yield eng
    eng.synchronize()
    pyckpt.device.release_staging_memory()


@pytest.fixture
def rng():
    return np.random.default_rng(1234)


@pytest.fixture
def ckpt_dir(tmp_path):
    """A path for one checkpoint (not yet existing)."""
    return str(tmp_path / "ckpt")


def flip_byte(path: str, pos: int, bit: int = 0x01) -> None:
    with open(path, "r+b") as f:
        f.seek(pos)
        b = f.read(1)
        f.seek(pos)
        f.write(bytes([b[0] ^ bit]))


@pytest.fixture
def flip():
    return flip_byte


def data_files(path: str) -> list[str]:
    return sorted(os.path.join(path, n) for n in os.listdir(path) if n.startswith("data-"))


@pytest.fixture
def shard_files():
    return data_files


@pytest.fixture(scope="module")
def seaweed_server():
    """A SeaweedFS server of the test module's own (its tests may stop and restart
    it) with a bucket ``pyckpt``; under PYCKPT_REQUIRE_ALL (CI) a server that cannot
    start fails the test, never skips it."""
    from pyckpt.testing import servers
    from pyckpt.testing.requirements import REQUIRE_ALL, require

    require("s3fs", "a storage server or its client")
    try:
        ctx = servers.seaweedfs_server()
        server = ctx.__enter__()
    except RuntimeError as e:
        if REQUIRE_ALL:
            pytest.fail(f"PYCKPT_REQUIRE_ALL=1 but SeaweedFS did not start: {e}")
        pytest.skip(str(e))
    servers.make_bucket("s3", server.options, "pyckpt")
    yield server
    ctx.__exit__(None, None, None)
