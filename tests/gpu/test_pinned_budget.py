"""``max_pinned_bytes`` with CUDA tensors (issue 21): saves stage through a ring of
pinned memory smaller than the state, every value arrives bit-exactly, and the
pinned memory held stays within the budget."""

from __future__ import annotations

import pytest

import pyckpt
from pyckpt.device.buffers import _SHARED

torch = pytest.importorskip("torch")

DEV = "cuda:0"
MiB = 1 << 20


def make_state(seed: int, n: int = 12) -> dict:
    g = torch.Generator(device="cuda")
    g.manual_seed(seed)
    s = {f"w{i}": torch.randn(1 << 20, generator=g, device=DEV) for i in range(n)}  # 4 MiB each
    s["bias"] = torch.randn(1000, generator=g, device=DEV)
    s["step"] = torch.zeros((), device=DEV)
    return s


def host(state: dict) -> dict:
    return {k: v.cpu().clone() for k, v in state.items()}


def check(path, expected: dict) -> None:
    got = pyckpt.load(path)
    assert sorted(got) == sorted(expected)
    for k, v in expected.items():
        assert torch.equal(torch.as_tensor(got[k]).cpu(), v), k


@pytest.mark.parametrize("blocking", [True, False])
def test_save_through_a_ring_smaller_than_the_state(tmp_path, blocking):
    state = make_state(1)
    expected = host(state)
    budget = 10 * MiB  # the state is 48 MiB
    out = pyckpt.save(state, tmp_path / "c", blocking=blocking, max_pinned_bytes=budget)
    if not blocking:
        for v in state.values():  # queued after the save's copies: never in the checkpoint
            v.add_(1.0)
        out.wait()
    check(tmp_path / "c", expected)
    assert 0 < _SHARED.pinned_bytes <= budget
    pyckpt.device.release_staging_memory()


def test_manager_async_saves_keep_one_ring(tmp_path):
    state = make_state(2)
    budget = 12 * MiB
    ckpt = pyckpt.Checkpoint(state=state)
    mgr = pyckpt.CheckpointManager(ckpt, tmp_path / "run", max_to_keep=2,
                                   max_pinned_bytes=budget)
    try:
        for step in range(5):
            expected = host(state)
            mgr.save(checkpoint_number=step, blocking=False)
            for v in state.values():
                v.mul_(1.5)
        mgr.wait_until_finished()
        bufs = mgr._keeper.background.buffers
        assert 0 < bufs.pinned_bytes <= budget and bufs.allocations <= 2
    finally:
        mgr.close()
    fresh = {k: torch.empty_like(v) for k, v in state.items()}
    pyckpt.Checkpoint(state=fresh).restore(mgr.latest_checkpoint).assert_consumed()
    for k, v in expected.items():
        assert torch.equal(fresh[k].cpu(), v), k
