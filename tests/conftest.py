import os

import numpy as np
import pytest


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
