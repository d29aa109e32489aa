"""Host memory stays flat over many rounds, in every mode (issue 28, item 3).

Each mode runs in a fresh interpreter (rss_child.py): 3 warm-up rounds (8 for the
tiered manager, whose steady state comes later), then 40 timed
rounds of a 16 MiB state, with the cyclic collector off (and, for a few modes, on:
``COLLECTOR_ON``), never collected by
hand, never trimmed (no malloc_trim), locally and on SeaweedFS. Asserted:

- flat: no round's resident set exceeds the last warm-up round's by more than
  max(32 MiB, 5% of the state);
- peak: over the timed rounds (VmHWM) the process never rises more than the mode's
  documented allowance above the third round (docs/PROTOCOL.md, "Memory"), in
  states and MiB of staging.

The figures of a run are printed (pytest -s) as one table."""

import concurrent.futures
import errno
import json
import pathlib
import subprocess
import sys
import threading

import pytest

from pyckpt.testing.requirements import require

HERE = pathlib.Path(__file__).parent
MiB = 1 << 20

#: mode -> (states, MiB): the most a round may hold above the resident set of the
#: third round, in states and MiB of staging (docs/PROTOCOL.md, "Memory")
PEAK = {
    "save": (0, 8), "save_async": (1, 8), "load": (1, 8), "load_into": (0, 8),
    "load_mmap": (1, 8), "restore": (0, 8), "manager": (0, 8), "manager_async": (1, 8),
    "manager_tiered": (1, 8), "manager_incremental": (1, 8), "copy_state": (0, 8),
    "snapshot": (1, 8), "torch": (0, 8), "dcp": (1, 8), "lightning": (2, 8),
    "export_hf": (1, 8),
}
LOCAL = list(PEAK)
S3 = ["save", "save_async", "load", "load_into", "restore", "manager", "manager_async",
      "manager_tiered", "manager_incremental", "dcp", "lightning", "export_hf"]
#: S3 transfers hold their requests' buffers besides: up to max_concurrency parts
#: of an upload in flight, the small reads merged into one request (RemoteOptions)
S3_STAGING_MIB = 24

#: children at once: each mostly waits on its store or its imports
PARALLEL = 3

FIGURES: list[str] = []

#: one child started at a time: CPython starts children with vfork(), and a CI run
#: saw exec fail with EFAULT ("Bad address") while three threads started children
#: at once; the children still run side by side
_SPAWN = threading.Lock()


def _needs(mode):
    if mode in ("torch", "dcp", "lightning"):
        require("torch", f"the {mode} mode")
    if mode == "lightning":
        require("lightning", "the lightning mode")


def _run(mode, collector, work, options=None):
    cmd = [sys.executable, str(HERE / "rss_child.py"), mode, str(work), collector]
    if options is not None:
        cmd.append(json.dumps(options))
    for attempt in range(2):
        try:
            with _SPAWN:
                child = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                         text=True, cwd=work)
            break
        except OSError as e:  # the child never ran: starting it again is safe, once
            if e.errno != errno.EFAULT or attempt:
                raise
    try:
        stdout, stderr = child.communicate(timeout=300)
    finally:
        child.kill()
        child.wait()
    assert child.returncode == 0, stderr[-3000:]
    return json.loads(stdout.strip().splitlines()[-1])


def _judge(got, where, staging_mib=0):
    rss, warm, state = got["rss"], got["warmup"], got["state"]
    base = rss[warm - 1]
    growth = max(rss[warm:]) - base
    peak = got["peak"] - base
    states, mib = PEAK[got["mode"]]
    allowed_peak = states * state + (mib + staging_mib) * MiB
    flat = max(32 * MiB, state // 20)
    FIGURES.append(f"{where:<5} {got['mode']:<20} gc {got['collector']:<3} third round "
                   f"{base / MiB:6.0f} MiB, growth {growth / MiB:5.1f} MiB (max {flat / MiB:.0f}), "
                   f"peak +{peak / MiB:5.1f} MiB (max {allowed_peak / MiB:.0f})")
    assert growth <= flat, (f"{got['mode']} ({where}, collector {got['collector']}): the "
                            f"resident set grew {growth / MiB:.1f} MiB after the third round: "
                            f"{[round(r / MiB) for r in rss]}")
    assert peak <= allowed_peak, (f"{got['mode']} ({where}, collector {got['collector']}): "
                                  f"peak {peak / MiB:.1f} MiB above the third round, allowed "
                                  f"{allowed_peak / MiB:.0f} MiB")


@pytest.fixture(scope="module", autouse=True)
def _figures():
    yield
    print("\nmemory suite: 40 rounds of a 16 MiB state after 3 warm-up rounds, untrimmed")
    print("\n".join(FIGURES))


@pytest.fixture(scope="module")
def children(request, tmp_path_factory):
    """Every selected case of this module, run by up to PARALLEL children at once
    (their memory is each their own; nothing here is timed): (where, mode,
    collector) -> a future of the child's figures."""
    cases = [(item.callspec.params["where"], item.callspec.params["mode"],
              item.callspec.params["collector"])
             for item in request.session.items
             if item.module is request.module and hasattr(item, "callspec")]
    options = request.getfixturevalue("seaweed_server").options \
        if any(w == "s3" for w, _, _ in cases) else None
    pool = concurrent.futures.ThreadPoolExecutor(PARALLEL)
    futures = {}
    for where, mode, collector in cases:
        work = tmp_path_factory.mktemp(f"{where}-{mode}-{collector}")
        futures[where, mode, collector] = pool.submit(
            _run, mode, collector, work, options if where == "s3" else None)
    yield futures
    pool.shutdown(wait=True, cancel_futures=True)


#: every mode runs with the cyclic collector off: what cycles keep alive is then never
#: freed, so a cycle through a round's arrays shows as growth; with the collector on a
#: process can only hold less, so "on" runs for a few modes only, one per kind of work
#: (it halved the suite's children: CI's time is spent where it finds something)
COLLECTOR_ON = {("local", "save"), ("local", "load"), ("local", "manager_async"),
                ("local", "torch"), ("s3", "save"), ("s3", "load")}
CASES = [(w, m, c) for w, modes in (("local", LOCAL), ("s3", S3)) for m in modes
         for c in ("off", "on") if c == "off" or (w, m) in COLLECTOR_ON]


@pytest.mark.slow
@pytest.mark.parametrize("where,mode,collector", CASES, ids=[f"{w}-{m}-{c}" for w, m, c in CASES])
def test_memory_is_flat(children, where, mode, collector):
    _needs(mode)
    got = children[where, mode, collector].result()
    _judge(got, where, S3_STAGING_MIB if where == "s3" else 0)
