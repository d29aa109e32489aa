"""Injected faults on object stores (issue 5): retries, clear errors, no commit
of anything incomplete, and reads that fetch only the bytes they need."""

import errno

import fsspec
import numpy as np
import pytest

import pyckpt
from pyckpt.testing import Faults

FAST = {"retries": 4, "backoff": 0.01, "backoff_max": 0.05}


def _opts(faults, target_options=None, **pyckpt_opts):
    so = {"faulty": {"faults": faults}, "pyckpt": {**FAST, **pyckpt_opts}}
    if target_options:
        so["s3"] = target_options
    return so


@pytest.fixture
def seaweed_url(seaweed_options, request):
    return f"faulty::s3://pyckpt/faults-{request.node.name[:40]}", seaweed_options


def _committed(url, so):
    fs, path = fsspec.core.url_to_fs(url.replace("faulty::", ""), **(so or {}))
    fs.invalidate_cache()
    return fs.exists(f"{path}/pyckpt.index")


def _objects(url, so):
    fs, path = fsspec.core.url_to_fs(url.replace("faulty::", ""), **(so or {}))
    fs.invalidate_cache()
    return fs.find(path)


def test_single_tensor_read_transfers_only_its_bytes(seaweed_url):
    url, s3 = seaweed_url
    faults = Faults()
    big = np.zeros(32 << 20, dtype=np.float32)  # 128 MiB
    small = np.arange(1000, dtype=np.int64)
    pyckpt.save({"big": big, "small": small, "other": np.ones(10)}, url,
                storage_options=_opts(faults, s3))
    faults.reset_counters()
    reader = pyckpt.load_checkpoint(url, storage_options=_opts(faults, s3))
    index_bytes = faults.bytes_read
    np.testing.assert_array_equal(reader.get_tensor("small"), small)
    assert faults.bytes_read - index_bytes == small.nbytes
    faults.reset_counters()
    out = pyckpt.load(url, select=["small"], storage_options=_opts(faults, s3))
    assert out == {"small": pytest.approx(small)} or np.array_equal(out["small"], small)
    assert faults.bytes_read < small.nbytes + 64 * 1024  # the index plus 8 KB, not 128 MiB


def test_transient_faults_are_retried_and_the_save_succeeds(seaweed_url, rng):
    url, s3 = seaweed_url
    # every part upload and every read has a 30% chance to fail; each request is retried
    faults = Faults(fail_fraction=0.3, seed=7, kinds={"write", "read"})
    tree = {"a": rng.standard_normal(6_000_000).astype(np.float32), "b": np.arange(100)}
    so = _opts(faults, s3, part_size=5 << 20, retries=8, read_request_max=4 << 20)
    pyckpt.save(tree, url, storage_options=so)
    assert faults.failures > 0
    assert any("upload_part" in entry[2] and entry[3] == "FAILED" for entry in faults.log)
    failures_before = faults.failures
    out = pyckpt.load(url, storage_options=so)
    assert faults.failures > failures_before
    np.testing.assert_array_equal(out["a"], tree["a"])
    pyckpt.load_checkpoint(url, storage_options=_opts(Faults(), s3)).verify()


def test_exhausted_retries_fail_with_the_object_name_and_no_commit(seaweed_url):
    url, s3 = seaweed_url
    faults = Faults(fail_fraction=1.0, kinds={"write"}, only="data-")  # the data files
    with pytest.raises(pyckpt.CheckpointIOError) as ei:
        pyckpt.save({"a": np.ones(1000)}, url, storage_options=_opts(faults, s3))
    msg = str(ei.value)
    assert "data-" in msg and "attempt" in msg and "s3://pyckpt/faults-" in msg
    assert isinstance(ei.value, OSError) and ei.value.errno == errno.EIO
    assert not _committed(url, s3)
    with pytest.raises(pyckpt.CheckpointNotFoundError):
        pyckpt.load(url, storage_options=_opts(Faults(), s3))


def test_a_failed_cleanup_is_reported_beside_the_upload_error_never_instead(seaweed_url, rng):
    """Every request about the data files fails: the uploads and then the cleanup (the
    aborts of the multipart uploads, the deletes). The error raised is the upload's,
    naming the object; the cleanup's failure is a note on it."""
    url, s3 = seaweed_url
    cleanup = ("abort_multipart_upload", "delete_object")
    faults = Faults(fail_fraction=1.0, only=("upload_part", *cleanup, "delete "))
    tree = {"a": rng.standard_normal(2_000_000)}  # 16 MB: multipart uploads of 5 MiB parts
    so = _opts(faults, s3, part_size=5 << 20)
    with pytest.raises(pyckpt.CheckpointIOError) as ei:
        pyckpt.save(tree, url, storage_options=so)
    msg = str(ei.value)
    assert "upload of" in msg and "/data-" in msg and "s3://pyckpt/faults-" in msg, msg
    assert "delete of" not in msg and "abort" not in msg, msg
    notes = "\n".join(getattr(ei.value, "__notes__", []))
    assert "cleanup" in notes and "abort of the multipart upload" in notes, notes
    assert "delete of" in notes and "/data-" in notes, notes
    tried = {method for _, _, what, outcome in faults.log for method in cleanup
             if what.startswith(method) and outcome == "FAILED"}
    assert tried == set(cleanup)  # the cleanup was attempted, and failed
    assert not _committed(url, s3)


