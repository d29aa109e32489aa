"""The GCS emulator launcher (pyckpt/testing/gcs_emulator.py) writes the emulator's
files whole or not at all: the route conformance tests kill the emulator in the
middle of its work and start it again on the same data directory, and a metadata
file cut short by the kill (an empty .meta) stopped the restarted emulator with a
JSONDecodeError."""

import pathlib

import pytest

from pyckpt.testing.requirements import require

require("gcp_storage_emulator", "a storage server or its client")

from gcp_storage_emulator import storage  # noqa: E402

from pyckpt.testing import gcs_emulator  # noqa: E402


@pytest.fixture
def launcher_writes(monkeypatch):
    """The launcher's file writes, in this process for this test only (its other
    changes would replace http.server's HTTPServer for every server of the process)."""
    monkeypatch.setattr(storage._FileStore, "write_bytes", gcs_emulator._write_atomically)


def test_importing_the_launcher_changes_nothing():
    import http.server

    assert http.server.HTTPServer is not http.server.ThreadingHTTPServer
    assert storage._FileStore.write_bytes is not gcs_emulator._write_atomically


def test_a_write_cut_short_leaves_the_previous_file_whole(tmp_path, monkeypatch, launcher_writes):
    files = storage._FileStore(use_memory=False, root=tmp_path)
    files.write_bytes(".meta", b'{"buckets": {"a": {}}}')

    def cut_short(self, data):  # the process dies after part of the bytes
        with open(self, "wb") as f:
            f.write(data[:2])
        raise SystemExit("killed")

    real_write = pathlib.Path.write_bytes
    monkeypatch.setattr(pathlib.Path, "write_bytes", cut_short)
    with pytest.raises(SystemExit):
        files.write_bytes(".meta", b'{"buckets": {"b": {}}}')
    monkeypatch.setattr(pathlib.Path, "write_bytes", real_write)
    assert files.read_bytes(".meta") == b'{"buckets": {"a": {}}}'
    files.write_bytes(".meta", b'{"buckets": {"b": {}}}')  # a later write replaces it
    assert files.read_bytes(".meta") == b'{"buckets": {"b": {}}}'


def test_memory_stores_are_unchanged(launcher_writes):
    files = storage._FileStore(use_memory=True)
    files.write_bytes("x/y", b"data")
    assert files.read_bytes("x/y") == b"data"
