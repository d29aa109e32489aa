"""Faults on the wire (issue 13): saves and loads to S3 through a TCP proxy
(pyckpt.testing.fault_proxy) that resets connections in the middle of bodies,
answers bursts of 503 SlowDown itself, stalls longer than the request timeout and
drips bytes slowly, between s3fs and SeaweedFS on 127.0.0.1.

Every operation either succeeds, and then every byte is checked (the values
compared, every checksum verified), or fails with CheckpointIOError naming the
object; a failed save never leaves a half-written checkpoint committed. The
faults injected and the outcomes are printed at the end of the session and
written to fault_proxy_summary.txt under pytest's base temporary directory.
"""

import uuid

import fsspec
import numpy as np
import pytest

import pyckpt
from pyckpt.testing.fault_proxy import KINDS, FaultProxy

# small limits, so that a stalled request costs about a second
TUNED = {"stall_timeout": 1.0, "deadline": 4.0, "cleanup_timeout": 1.0, "timeout": 20.0,
         "part_size": 5 << 20, "max_concurrency": 4, "retries": 6, "backoff": 0.05,
         "backoff_max": 0.3, "read_request_max": 2 << 20}
CLIENT = {"connect_timeout": 2, "read_timeout": 5, "retries": {"max_attempts": 2, "mode": "standard"}}


def _port(options):
    return int(options["endpoint_url"].rsplit(":", 1)[1].split("/")[0])


def _through(proxy, server, **tuned):
    """storage_options reaching ``server`` through ``proxy``."""
    return {"key": server["key"], "secret": server["secret"],
            "client_kwargs": {"endpoint_url": proxy.url}, "config_kwargs": CLIENT,
            "pyckpt": {**TUNED, **tuned}}


def _url(name):
    return f"s3://pyckpt/wire-{name}-{uuid.uuid4().hex[:8]}"


def _tree(seed, n=1_400_000):
    rng = np.random.default_rng(seed)
    return {"big": rng.standard_normal(n).astype(np.float32),  # 5.6 MB: a multipart upload
            "layers": [{"w": rng.standard_normal((64, 64)), "b": np.arange(64, dtype=np.int32)}],
            "step": np.int64(seed)}


def _equal(a, b):
    np.testing.assert_array_equal(a["big"], b["big"])
    np.testing.assert_array_equal(a["layers"][0]["w"], b["layers"][0]["w"])
    np.testing.assert_array_equal(a["layers"][0]["b"], b["layers"][0]["b"])
    assert int(a["step"]) == int(b["step"])


def _index_exists(server, url):
    fs = fsspec.filesystem("s3", **server, skip_instance_cache=True)
    fs.invalidate_cache()
    return fs.exists(url.removeprefix("s3://") + "/pyckpt.index")


def _check_io_error(err, prefix):
    """A CheckpointIOError that names an object under ``prefix``."""
    assert isinstance(err, pyckpt.CheckpointIOError), f"{type(err).__name__}: {err}"
    assert prefix + "/" in str(err), str(err)


def _after_failed_save(server, url, tree, err, prefix=None):
    """The outcome of a save that raised ``err``: a CheckpointIOError naming the object;
    nothing committed, or (the commit landed but its answer was lost) a complete
    checkpoint holding exactly ``tree``."""
    _check_io_error(err, prefix or url)
    if not _index_exists(server, url):
        return f"failed cleanly: {type(err).__name__}, nothing committed"
    pyckpt.load_checkpoint(url, storage_options=server).verify()
    _equal(pyckpt.load(url, storage_options=server), tree)
    return f"failed cleanly: {type(err).__name__}; its commit landed, complete and verified"


class _Counts:
    """The proxy's fault counts since the last ``take``."""

    def __init__(self, proxy):
        self.proxy = proxy
        self.last = dict(proxy.counts)

    def take(self):
        now = dict(self.proxy.counts)
        out = {k: now[k] - self.last[k] for k in KINDS}
        self.last = now
        return out


# rates per kind: a save and a load make about 30 requests
RATES = {"reset": 0.25, "slowdown": 0.12, "stall": 0.08, "drip": 0.3}


