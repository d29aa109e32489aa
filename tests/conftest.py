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


def pytest_collection_modifyitems(config, items):
    root = str(config.rootpath)
    for item in items:
        node = os.path.relpath(str(item.path), root).replace(os.sep, "/") + "::" + item.name
        if node.startswith(SLOW):
            item.add_marker(pytest.mark.slow)
        if node.startswith(EXCLUSIVE):
            item.add_marker(pytest.mark.exclusive)
            # and each such file on one worker, in its order, as in one process (their
            # module's server and its "stopped answering" state pass from test to test)
            item.add_marker(pytest.mark.xdist_group(node.split("::", 1)[0]))


@pytest.fixture(autouse=True)
def _turn(request, tmp_path_factory):
    """Under pytest-xdist: every test holds a shared lock on a file all workers see,
    an ``exclusive`` test an exclusive one. A gate lock, taken briefly by every test
    on its way in and held by an exclusive test throughout, lets an exclusive test in
    once the running tests end, without waiting for the workers to run dry."""
    if not os.environ.get("PYTEST_XDIST_WORKER"):
        yield
        return
    import fcntl

    shared = tmp_path_factory.getbasetemp().parent
    gate = open(shared / "pyckpt-turn-gate", "a+b")
    main = open(shared / "pyckpt-turn", "a+b")
    alone = request.node.get_closest_marker("exclusive") is not None
    try:
        fcntl.flock(gate, fcntl.LOCK_EX)
        fcntl.flock(main, fcntl.LOCK_EX if alone else fcntl.LOCK_SH)
        if not alone:
            fcntl.flock(gate, fcntl.LOCK_UN)
        yield
    finally:
        gate.close()  # closing releases the locks
        main.close()


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
