import contextlib
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
# each takes every other worker's turn (`_turn` below), one at a time.
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


#: this worker holds the machine for an exclusive module (``_module_turn``)
_HOLDING: list[str] = []


@contextlib.contextmanager
def _machine(tmp_path_factory, exclusive: bool):
    """Holds the machine-wide turn (files all workers see): a shared lock for one test,
    an exclusive one for an exclusive module, each taken through the gate lock (held
    throughout by an exclusive holder, so that no new test starts while it waits for
    the running ones to end). Closing the files releases the locks."""
    import fcntl

    shared = tmp_path_factory.getbasetemp().parent
    gate = open(shared / "pyckpt-turn-gate", "a+b")
    main = open(shared / "pyckpt-turn", "a+b")
    try:
        fcntl.flock(gate, fcntl.LOCK_EX)
        fcntl.flock(main, fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH)
        if not exclusive:
            fcntl.flock(gate, fcntl.LOCK_UN)
        yield
    finally:
        gate.close()
        main.close()


@pytest.fixture(scope="module", autouse=True)
def _module_turn(request, tmp_path_factory):
    """Under pytest-xdist, an exclusive module (EXCLUSIVE: its tests run on one worker,
    in order) takes the machine once for all its tests: the gate, then the exclusive
    lock once the running tests ended, both held until its last test ended. Taken per
    test, every one of its ~40 tests waited for the longest test then running on the
    other workers (a drain each), while the gate kept them idle."""
    rel = os.path.relpath(str(request.node.path), str(request.config.rootpath))
    if not os.environ.get("PYTEST_XDIST_WORKER") or not rel.replace(os.sep, "/").startswith(
            EXCLUSIVE):
        yield
        return
    with _machine(tmp_path_factory, exclusive=True):
        _HOLDING.append(rel)
        try:
            yield
        finally:
            _HOLDING.remove(rel)


@pytest.fixture(autouse=True)
def _turn(request, tmp_path_factory):
    """Under pytest-xdist: every test holds a shared lock on a file all workers see
    while it runs; an exclusive module holds it exclusively (``_module_turn``). A gate
    lock, taken briefly by every test on its way in and held by an exclusive module
    throughout, lets the exclusive module in once the running tests end, without
    waiting for the workers to run dry. A worker holding the machine runs its tests
    without locks (a second lock of its own would wait for itself)."""
    if not os.environ.get("PYTEST_XDIST_WORKER") or _HOLDING:
        yield
        return
    with _machine(tmp_path_factory, exclusive=False):
        yield


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    """``PYCKPT_TEST_TIMELINE=<file>``: one line per test (worker, start, end, node id,
    setup and teardown included) appended to that file: where a parallel run's wall
    time goes (idle workers, exclusive modules)."""
    path = os.environ.get("PYCKPT_TEST_TIMELINE")
    if not path:
        yield
        return
    import json
    import time

    t0 = time.time()
    yield
    with open(path, "a") as f:
        f.write(json.dumps([os.environ.get("PYTEST_XDIST_WORKER", "main"), t0, time.time(),
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