@pytest.mark.parametrize("kind", KINDS)
def test_save_and_load_through_one_kind_of_fault(kind, seaweed_options, fault_report, request):
    url = _url(kind)
    tree = _tree(KINDS.index(kind))
    with FaultProxy(_port(seaweed_options), seed=11 + KINDS.index(kind), max_per_kind=4,
                    stall_seconds=2.0, **{kind: RATES[kind]}) as proxy:
        so = _through(proxy, seaweed_options)
        counts = _Counts(proxy)
        try:
            pyckpt.save(tree, url, storage_options=so)
        except Exception as e:  # noqa: BLE001 - judged below
            fault_report.add(request.node.name, "save", counts.take(),
                             _after_failed_save(seaweed_options, url, tree, e))
        else:  # every checksum, read without faults
            pyckpt.load_checkpoint(url, storage_options=seaweed_options).verify()
            fault_report.add(request.node.name, "save", counts.take(),
                             "succeeded: verified")
        if _index_exists(seaweed_options, url):
            try:
                _equal(pyckpt.load(url, storage_options=so), tree)
            except Exception as e:  # noqa: BLE001 - judged below
                _check_io_error(e, url)
                outcome = f"failed cleanly: {type(e).__name__}"
            else:
                outcome = "succeeded: every value compared"
            fault_report.add(request.node.name, "load", counts.take(), outcome)
    assert proxy.counts[kind] > 0, proxy.summary()
    assert sum(proxy.counts.values()) == proxy.counts[kind]


def test_a_manager_through_every_kind_of_fault(seaweed_options, fault_report, request):
    """Several CheckpointManager saves through mixed faults: the latest committed
    checkpoint holds exactly the values of the save that wrote it."""
    directory = _url("manager")
    rng = np.random.default_rng(5)
    weights = pyckpt.Variable(np.zeros(300_000, np.float32))
    step = pyckpt.Variable(np.int64(0))
    values = {}  # step -> the weights saved with it
    with FaultProxy(_port(seaweed_options), seed=3, reset=0.08, slowdown=0.05, stall=0.03,
                    drip=0.1, max_per_kind=5, burst=2, stall_seconds=2.0) as proxy:
        so = _through(proxy, seaweed_options)
        counts = _Counts(proxy)
        manager = pyckpt.CheckpointManager(pyckpt.Checkpoint(w=weights, step=step), directory,
                                           max_to_keep=2, storage_options=so)
        try:
            for i in range(1, 4):
                weights.assign(rng.standard_normal(weights.shape).astype(np.float32))
                step.assign(np.int64(i))
                values[i] = weights.numpy().copy()
                try:
                    path = manager.save()
                except Exception as e:  # noqa: BLE001 - judged below
                    _check_io_error(e, directory)
                    outcome = f"failed cleanly: {type(e).__name__}"
                else:
                    outcome = f"succeeded: {path.rsplit('/', 1)[1]}"
                fault_report.add(request.node.name, f"manager.save #{i}", counts.take(), outcome)
            kept = list(manager.checkpoints)
        finally:
            manager.close()
        proxy.quiet()
    latest = pyckpt.latest_checkpoint(directory, storage_options=seaweed_options)
    assert latest is not None
    for path in {latest, *kept}:
        pyckpt.load_checkpoint(path, storage_options=seaweed_options).verify()
        w2, s2 = pyckpt.Variable(np.zeros(300_000, np.float32)), pyckpt.Variable(np.int64(0))
        pyckpt.Checkpoint(w=w2, step=s2).restore(
            path, storage_options=seaweed_options).assert_existing_objects_matched()
        np.testing.assert_array_equal(w2.numpy(), values[int(s2)])


def test_loads_through_every_kind_of_fault(seaweed_options, fault_report, request):
    url = _url("loads")
    tree = _tree(7)
    pyckpt.save(tree, url, storage_options=seaweed_options)
    with FaultProxy(_port(seaweed_options), seed=9, reset=0.2, slowdown=0.1, stall=0.06,
                    drip=0.2, max_per_kind=3, burst=2, stall_seconds=2.0,
                    match=("GET ", "HEAD ")) as proxy:
        so = _through(proxy, seaweed_options)
        counts = _Counts(proxy)
        for op in ("load", "select", "get_tensor", "verify"):
            try:
                if op == "load":
                    _equal(pyckpt.load(url, storage_options=so), tree)
                elif op == "select":
                    out = pyckpt.load(url, select=["layers/*/*"], storage_options=so)
                    np.testing.assert_array_equal(out["layers"][0]["w"], tree["layers"][0]["w"])
                elif op == "get_tensor":
                    reader = pyckpt.load_checkpoint(url, storage_options=so)
                    np.testing.assert_array_equal(reader.get_tensor("big"), tree["big"])
                else:
                    pyckpt.load_checkpoint(url, storage_options=so).verify()
            except Exception as e:  # noqa: BLE001 - judged below
                _check_io_error(e, url)
                outcome = f"failed cleanly: {type(e).__name__}"
            else:
                outcome = "succeeded: every byte checked"
            fault_report.add(request.node.name, op, counts.take(), outcome)
    assert sum(proxy.counts.values()) > 0, proxy.summary()


def _is_index_put(what):
    return what.startswith("PUT ") and what.split("?", 1)[0].endswith("/pyckpt.index")


