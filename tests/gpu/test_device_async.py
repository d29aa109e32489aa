"""Asynchronous saves of CUDA state (API.md section 9, "Device memory"):
``save(tree, path, blocking=False)`` and ``CheckpointManager.save(blocking=False)``
return once the caller may change the state; values changed afterwards, by kernels on
the current stream or on another stream, never reach that checkpoint."""

from __future__ import annotations

import importlib.util

import pytest

import pyckpt

torch = pytest.importorskip("torch")

# bfloat16 tensors need ml_dtypes on the host side (a test dependency); float16 otherwise
HALF = "bfloat16" if importlib.util.find_spec("ml_dtypes") else "float16"

DEV = "cuda:0"
N = 1 << 22  # 16 MiB of float32 per tensor: copies that take a while
SAVES = 3


def make_state(seed: int) -> dict:
    g = torch.Generator(device="cuda")
    g.manual_seed(seed)
    return {"w": torch.randn(N, generator=g, device=DEV),
            "layers": [torch.randn(1024, 257, generator=g, device=DEV).to(getattr(torch, HALF)),
                       torch.randint(0, 1 << 30, (4096,), generator=g, device=DEV)],
            "step": torch.zeros((), device=DEV)}


def leaves(tree: dict) -> list:
    return [tree["w"], *tree["layers"], tree["step"]]


def busy_current_stream() -> None:
    """Queues ~tens of ms of work on the current stream, so that a save issued now must
    wait for it (the values of the call are those after everything queued before it)."""
    sleep = getattr(torch.cuda, "_sleep", None)
    if sleep is not None:
        sleep(20_000_000)
    else:  # a chain of real kernels instead
        x = torch.ones(1 << 20, device=DEV)
        for _ in range(200):
            x.mul_(1.0)


def advance(tree: dict, k: int) -> None:
    """In-place kernels that change every value (queued on the current stream)."""
    with torch.no_grad():
        tree["w"].add_(k)
        tree["layers"][0].mul_(-1).add_(k)
        tree["layers"][1].add_(k)
        tree["step"].add_(1)


def clone_tree(tree: dict) -> dict:
    return {"w": tree["w"].clone(), "layers": [t.clone() for t in tree["layers"]],
            "step": tree["step"].clone()}


def assert_tree(got: dict, want: dict, where: str) -> None:
    for a, b in zip(leaves(got), leaves(want)):
        a = a if isinstance(a, torch.Tensor) else torch.as_tensor(a)
        assert a.dtype == b.dtype, where
        assert torch.equal(a.to(b.device), b), f"{where}: a value changed after the call reached it"


def mutate(tree: dict, on: str, k: int) -> None:
    """Changes the state right after a save returned: on the current stream, or on a side
    stream ordered after the current one (the CUDA way to hand tensors to another stream)."""
    if on == "current":
        advance(tree, k)
        return
    current = torch.cuda.current_stream()
    side = torch.cuda.Stream()
    side.wait_stream(current)
    with torch.cuda.stream(side):
        advance(tree, k)
    current.wait_stream(side)


@pytest.mark.parametrize("on", ["current", "side"])
def test_async_saves_hold_the_values_of_their_call(tmp_path, on):
    state = make_state(0)
    expected, handles = [], []
    for i in range(SAVES):
        busy_current_stream()
        advance(state, 10 * (i + 1))          # queued: part of the values at the call
        expected.append(clone_tree(state))    # queued too, so exactly those values
        handles.append(pyckpt.save(state, str(tmp_path / f"ckpt-{i}"), blocking=False))
        mutate(state, on, 1000 * (i + 1))     # right away: must not reach save i
    for i, h in enumerate(handles):
        assert h.wait() == str(tmp_path / f"ckpt-{i}")
        assert h.done()
    for i in range(SAVES):
        loaded = pyckpt.load(str(tmp_path / f"ckpt-{i}"), device=DEV)
        assert_tree(loaded, expected[i], f"save {i + 1}")
        into = {"w": torch.empty_like(state["w"]),
                "layers": [torch.empty_like(t) for t in state["layers"]],
                "step": torch.empty_like(state["step"])}
        pyckpt.load(str(tmp_path / f"ckpt-{i}"), into=into)
        assert_tree(into, expected[i], f"save {i + 1} (into=)")


def test_async_save_of_a_dropped_tensor(tmp_path):
    """A tensor the caller drops right after the call stays valid until it is copied:
    memory the caching allocator hands out again must not leak into the checkpoint."""
    g = torch.Generator(device="cuda")
    g.manual_seed(5)
    busy_current_stream()
    t = torch.randn(N, generator=g, device=DEV)
    want = t.clone()
    h = pyckpt.save({"t": t}, str(tmp_path / "ckpt"), blocking=False)
    del t
    junk = [torch.full((N,), 7.0, device=DEV) for _ in range(4)]  # may reuse t's block
    h.wait()
    del junk
    got = pyckpt.load(str(tmp_path / "ckpt"), device=DEV)
    assert torch.equal(got["t"], want)


def test_async_save_error_is_raised_by_wait(tmp_path):
    """The background save's failure comes back from wait(), not silently."""
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    h = None
    with pytest.raises(Exception):
        h = pyckpt.save({"w": torch.ones(8, device=DEV)}, str(blocker / "ckpt"), blocking=False)
        h.wait()
    if h is not None:
        assert h.done()


def make_model(seed: int):
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(512, 1024), torch.nn.GELU(),
                               torch.nn.Linear(1024, 512)).to(DEV)


def clone_params(model) -> dict:
    return {k: t.detach().clone() for k, t in model.state_dict().items()}


@pytest.mark.parametrize("on", ["current", "side"])
def test_manager_async_saves_hold_the_values_of_their_call(tmp_path, on):
    model = make_model(0)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    ckpt = pyckpt.Checkpoint(model=model, optimizer=opt)
    manager = pyckpt.CheckpointManager(ckpt, str(tmp_path / "run"), max_to_keep=SAVES + 2)
    expected = []
    try:
        for i in range(SAVES):
            busy_current_stream()
            with torch.no_grad():
                for p in model.parameters():
                    p.add_(i + 1)
            expected.append(clone_params(model))
            manager.save(blocking=False)
            params = list(model.parameters())
            if on == "current":
                with torch.no_grad():
                    for p in params:
                        p.mul_(-2)
            else:
                current = torch.cuda.current_stream()
                side = torch.cuda.Stream()
                side.wait_stream(current)
                with torch.cuda.stream(side), torch.no_grad():
                    for p in params:
                        p.mul_(-2)
                current.wait_stream(side)
        manager.wait_until_finished()
        paths = list(manager.checkpoints)
    finally:
        close = getattr(manager, "close", None)
        if close is not None:
            close()
    assert len(paths) == SAVES
    for i, path in enumerate(paths):
        fresh = make_model(100 + i)
        ptrs = {k: t.data_ptr() for k, t in fresh.state_dict().items()}
        pyckpt.Checkpoint(model=fresh).restore(path).expect_partial()
        torch.cuda.synchronize()
        got = fresh.state_dict()
        assert {k: t.data_ptr() for k, t in got.items()} == ptrs
        for k, want in expected[i].items():
            assert got[k].is_cuda
            assert torch.equal(got[k], want), f"save {i + 1}: {k} changed after the call"
