"""Each storage backend passes pyckpt.testing.store_suite."""

import tempfile
import uuid

import pytest

from pyckpt.storage import resolve
from pyckpt.testing.store_suite import ResolvableStoreSuite as StoreSuite


class TestLocalStore(StoreSuite):
    @pytest.fixture
    def store_root(self, tmp_path):
        return resolve(str(tmp_path / "root"))


class TestMemoryStore(StoreSuite):
    @pytest.fixture
    def store_root(self):
        return resolve(f"memory://suite/{uuid.uuid4().hex}")


class TestSeaweedFS(StoreSuite):
    @pytest.fixture
    def store_root(self, seaweed_options):
        store, root = resolve(f"s3://pyckpt/suite-{uuid.uuid4().hex[:8]}", seaweed_options)
        store.storage_options = seaweed_options
        return store, root


class TestMoto(StoreSuite):
    @pytest.fixture
    def store_root(self, moto_bucket):
        store, root = resolve(f"s3://pyckpt/suite-{uuid.uuid4().hex[:8]}", moto_bucket)
        store.storage_options = moto_bucket
        return store, root


class TestGCS(StoreSuite):
    @pytest.fixture
    def store_root(self, gcs_options):
        store, root = resolve(f"gs://pyckpt/suite-{uuid.uuid4().hex[:8]}", gcs_options)
        store.storage_options = gcs_options
        return store, root
