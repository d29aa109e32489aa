"""Every route that moves bulk bytes to or from an object store is bounded (issue 27):
against a store stalled (SIGSTOP) or killed in the middle of the route's transfer,

- the route raises a ``pyckpt.CheckpointError`` within ``RemoteOptions.failure_bound()``;
- its process exits soon after;
- nothing is committed, and once the store is back and the route ran again (it must
  succeed), no multipart upload stays open under the route's prefix.

ROUTES is the one table of routes. ``test_every_store_entry_point_has_a_route``
fails when a function of pyckpt calls one of the store's bulk entry points
(``write_files``, ``write_stream``, ``fetch``, ``read_ranges``) and no route claims
it; each route's child process reports the functions it went through, and every
entry point a route claims must be among them. A new remote route is added here in
the same change. Each case runs in a child process (route_child.py).
"""

import ast
import dataclasses
import json
import pathlib
import queue
import re
import subprocess
import sys
import threading
import time
import uuid

import pytest

from pyckpt.storage.options import RemoteOptions
from pyckpt.testing import servers
from pyckpt.testing.gcs_server import gcs_server
from pyckpt.testing.requirements import require

HERE = pathlib.Path(__file__).parent
PACKAGE = pathlib.Path(__import__("pyckpt").__file__).parent

LIMITS = {"stall_timeout": 2.0, "deadline": 5.0, "cleanup_timeout": 2.0, "backoff_max": 1.0,
          "timeout": 30.0, "max_concurrency": 2, "part_size": 5 << 20}
#: the later runs, once the store is back (every route at once, on a loaded machine):
#: limits nearer the defaults, so that their best-effort sweeps finish
AGAIN = {**LIMITS, "stall_timeout": 10.0, "deadline": 30.0, "cleanup_timeout": 10.0}
BOUND = RemoteOptions(**LIMITS).failure_bound()
#: seconds from the route's error to its process's exit (20 processes end at once on
#: this machine's 2 cores: most take 1-3 s, those that imported torch up to 7 s)
EXIT_GRACE = 10.0
MIB = {"s3": 128, "gs": 48}  # MiB each route moves (the GCS emulator is a Python server)


@dataclasses.dataclass(frozen=True)
class Route:
    name: str               # the function of route_child.py
    entries: frozenset      # the store entry points it goes through ("module:qualname")
    writes: bool = True     # False: it reads (nothing to commit)
    prepare: bool = False   # a first run against a healthy store (a read's source, a base)


def _r(name, *entries, **kw):
    return Route(name, frozenset(f"pyckpt.{e}" for e in entries), **kw)


ROUTES = [
    # writes
    _r("save", "engine.write_executor:write_shards"),
    _r("save_async", "engine.write_executor:write_shards"),
    _r("save_workers", "engine.write_executor:write_shards"),
    _r("manager_async", "engine.write_executor:write_shards"),
    _r("manager_incremental", "engine.write_executor:write_shards",
       "engine.references:references_of", prepare=True),
    _r("tiered_persist", "engine.copy:copy_file"),
    _r("tiered_incremental", "engine.write_executor:write_shards", prepare=True),
    _r("node_tiers", "engine.copy:copy_file"),
    _r("copy_to_store", "engine.copy:copy_file"),
    _r("export_tensorflow", "codecs.tensorflow.writer:write_bundle"),
    _r("export_safetensors", "codecs.safetensors:write_file"),
    _r("export_hf", "codecs.safetensors:write_file"),
    _r("dcp_writer", "engine.write_executor:write_shards"),
    # reads
    _r("load", "engine.read_executor:_fetch_and_verify.<locals>.fetch", writes=False,
       prepare=True),
    _r("reader", "engine.read_executor:_fetch_and_verify.<locals>.fetch", writes=False,
       prepare=True),
    _r("copy_from_store", "engine.read_executor:read_window", writes=False, prepare=True),
    _r("load_safetensors", "codecs.safetensors:SafetensorsFile.__init__",
       "codecs.safetensors:SafetensorsFile.read_new", writes=False, prepare=True),
    _r("load_tensorflow", "codecs.tensorflow.bundle:TensorFlowCheckpoint._read_strings",
       writes=False, prepare=True),
    _r("load_dcp", "codecs.distcp.checkpoint:DCPCheckpoint._probe",
       "codecs.distcp.checkpoint:DCPCheckpoint._prefetch",
       "codecs.distcp.checkpoint:DCPCheckpoint._read_bytes", writes=False, prepare=True),
    _r("node_tiers_restore", "engine.read_executor:_fetch_and_verify.<locals>.fetch",
       writes=False, prepare=True),
]

