"""Background saves of CUDA state through a snapshot in device memory, and the first
save without a pinning stall (issue 40 items 1 and 2; pyckpt/device/snapshot.py).

Values changed by kernels queued after the call (on the current stream, or on a side
stream ordered after it) never reach the checkpoint; the snapshot's device memory is
reported and freed by ``close()`` / ``release_staging_memory()``; with snapshots off
(``max_device_snapshot_bytes=0``) or short of device memory the save stages through
pinned host memory as before."""

from __future__ import annotations

import gc
import threading

import pytest

import pyckpt
from pyckpt import AsyncOptions, CheckpointManagerOptions

torch = pytest.importorskip("torch")

DEV = "cuda:0"
N = 1 << 22  # 16 MiB of float32 per tensor


def make_state(seed: int) -> dict:
    g = torch.Generator(device="cuda")
    g.manual_seed(seed)
    return {"w": torch.randn(N, generator=g, device=DEV),
            "b": torch.randn(1024, 257, generator=g, device=DEV).to(torch.float16),
            "i": torch.randint(0, 1 << 30, (4096,), generator=g, device=DEV),
            "step": torch.zeros((), device=DEV)}


def busy_current_stream() -> None:
    """Queues ~tens of ms of work on the current stream (a save issued now must copy
    the values after it)."""
    sleep = getattr(torch.cuda, "_sleep", None)
    if sleep is not None:
        sleep(20_000_000)
    else:
        x = torch.ones(1 << 20, device=DEV)
        for _ in range(200):
            x.mul_(1.0)


def advance(state: dict, k: int) -> None:
    with torch.no_grad():
        state["w"].add_(k)
        state["b"].mul_(-1).add_(k)
        state["i"].add_(k)
        state["step"].add_(1)


def mutate(state: dict, on: str, k: int) -> None:
    if on == "current":
        advance(state, k)
        return
    current = torch.cuda.current_stream()
    side = torch.cuda.Stream()
    side.wait_stream(current)
    with torch.cuda.stream(side):
        advance(state, k)
    current.wait_stream(side)


def assert_state(path: str, want: dict, where: str) -> None:
    got = pyckpt.load(path, device=DEV)
    for k, v in want.items():
        assert got[k].dtype == v.dtype, where
        assert torch.equal(got[k], v), f"{where}: {k} changed after the call reached it"


@pytest.fixture(autouse=True)
def _release():
    yield
    pyckpt.device.release_staging_memory()


@pytest.mark.parametrize("on", ["current", "side"])
def test_device_snapshot_holds_the_values_of_the_call(tmp_path, on):
    state = make_state(0)
    expected, handles = [], []
    for i in range(3):
        busy_current_stream()
        advance(state, 10 * (i + 1))
        expected.append({k: v.clone() for k, v in state.items()})
        h = pyckpt.save(state, str(tmp_path / f"c{i}"), blocking=False)
        assert h.staging.route == "device", h.staging  # an H100/H200 has room for 64 MiB
        mutate(state, on, 1000 * (i + 1))
        handles.append(h)
    for i, h in enumerate(handles):
        assert_state(h.wait(), expected[i], f"save {i + 1}")
    nbytes = sum(v.nbytes for v in state.values())
    assert handles[-1].staging.device_bytes >= nbytes
    assert handles[-1].staging.pinned_bytes >= nbytes  # the drain's pinned pool


def test_snapshot_memory_is_freed_by_release(tmp_path):
    state = make_state(1)
    pyckpt.save(state, str(tmp_path / "c"), blocking=False).wait()
    gc.collect()
    torch.cuda.synchronize()
    held = torch.cuda.memory_allocated(DEV)
    pyckpt.device.release_staging_memory()
    assert torch.cuda.memory_allocated(DEV) <= held - sum(v.nbytes for v in state.values())


@pytest.mark.parametrize("budget", [0, 1 << 20])
def test_no_snapshot_when_off_or_over_the_budget(tmp_path, budget):
    state = make_state(2)
    want = {k: v.clone() for k, v in state.items()}
    h = pyckpt.save(state, str(tmp_path / "c"), blocking=False, max_device_snapshot_bytes=budget)
    assert h.staging.route in ("pinned", "plain") and h.staging.device_bytes == 0
    advance(state, 7)
    assert_state(h.wait(), want, "host-staged")


def test_first_save_pins_nothing_in_the_call(tmp_path, monkeypatch):
    from pyckpt.adapters.torch_device import engine_for

    eng = engine_for(torch, DEV)
    callers = []
    alloc = eng.alloc_host

    def recording(n):
        callers.append(threading.current_thread())
        return alloc(n)

    monkeypatch.setattr(eng, "alloc_host", recording)
    state = make_state(3)
    want = {k: v.clone() for k, v in state.items()}
    h = pyckpt.save(state, str(tmp_path / "c"), blocking=False)
    advance(state, 3)
    assert_state(h.wait(), want, "first save")
    assert threading.current_thread() not in callers  # pinned by the drain, not the call


def test_manager_snapshot_reports_and_frees_on_close(tmp_path):
    state = make_state(4)
    opts = CheckpointManagerOptions(async_options=AsyncOptions(max_device_snapshot_bytes=None))
    m = pyckpt.CheckpointManager(pyckpt.Checkpoint(state=state), str(tmp_path / "run"),
                                 options=opts)
    try:
        for step in range(3):
            want = {k: v.clone() for k, v in state.items()}
            m.save(checkpoint_number=step, blocking=False)
            report = m.last_staging
            assert report.route == "device" and report.device_bytes >= \
                sum(v.nbytes for v in state.values())
            advance(state, 5)
        m.wait_until_finished()
        assert m.last_staging.pinned_bytes > 0
    finally:
        m.close()
    assert m._keeper.background.snapshot.device_bytes == 0
    fresh = {k: torch.empty_like(v) for k, v in state.items()}
    pyckpt.Checkpoint(state=fresh).restore(m.latest_checkpoint).assert_consumed()
    for k, v in want.items():
        assert torch.equal(fresh[k], v), k


def test_pinned_buffers_are_registered_touched_memory():
    from pyckpt.adapters.torch_device import engine_for

    eng = engine_for(torch, DEV)
    buf = eng.alloc_host(3 << 20)
    try:
        assert buf.nbytes == 3 << 20
        assert eng._pinned[id(buf)][0] == "registered"  # not torch's pinned allocator
        assert not buf.any()  # touched (zeroed) before it was registered
        assert torch.from_numpy(buf).is_pinned()
    finally:
        eng.free_host(buf)
