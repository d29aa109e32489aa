"""S3 servers that stop answering or die during a save or load (issue 10, part C).

A dedicated SeaweedFS on 127.0.0.1 is stalled with SIGSTOP (connections are
accepted by the kernel, nothing answers; always resumed with SIGCONT) or killed
with SIGKILL and started again on the same data. The checks: the error is the
failed request's own (CheckpointIOError naming the object), never the
cleanup's; it comes within a bound set by the timeout options (docs/PROTOCOL.md,
"Timeouts, retries and cleanup"); nothing is committed; multipart uploads left
open are aborted at the next save.
"""

import json
import os
import re
import signal
import time
import uuid

import numpy as np
import pytest

import pyckpt
from pyckpt.engine import write_executor
from pyckpt.storage.options import RemoteOptions
from pyckpt.testing import servers

# small timeouts so that each stalled case takes seconds, not minutes
TUNED = {"stall_timeout": 2.0, "deadline": 4.0, "cleanup_timeout": 2.0, "part_size": 5 << 20,
         "max_concurrency": 4}


@pytest.fixture(scope="module")
def weed(seaweed_server):
    """A SeaweedFS of this module's own: its tests stall and kill it."""
    return seaweed_server


def _fs(options):
    import s3fs

    fs = s3fs.S3FileSystem(**options, skip_instance_cache=True)
    fs.invalidate_cache()
    return fs


def _committed(options, url):
    return _fs(options).exists(url.removeprefix("s3://") + "/pyckpt.index")


def _open_uploads(options, url):
    """Keys of the multipart uploads open under the checkpoint prefix ``url``."""
    bucket, key = url.removeprefix("s3://").split("/", 1)
    out = _fs(options).call_s3("list_multipart_uploads", Bucket=bucket, Prefix=key + "/")
    return sorted(u["Key"] for u in out.get("Uploads") or [])


def _is_upload_error(msg, url):
    """The error of one of the upload's own requests, naming its object."""
    return re.match(rf"\[Errno 5\] (starting the |completing the )?upload of {re.escape(url)}"
                    rf"/data-[0-9a-f]{{12}}-[0-9]{{5}}-[0-9]{{4}}\.bin", msg) is not None


def _url(name):
    return f"s3://pyckpt/{name}-{uuid.uuid4().hex[:8]}/ckpt-1"


def _stall_when_uploading(server, after_bytes=1):
    """A progress callback that stops the server once ``after_bytes`` were uploaded;
    returns (callback, list receiving the time it fired)."""
    fired = []

    def callback(done, total):
        if done >= after_bytes and not fired:
            fired.append(time.monotonic())
            server.stop_now()

    return callback, fired


def test_stalled_server_load_fails_within_the_deadline(weed, rng):
    so = {**weed.options, "pyckpt": TUNED}
    url = _url("stalled-load")
    tree = {"a": rng.standard_normal(2_000_000), "b": np.arange(10)}   # 16 MB
    pyckpt.save(tree, url, storage_options=so)
    with weed.stalled():   # before the load: its first request stalls
        t0 = time.monotonic()
        with pytest.raises(pyckpt.CheckpointIOError) as ei:
            pyckpt.load(url, storage_options=so)
        load_s = time.monotonic() - t0
    assert url in str(ei.value) and "no bytes moved" in str(ei.value), str(ei.value)
    # in the middle of the ranged reads of the data (1 MiB requests, 2 MiB batches),
    # slowed to 4 MiB/s by a proxy so that the progress callback sees them start
    fired = []

    def callback(done, total):
        if done and not fired:
            fired.append(time.monotonic())
            weed.stop_now()

    try:
        with servers.loopback_proxy(weed.options, rate=4 << 20) as slow:
            reading = {**slow, "pyckpt": {**TUNED, "read_request_max": 1 << 20,
                                          "read_batch_bytes": 2 << 20, "max_concurrency": 2}}
            with pytest.raises(pyckpt.CheckpointIOError) as ei_read:
                pyckpt.load(url, storage_options=reading, progress=callback)
            failed_at = time.monotonic()
            read_s = failed_at - fired[0]
    finally:
        weed.resume()
    msg = str(ei_read.value)
    assert msg.startswith(f"[Errno 5] read of {url}/data-") and "bytes [" in msg, msg
    # the deadline (4 s) bounds each; a load took 602 s with the old per-request timeouts
    assert load_s < 15 and read_s < 15, (load_s, read_s)
    # the failed read marked the store down: for 4 x cleanup_timeout after it, a new
    # load's requests get one short attempt, then none (docs/PROTOCOL.md 1c); a load
    # right after the resume failed 'not tried' in CI. Then the store is tried again.
    time.sleep(max(0.0, 4 * TUNED["cleanup_timeout"] - (time.monotonic() - failed_at)))
    np.testing.assert_array_equal(pyckpt.load(url, storage_options=so)["a"], tree["a"])