def test_permanent_errors_are_not_retried(seaweed_url):
    url, s3 = seaweed_url
    faults = Faults(fail_nth={1}, kinds={"write"},
                    error=lambda what: PermissionError(13, f"denied: {what}"))
    faults.fail_nth = set(range(1, 100))
    with pytest.raises(PermissionError):
        pyckpt.save({"a": np.ones(1000)}, url, storage_options=_opts(faults, s3))
    assert faults.failures == 1
    assert not _committed(url, s3)


def test_cut_short_upload_is_never_committed(seaweed_url):
    url, s3 = seaweed_url
    faults = Faults(cut_writes_to=0.5)
    with pytest.raises(pyckpt.CheckpointIOError, match="incomplete"):
        pyckpt.save({"a": np.ones(100_000)}, url, storage_options=_opts(faults, s3))
    assert not _committed(url, s3)
    assert [o for o in _objects(url, s3) if "data-" in o] == []  # the partial shard was removed


def test_failed_save_keeps_the_previous_checkpoint(seaweed_url):
    url, s3 = seaweed_url
    pyckpt.save({"a": np.zeros(10)}, url, storage_options=_opts(Faults(), s3))
    faults = Faults(fail_fraction=1.0, kinds={"write"})
    with pytest.raises(pyckpt.CheckpointIOError):
        pyckpt.save({"a": np.ones(10)}, url, storage_options=_opts(faults, s3))
    out = pyckpt.load(url, storage_options=_opts(Faults(), s3))
    np.testing.assert_array_equal(out["a"], np.zeros(10))


def test_corruption_in_the_store_is_detected_with_the_object_and_range(memory_url=None):
    url = "memory://pyckpt-faults/corrupt"
    pyckpt.save({"a": np.arange(100_000, dtype=np.int32)}, url)
    fs = fsspec.filesystem("memory")
    (name,) = [p for p in fs.ls("/pyckpt-faults/corrupt", detail=False) if "data-" in p]
    data = bytearray(fs.cat_file(name))
    data[12345] ^= 0xFF
    fs.pipe_file(name, bytes(data))
    with pytest.raises(pyckpt.CorruptCheckpointError, match=r"memory://.*data-.*bytes \["):
        pyckpt.load(url)


def test_botocore_retries_connection_errors_on_upload_part(seaweed_options, rng):
    """A failure inside botocore (before-send hook) is retried by botocore itself."""
    import botocore.exceptions
    import s3fs

    calls = {"n": 0}

    def flaky(**kwargs):
        calls["n"] += 1
        if calls["n"] <= 2:
            raise botocore.exceptions.EndpointConnectionError(endpoint_url="injected")

    fs = s3fs.S3FileSystem(**seaweed_options)
    fs.connect()
    fs.s3.meta.events.register("before-send.s3.UploadPart", flaky)
    try:
        tree = {"a": rng.standard_normal(3_000_000)}  # 24 MB: a multipart upload
        pyckpt.save(tree, "s3://pyckpt/botocore-hook", storage_options={
            **seaweed_options, "pyckpt": {"part_size": 5 << 20}})
    finally:
        fs.s3.meta.events.unregister("before-send.s3.UploadPart", flaky)
    assert calls["n"] > 2
    out = pyckpt.load("s3://pyckpt/botocore-hook", storage_options=seaweed_options)
    np.testing.assert_array_equal(out["a"], tree["a"])


def test_generic_streaming_path_retries_whole_files():
    """Filesystems without S3 multipart (here memory behind faulty::) retry a failed file."""
    faults = Faults(fail_nth={3, 7})
    so = {"faulty": {"faults": faults}, "pyckpt": {**FAST, "part_size": 1 << 20}}
    tree = {"a": np.arange(1_500_000, dtype=np.float64), "b": np.ones(5)}
    pyckpt.save(tree, "faulty::memory://generic/c", storage_options=so)
    assert faults.failures == 2
    np.testing.assert_array_equal(pyckpt.load("faulty::memory://generic/c", storage_options=so)["a"],
                                  tree["a"])