#: callers the scan finds that need no route of their own, and why
NO_ROUTE = {
    "pyckpt.codecs.distcp.archive:Item.get":
        "calls the item's own fetch callback (_ranged below), not a store",
    "pyckpt.codecs.distcp.checkpoint:_ranged.<locals>.fetch":
        "the fallback read of archive bytes that load_dcp's probe and prefetch did not "
        "bring (a zip directory larger than the probed tail); the same guarded read_ranges",
    "pyckpt.manager.node_tiers:NodeTiers._restore_together":
        "calls its fetch callback (peers' files onto the local disk), not a store; its "
        "restore from the durable tier is node_tiers_restore's",
    "pyckpt.workers.node_local:_write_files":
        "writes node-local tiers' files on each node's own disk (local stores only)",
    "pyckpt.codecs.distcp.checkpoint:DCPCheckpoint._not_an_archive":
        "an error path: a 9-byte read to name the format of a file that is no archive",
}

#: the store's bulk entry points: methods of a Store, and the streamed writer
_ENTRY_CALLS = {"write_files", "fetch", "read_ranges", "write_stream"}


def store_entry_callers() -> set:
    """Every function of pyckpt outside storage/ and testing/ that calls a bulk entry
    point of the store, as ``module:qualname`` (the qualname Python gives it)."""
    found = set()
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(PACKAGE.parent).with_suffix("")
        module = ".".join(rel.parts)
        if module.startswith(("pyckpt.storage", "pyckpt.testing")):
            continue
        _collect(ast.parse(path.read_text()), module, [], found)
    return found


def _collect(node, module, scope, found):
    for child in ast.iter_child_nodes(node):
        if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
            inner = scope + [child.name]
            _collect(child, module, inner + ["<locals>"], found)
        elif isinstance(child, ast.ClassDef):
            _collect(child, module, scope + [child.name], found)
        else:
            if isinstance(child, ast.Call) and scope:
                f = child.func
                name = f.attr if isinstance(f, ast.Attribute) else getattr(f, "id", None)
                if name in _ENTRY_CALLS:
                    qual = scope[:-1] if scope[-1] == "<locals>" else scope
                    found.add(f"{module}:{'.'.join(qual)}")
            _collect(child, module, scope, found)


def test_every_store_entry_point_has_a_route():
    callers = store_entry_callers()
    assert "pyckpt.engine.copy:copy_file" in callers  # the scan itself works
    claimed = set().union(*(r.entries for r in ROUTES))
    assert set(NO_ROUTE) <= callers, "NO_ROUTE names entry points that no longer exist"
    assert callers - claimed - set(NO_ROUTE) == set(), (
        "these functions move bytes to or from a store and no route of ROUTES goes "
        "through them: add a route (route_child.py) that does")
    assert claimed - callers == set(), "ROUTES claims entry points that no longer exist"


# -- the cases: every route at once, under one fault -------------------------------------

class Child:
    """A route_child.py process; its stdout lines are read by a thread into a queue."""

    def __init__(self, route, phase, url, options, work):
        self.route, self.phase = route, phase
        self.proc = subprocess.Popen(
            [sys.executable, str(HERE / "route_child.py"), route.name, phase, url,
             json.dumps(options), str(work), str(MIB[url.split(":", 1)[0]])],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
            cwd=work)
        self.lines: queue.Queue = queue.Queue()
        self.err: list = []
        threading.Thread(target=self._pump, daemon=True).start()
        threading.Thread(target=lambda: self.err.extend(self.proc.stderr), daemon=True).start()
        self.result = None
        self.result_at = None  # time.monotonic() the result line arrived
        self.exited_at = None  # time.time() the process ended (the child's "t" is too)
        threading.Thread(target=self._reap, daemon=True).start()

    def _reap(self):
        self.proc.wait()
        self.exited_at = time.time()

    def _pump(self):
        for line in self.proc.stdout:
            self.lines.put(line.strip())
        self.lines.put(None)

    def next_line(self, until):
        """The next stdout line before time.monotonic() reaches ``until`` (None: the
        process ended or the time is up); a JSON line becomes ``result``."""
        try:
            line = self.lines.get(timeout=max(until - time.monotonic(), 0.01))
        except queue.Empty:
            return None
        if line is not None and line.startswith("{"):
            self.result, self.result_at = json.loads(line), time.monotonic()
        return line

    def go(self):
        self.proc.stdin.write("go\n")
        self.proc.stdin.flush()

    def finish(self, timeout):
        try:
            self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        return self.stderr()

    def stderr(self):
        return "".join(self.err)[-3000:]