def _fewer_s3fs_retries(monkeypatch):
    """s3fs retries failed calls itself (5 tries, sleeping between them) before
    pyckpt's retries see the error: 2 here, so that persistent faults fail in seconds."""
    import s3fs

    monkeypatch.setattr(s3fs.S3FileSystem, "retries", 2)


def test_every_data_upload_reset_fails_naming_the_object(seaweed_options, fault_report, request,
                                                         monkeypatch):
    _fewer_s3fs_retries(monkeypatch)
    url = _url("resets") + "/ckpt-1"
    tree = _tree(1, n=100_000)
    with FaultProxy(_port(seaweed_options), reset=1.0, body="request", max_per_kind=10_000,
                    match=lambda w: w.startswith("PUT ") and "/data-" in w) as proxy:
        so = _through(proxy, seaweed_options, retries=3, deadline=2.0)
        so["config_kwargs"] = {**CLIENT, "retries": {"max_attempts": 1}}
        with pytest.raises(pyckpt.CheckpointIOError) as ei:
            pyckpt.save(tree, url, storage_options=so)
    assert "/data-" in str(ei.value)
    outcome = _after_failed_save(seaweed_options, url, tree, ei.value)
    assert "nothing committed" in outcome
    assert pyckpt.latest_checkpoint(url.rsplit("/", 1)[0], storage_options=seaweed_options) is None
    fault_report.add(request.node.name, "save", dict(proxy.counts), outcome)


def test_a_throttled_commit_keeps_the_previous_checkpoint(seaweed_options, fault_report, request,
                                                         monkeypatch):
    _fewer_s3fs_retries(monkeypatch)
    url = _url("throttled") + "/ckpt-1"
    old, new = _tree(2, n=50_000), _tree(3, n=50_000)
    with FaultProxy(_port(seaweed_options), slowdown=1.0, burst=10_000, max_per_kind=10_000,
                    match=_is_index_put) as proxy:
        # s3fs retries throttling by itself, sleeping between tries: a stall_timeout
        # longer than those sleeps lets its final error (OSError EBUSY) come through
        so = _through(proxy, seaweed_options, stall_timeout=8.0, deadline=8.0, retries=1)
        so["config_kwargs"] = {**CLIENT, "retries": {"max_attempts": 1}}
        proxy.configure(slowdown=0.0)
        pyckpt.save(old, url, storage_options=so)
        proxy.configure(slowdown=1.0)
        with pytest.raises(pyckpt.CheckpointIOError) as ei:
            pyckpt.save(new, url, storage_options=so)
    assert "pyckpt.index" in str(ei.value) and url in str(ei.value)
    assert "reduce your request rate" in str(ei.value), str(ei.value)  # SlowDown's message
    _equal(pyckpt.load(url, storage_options=seaweed_options), old)
    pyckpt.load_checkpoint(url, storage_options=seaweed_options).verify()
    fault_report.add(request.node.name, "save over a committed checkpoint", dict(proxy.counts),
                     "failed cleanly: CheckpointIOError, the previous checkpoint intact")


def test_a_lost_commit_answer_never_leaves_an_index_without_data(seaweed_options, fault_report,
                                                                  request):
    """The index PUT reaches the server but its answer never comes back (a stall on the
    response), and reading the index back stalls too: the save fails; the index is
    there, so the data files must be there too."""
    url = _url("lost-answer") + "/ckpt-1"
    tree = _tree(4, n=1000)

    def match(what):
        return _is_index_put(what) or (what.startswith("GET ") and "/pyckpt.index" in what)

    with FaultProxy(_port(seaweed_options), stall=1.0, body="response", max_per_kind=10_000,
                    stall_seconds=1.5, match=match) as proxy:
        with pytest.raises(pyckpt.CheckpointIOError) as ei:
            pyckpt.save(tree, url, storage_options=_through(
                proxy, seaweed_options, stall_timeout=0.5, deadline=1.0, cleanup_timeout=0.5))
    outcome = _after_failed_save(seaweed_options, url, tree, ei.value)
    fault_report.add(request.node.name, "save", dict(proxy.counts), outcome)


def test_the_proxy_answers_slowdown_and_counts(seaweed_options):
    """The proxy on its own: a burst of 503 SlowDown written by itself, then
    requests forwarded unchanged."""
    import urllib.error
    import urllib.request

    with FaultProxy(_port(seaweed_options), slowdown=1.0, burst=2, max_per_kind=1) as proxy:
        statuses = []
        for _ in range(3):
            try:
                with urllib.request.urlopen(proxy.url + "/", timeout=10) as r:
                    statuses.append(r.status)
            except urllib.error.HTTPError as e:
                statuses.append(e.code)
                if e.code == 503:
                    assert b"<Code>SlowDown</Code>" in e.read()
    assert statuses[:2] == [503, 503] and statuses[2] != 503
    assert proxy.counts == {"reset": 0, "slowdown": 2, "stall": 0, "drip": 0}
