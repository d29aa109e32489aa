"""The retry policy of object-store requests (pyckpt/storage/retry.py), without a
server: stalls are detected by progress, an operation's retries stop at its
deadline, and a store that stopped answering gets short probes."""

import asyncio
import time

import pytest

import pyckpt
from pyckpt.storage.options import RemoteOptions
from pyckpt.storage.retry import Health, Operation, StallError, call_async, call_sync

OPTS = RemoteOptions(stall_timeout=0.3, deadline=1.0, cleanup_timeout=0.2, retries=50,
                     backoff=0.01, backoff_max=0.02, timeout=30)


def _run(coro):
    return asyncio.run(coro)


def test_a_request_that_never_answers_fails_at_the_deadline_naming_it():
    calls = []

    async def hang(att):
        calls.append(time.monotonic())
        await asyncio.sleep(3600)

    t0 = time.monotonic()
    with pytest.raises(pyckpt.CheckpointIOError) as ei:
        _run(call_async("read of s3://b/k", Operation(OPTS), hang))
    took = time.monotonic() - t0
    assert 0.9 < took < 3.0, took          # the deadline, not retries x timeout
    assert 2 <= len(calls) <= 5            # each attempt abandoned after stall_timeout
    assert str(ei.value).startswith("[Errno 5] read of s3://b/k failed after")
    assert isinstance(ei.value.__cause__, StallError)


def test_a_slow_request_whose_bytes_keep_moving_is_not_a_stall():
    async def slow(att):
        for _ in range(15):                # 1.5 s: longer than stall_timeout and deadline
            await asyncio.sleep(0.1)
            att.progress()                 # a chunk of bytes moved
        return "done"

    assert _run(call_async("upload of s3://b/k", Operation(OPTS), slow)) == "done"


def test_progress_of_the_operation_extends_its_deadline_for_retries():
    op = Operation(OPTS)
    attempts = []

    async def flaky(att):
        attempts.append(1)
        await asyncio.sleep(0.1)
        att.progress()                     # some bytes, then the connection drops
        if len(attempts) < 15:             # 15 failures over ~1.6 s: past the deadline
            raise ConnectionResetError(104, "reset")
        return "ok"

    assert _run(call_async("upload of s3://b/k", op, flaky)) == "ok"


def test_a_store_that_stopped_answering_gets_one_short_attempt_per_request():
    health = Health()

    async def hang(att):
        await asyncio.sleep(3600)

    with pytest.raises(pyckpt.CheckpointIOError):
        _run(call_async("size of s3://b/k", Operation(OPTS, health), hang))
    calls = []

    async def hang_counted(att):
        calls.append(1)
        await asyncio.sleep(3600)

    t0 = time.monotonic()
    with pytest.raises(pyckpt.CheckpointIOError) as ei:
        _run(call_async("delete of s3://b/k", Operation(OPTS, health), hang_counted))
    assert time.monotonic() - t0 < 1.5 and calls == [1]
    assert "one short attempt" in str(ei.value)
    # a success clears it: the next operation retries in full again
    assert _run(call_async("size of s3://b/k", Operation(OPTS, health),
                           lambda att: asyncio.sleep(0, "ok"))) == "ok"
    assert not Operation(OPTS, health).probe


def test_permanent_errors_are_raised_at_once_and_unchanged():
    calls = []

    def denied():
        calls.append(1)
        raise PermissionError(13, "denied")

    with pytest.raises(PermissionError):
        call_sync("write of s3://b/k", Operation(OPTS), denied)
    assert calls == [1]


def test_timeout_options_are_checked():
    with pytest.raises(ValueError, match="stall_timeout"):
        RemoteOptions.split({"pyckpt": {"stall_timeout": 0}})
    opts, rest = RemoteOptions.split({"pyckpt": {"deadline": 5, "cleanup_timeout": 1},
                                      "endpoint_url": "x"})
    assert (opts.deadline, opts.cleanup_timeout, rest) == (5, 1, {"endpoint_url": "x"})
    defaults = RemoteOptions()
    assert (defaults.stall_timeout, defaults.deadline, defaults.cleanup_timeout) == (30, 60, 10)
    assert defaults.failure_bound() == 95