def _await(child, want, until):
    """Reads until the line ``want``; False when the result or the end came first."""
    while True:
        line = child.next_line(until)
        if line == want:
            return True
        if line is None or child.result is not None:
            return False


def _run_all(routes, phase, base, options, tmp_path):
    """Runs ``phase`` of every route at once against a store that answers; returns
    {route name: its result}, failing on any error."""
    children = [Child(r, phase, f"{base}/{r.name}", options, _work(tmp_path, r))
                for r in routes]
    until = time.monotonic() + 600
    problems = []
    for c in children:
        if _await(c, "armed", until):
            c.go()
    for c in children:
        while c.result is None and c.next_line(until) is not None:
            pass
        err = c.finish(60)
        if c.result is None or c.result["error"] is not None:
            problems.append(f"{c.route.name} ({phase}) failed against a store that answers: "
                            f"{c.result and c.result['message']}\n{err}")
    assert not problems, "\n\n".join(problems)
    return {c.route.name: c.result for c in children}


def _work(tmp_path, route):
    work = tmp_path / route.name
    work.mkdir(exist_ok=True)
    return work


def _fs(url, options):
    import fsspec

    fs = fsspec.filesystem(url.split(":", 1)[0], skip_instance_cache=True,
                           **{k: v for k, v in options.items() if k != "pyckpt"})
    fs.invalidate_cache()
    return fs


_COMMITS = ("pyckpt.index", ".metadata", ".safetensors", ".index", ".index.json")
_HF_SHARD = re.compile(r"model-\d{5}-of-\d{5}\.safetensors$")  # its folder's index commits


def _commits(options, url):
    """The objects under ``url`` that commit something (an index, an export's file)."""
    fs = _fs(url, options)
    root = url.split("://", 1)[1]
    found = fs.find(root) if fs.exists(root) else []
    return sorted(p[len(root):] for p in found
                  if p.endswith(_COMMITS) and not _HF_SHARD.search(p))


def _open_uploads(options, url):
    """The open multipart uploads under ``url`` (S3; a GCS resumable session cannot be
    listed, and expires by itself after a week)."""
    if not url.startswith("s3://"):
        return []
    bucket, key = url.removeprefix("s3://").split("/", 1)
    out = _fs(url, options).call_s3("list_multipart_uploads", Bucket=bucket, Prefix=key + "/")
    return sorted(u["Key"] for u in out.get("Uploads") or [])


@pytest.fixture(scope="module")
def weed(seaweed_server):
    """A SeaweedFS of this module's own: its cases stall and kill it."""
    return seaweed_server


@pytest.fixture(scope="module")
def gcs():
    """A GCS emulator of this module's own, on disk: its cases stall and kill it."""
    require("gcsfs", "a storage server or its client")
    require("gcp_storage_emulator", "a storage server or its client")
    with gcs_server() as server:
        servers.make_bucket("gs", server.options, "pyckpt")
        yield server