def test_stalled_server_save_fails_with_the_upload_error_and_commits_nothing(weed, rng):
    so = {**weed.options, "pyckpt": TUNED}
    url = _url("stalled-save")
    tree = {"a": rng.standard_normal(5_000_000)}   # 40 MB: multipart uploads
    callback, fired = _stall_when_uploading(weed)
    t0 = time.monotonic()
    try:
        with pytest.raises(pyckpt.CheckpointIOError) as ei:
            pyckpt.save(tree, url, storage_options=so, progress=callback)
        failed_after = time.monotonic() - fired[0]
    finally:
        weed.resume()
    msg = str(ei.value)
    assert _is_upload_error(msg, url), msg
    assert "no bytes moved" in msg, msg
    # the upload gives up at the deadline (4 s), the cleanup takes at most 2 s, the
    # removal of the attempt's marker one short attempt (2 s): about 8 s (the bound:
    # 4 + 3 * 2 + backoff_max), not 1,065 s
    bound = RemoteOptions(**TUNED).failure_bound()
    assert failed_after < bound + 5, (failed_after, bound)
    assert not _committed(weed.options, url)
    # after the follow-up window, requests are not even tried for one cleanup_timeout
    # (docs/PROTOCOL.md 1c): then the store is tried again
    time.sleep(max(0.0, 4 * TUNED["cleanup_timeout"] - (time.monotonic() - fired[0]
                                                          - failed_after)))
    with pytest.raises(pyckpt.CheckpointNotFoundError):
        pyckpt.load(url, storage_options=so)
    # the next save to the prefix works and leaves no multipart upload open
    pyckpt.save({"a": np.ones(3)}, url, storage_options=so)
    assert _open_uploads(weed.options, url) == []
    np.testing.assert_array_equal(pyckpt.load(url, storage_options=so)["a"], np.ones(3))
    assert time.monotonic() - t0 < 120


def test_default_timeouts_bound_a_stalled_save_under_3_minutes(weed, rng, monkeypatch):
    """The default options, measured (about 80 s): the save is stalled mid-upload and
    fails within 3 minutes (1,065 s before issue 10); the defaults' bound is asserted
    from the options too. The slowest test of this module, on purpose."""
    defaults = RemoteOptions()
    assert defaults.failure_bound() < 120
    assert defaults.stall_timeout <= 60 and defaults.deadline <= 90
    so = {**weed.options, "pyckpt": {"part_size": 5 << 20}}   # timeouts: the defaults
    url = _url("stalled-defaults")
    fired: list[float] = []
    fill = write_executor.ShardLayout.fill

    def stall_at_first_part(self, begin, buf):  # deterministic: before any part is sent
        if not fired:
            fired.append(time.monotonic())
            weed.stop_now()
        return fill(self, begin, buf)

    monkeypatch.setattr(write_executor.ShardLayout, "fill", stall_at_first_part)
    try:
        with pytest.raises(pyckpt.CheckpointIOError) as ei:
            pyckpt.save({"a": rng.standard_normal(5_000_000)}, url, storage_options=so)
        failed_after = time.monotonic() - fired[0]
    finally:
        weed.resume()
    assert _is_upload_error(str(ei.value), url), str(ei.value)
    assert failed_after < 180, failed_after
    assert failed_after < defaults.failure_bound() + 15, failed_after
    assert not _committed(weed.options, url)


