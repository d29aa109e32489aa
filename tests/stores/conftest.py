"""Real storage servers for the store tests, started once per session on 127.0.0.1.

Without the server packages the tests are skipped locally; CI sets
PYCKPT_REQUIRE_ALL=1, which turns a missing package into a failure.
"""

import uuid

import pytest

from pyckpt.testing import servers
from pyckpt.testing.requirements import require

def _need(*modules):
    for m in modules:
        require(m, "a storage server or its client")


@pytest.fixture(scope="session")
def seaweed_options():
    _need("s3fs")
    with servers.seaweedfs() as so:
        servers.make_bucket("s3", so, "pyckpt")
        yield so


@pytest.fixture(scope="session")
def moto_options():
    _need("s3fs", "moto", "flask")
    with servers.moto() as so:
        yield so


@pytest.fixture(scope="session")
def gcs_options():
    _need("gcsfs", "gcp_storage_emulator")
    with servers.gcs_emulator() as so:
        servers.make_bucket("gs", so, "pyckpt")
        yield so


def _unique():
    return uuid.uuid4().hex[:12]


@pytest.fixture
def moto_bucket(moto_options):
    servers.moto_reset(moto_options)
    servers.make_bucket("s3", moto_options, "pyckpt")
    return moto_options


@pytest.fixture(params=["memory", "seaweedfs", "moto", "gcs"])
def remote(request):
    """(URL prefix unique to this test, storage_options) on every kind of store."""
    kind = request.param
    if kind == "memory":
        return f"memory://pyckpt-tests/{_unique()}", None
    if kind == "seaweedfs":
        return f"s3://pyckpt/{_unique()}", request.getfixturevalue("seaweed_options")
    if kind == "moto":
        return f"s3://pyckpt/{_unique()}", request.getfixturevalue("moto_bucket")
    return f"gs://pyckpt/{_unique()}", request.getfixturevalue("gcs_options")