def _under_fault(children, server, fault):
    """Starts every child's transfer together, stalls or kills ``server`` while they
    run, collects every result and exit, and brings the server back. Returns the
    problems seen so far and the time.time() of the fault."""
    problems = []
    try:
        until = time.monotonic() + 600
        armed = [c for c in children if _await(c, "armed", until)]
        for c in armed:
            c.go()
        problems += [f"{c.route.name} never reached its transfer: {c.result}\n{c.stderr()}"
                     for c in children if c not in armed]
        time.sleep(0.05)  # every transfer under way: a fast one (a 48 MiB read from the
        # GCS emulator) can finish in well under 0.25 s, before the fault
        server.stop_now() if fault == "stall" else server.kill()
        faulted, faulted_wall = time.monotonic(), time.time()
        until = faulted + BOUND + 60
        for c in children:
            while c.result is None and c.next_line(until) is not None:
                pass
        for c in children:
            c.finish(max(EXIT_GRACE + 30 - (time.monotonic() - (c.result_at or faulted)), 1))
    finally:
        for c in children:
            if c.proc.poll() is None:
                c.proc.kill()
        server.resume() if fault == "stall" else server.start()
    return problems, faulted_wall


def _judge(c, faulted_wall):
    """What is wrong with child ``c``'s outcome under the fault."""
    name, got = c.route.name, c.result
    if got is None:
        return [f"{name}: no result {BOUND + 60:.0f} s after the fault\n{c.stderr()}"]
    out = []
    took = got["t"] - faulted_wall
    if got["error"] is None:
        out.append(f"{name} did not fail: the fault came too late")
    elif not got["checkpoint_error"]:
        out.append(f"{name} raised {got['error']}, not a CheckpointError: {got['message']}\n"
                   f"{c.stderr()}")
    elif took > BOUND:
        out.append(f"{name} failed {took:.1f} s after the fault (bound {BOUND} s): "
                   f"{got['message']}")
    if c.proc.returncode != 0:
        out.append(f"{name}: the process did not end cleanly ({c.proc.returncode})")
    elif c.exited_at is None or c.exited_at - got["t"] > EXIT_GRACE:
        out.append(f"{name}: the process ended {(c.exited_at or time.time()) - got['t']:.1f} s "
                   f"after its error (at most {EXIT_GRACE} s)\n{c.stderr()}")
    return out


@pytest.mark.slow
@pytest.mark.parametrize("fault", ["stall", "kill"])
@pytest.mark.parametrize("scheme", ["s3", "gs"])
def test_every_route_is_bounded_when_the_store_stops(request, tmp_path, scheme, fault):
    """Every route of ROUTES at once, each in its own process, all in the middle of
    their transfers when the store (SeaweedFS over S3, the GCS emulator) is stalled or
    killed."""
    weed = request.getfixturevalue("weed" if scheme == "s3" else "gcs")
    options = {**weed.options, "pyckpt": LIMITS}
    base = f"{scheme}://pyckpt/routes-{fault}-{uuid.uuid4().hex[:8]}"
    _run_all([r for r in ROUTES if r.prepare], "prepare", base, options, tmp_path)
    before = {r.name: _commits(options, f"{base}/{r.name}/dst") for r in ROUTES if r.writes}

    children = [Child(r, "run", f"{base}/{r.name}", options, _work(tmp_path, r))
                for r in ROUTES]
    problems, faulted_wall = _under_fault(children, weed, fault)
    for c in children:
        problems += _judge(c, faulted_wall)
        name = c.route.name
        if c.route.writes and _commits(options, f"{base}/{name}/dst") != before[name]:
            problems.append(f"{name} committed during the fault")
    print(f"\n{scheme} {fault}: seconds from the fault to the route's error (bound {BOUND:g} s)")
    for c in children:
        if c.result is not None:
            exit_s = c.exited_at - c.result["t"] if c.exited_at else float("nan")
            print(f"  {c.route.name:<22} {c.result['t'] - faulted_wall:6.1f} s, exit "
                  f"{exit_s:4.1f} s later  {c.result['error']}")
    assert not problems, "\n\n".join(problems)

    again = _run_all(ROUTES, "run", base, {**options, "pyckpt": AGAIN}, tmp_path)  # it is back
    for r in ROUTES:
        hit = set(again[r.name]["hit"])
        if not r.entries <= hit:
            problems.append(f"{r.name} did not go through {sorted(r.entries - hit)}")
        if r.writes and not set(_commits(options, f"{base}/{r.name}/dst")) - set(before[r.name]):
            problems.append(f"{r.name}: nothing committed when the store was back")
        left = _open_uploads(options, f"{base}/{r.name}")
        if left:
            problems.append(f"{r.name} left multipart uploads open: {left}")
    assert not problems, "\n\n".join(problems)