def test_killed_server_error_is_the_uploads_and_open_uploads_are_aborted_next_save(weed, rng):
    so = {**weed.options, "pyckpt": {**TUNED, "stall_timeout": 4.0, "deadline": 6.0}}
    url = _url("killed")
    tree = {"a": rng.standard_normal(12_000_000), "b": rng.standard_normal(2_000_000)}  # 112 MB
    killed = []

    def callback(done, total):
        if done >= 20 << 20 and not killed:
            killed.append(time.monotonic())
            os.killpg(weed.pid, signal.SIGKILL)

    with pytest.raises(pyckpt.CheckpointIOError) as ei:
        pyckpt.save(tree, url, storage_options=so, progress=callback)
    weed.kill()   # reaped
    msg = str(ei.value)
    assert _is_upload_error(msg, url), msg   # not "delete of ..."
    notes = "\n".join(getattr(ei.value, "__notes__", []))
    assert "abort of the multipart upload" in notes and "recorded" in notes, notes
    weed.start()   # same data, same ports
    left = _open_uploads(weed.options, url)
    assert left, "SeaweedFS kept no multipart upload: the scenario did not happen"
    assert not _committed(weed.options, url)
    # the next save to this store, even to another checkpoint, aborts what this
    # process recorded
    pyckpt.save({"x": np.ones(3)}, _url("after-kill"), storage_options=so)
    assert _open_uploads(weed.options, url) == []


def test_left_open_multipart_uploads_of_ended_attempts_are_aborted_at_the_next_save(
        seaweed_options):
    """Multipart uploads that a crashed save left open, made with the S3 client itself.
    At the next save to the checkpoint, those of pyckpt data files whose attempt ended
    are aborted; a live attempt's (its marker says so), other keys, and other prefixes
    are kept, until they are older than stale_upload_age."""
    fs = _fs(seaweed_options)
    root = f"pyckpt/left-open-{uuid.uuid4().hex[:8]}"
    ckpt = f"{root}/ckpt-1"
    keys = {
        "ended": f"{ckpt}/data-0123456789ab-00000-0000.bin",    # no marker: attempt over
        "live": f"{ckpt}/data-aaaaaaaaaaaa-00001-0000.bin",      # marker of a live attempt
        "other-key": f"{ckpt}/notes.bin",                        # not pyckpt's naming
        "other-prefix": f"{root}/ckpt-2/data-0123456789ab-00000-0000.bin",
    }
    marker = {"host": "another-host", "pid": 1, "time": time.time()}
    fs.pipe_file(f"{ckpt}/pyckpt-attempt-aaaaaaaaaaaa.json", json.dumps(marker).encode())
    for key in keys.values():
        bucket, k = key.split("/", 1)
        upload = fs.call_s3("create_multipart_upload", Bucket=bucket, Key=k)
        fs.call_s3("upload_part", Bucket=bucket, Key=k, UploadId=upload["UploadId"],
                   PartNumber=1, Body=b"x" * 1000)
    url = "s3://" + ckpt

    def open_keys():
        return set(_open_uploads(seaweed_options, "s3://" + root))

    before = open_keys()
    assert before == {k.split("/", 1)[1] for k in keys.values()}
    pyckpt.save({"a": np.arange(10)}, url, storage_options=seaweed_options)
    assert open_keys() == before - {keys["ended"].split("/", 1)[1]}
    # once older than stale_upload_age, the live-looking attempt's upload goes too
    pyckpt.save({"a": np.arange(10)}, url,
                storage_options={**seaweed_options, "pyckpt": {"stale_upload_age": 0.0}})
    assert open_keys() == {keys["other-key"].split("/", 1)[1],
                           keys["other-prefix"].split("/", 1)[1]}
    np.testing.assert_array_equal(pyckpt.load(url, storage_options=seaweed_options)["a"],
                                  np.arange(10))
    for key in ("other-key", "other-prefix"):   # leave the shared server clean
        bucket, k = keys[key].split("/", 1)
        for u in fs.call_s3("list_multipart_uploads", Bucket=bucket, Prefix=k)["Uploads"]:
            fs.call_s3("abort_multipart_upload", Bucket=bucket, Key=k, UploadId=u["UploadId"])


def test_a_multi_worker_persist_aborts_what_an_earlier_persist_of_its_name_left_open(
        seaweed_options, tmp_path):
    """A persist of node-local tiers (every worker copies its files under their local
    names, rank 0 commits) into a durable directory where an earlier persist of the
    same name died mid-upload: its upload was of another attempt's file, which no
    write of the new persist names. The commit's sweep aborts it; an open upload of
    a live attempt (its marker) is kept."""
    from pyckpt.engine.copy import commit_copied, copy_files
    from pyckpt.storage import resolve

    fs = _fs(seaweed_options)
    dst = f"pyckpt/persist-left-open-{uuid.uuid4().hex[:8]}/ckpt-1"
    bucket, key = dst.split("/", 1)
    uploads = {}
    for name in ("data-0123456789ab-00000-0000.bin", "data-aaaaaaaaaaaa-00000-0000.bin"):
        uploads[name] = fs.call_s3("create_multipart_upload", Bucket=bucket,
                                   Key=f"{key}/{name}")["UploadId"]
    marker = {"host": "another-host", "pid": 1, "time": time.time()}
    fs.pipe_file(f"{dst}/pyckpt-attempt-aaaaaaaaaaaa.json", json.dumps(marker).encode())
    assert set(_open_uploads(seaweed_options, "s3://" + dst)) == {
        f"{key}/{n}" for n in uploads}

    local = str(tmp_path / "ckpt-1")
    pyckpt.save({"a": np.arange(1000.0)}, local)
    store, path = resolve("s3://" + dst, seaweed_options)
    copy_files(local, None, store, path, lambda name: True)
    resolved, lpath = resolve(local)
    commit_copied(resolved, lpath, store, path)

    assert _open_uploads(seaweed_options, "s3://" + dst) == [
        f"{key}/data-aaaaaaaaaaaa-00000-0000.bin"]
    np.testing.assert_array_equal(
        pyckpt.load("s3://" + dst, storage_options=seaweed_options)["a"], np.arange(1000.0))
    fs.call_s3("abort_multipart_upload", Bucket=bucket,  # leave the shared server clean
               Key=f"{key}/data-aaaaaaaaaaaa-00000-0000.bin",
               UploadId=uploads["data-aaaaaaaaaaaa-00000-0000.bin"])


def test_slow_but_steady_transfers_are_not_stalls(seaweed_options, rng):
    """Through a proxy that forwards 3 MiB/s per connection, each 16 MiB request takes
    about 5 s, longer than stall_timeout and deadline (3 s): its bytes keep moving, so
    neither fires. A per-request limit of 3 s would fail every request."""
    opts = {"stall_timeout": 3.0, "deadline": 3.0, "part_size": 16 << 20,
            "max_concurrency": 2, "read_request_max": 16 << 20}
    tree = {"a": rng.standard_normal(4 << 20)}   # 32 MiB
    url = _url("slow")
    with servers.loopback_proxy(seaweed_options, rate=3 << 20) as slow:
        so = {**slow, "pyckpt": opts}
        t0 = time.monotonic()
        pyckpt.save(tree, url, storage_options=so)
        save_s = time.monotonic() - t0
        t0 = time.monotonic()
        out = pyckpt.load(url, storage_options=so)
        load_s = time.monotonic() - t0
    np.testing.assert_array_equal(out["a"], tree["a"])
    assert save_s > opts["stall_timeout"] and load_s > opts["stall_timeout"], (save_s, load_s)
