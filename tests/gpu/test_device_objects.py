"""torch objects on the GPU through the object graph: an nn.Module and its AdamW
optimizer saved with pyckpt.Checkpoint and restored into fresh GPU objects;
pyckpt.copy_state and Checkpoint.snapshot() / restore(snapshot) between CUDA modules."""

from __future__ import annotations

import pytest

import pyckpt

torch = pytest.importorskip("torch")

DEV = "cuda:0"


def make_model(seed: int):
    torch.manual_seed(seed)
    return torch.nn.Sequential(
        torch.nn.Linear(16, 32), torch.nn.BatchNorm1d(32), torch.nn.ReLU(),
        torch.nn.Linear(32, 8)).to(DEV)


def train(model, opt, steps: int, seed: int) -> None:
    g = torch.Generator(device="cuda")
    g.manual_seed(seed)
    model.train()
    for _ in range(steps):
        x = torch.randn(64, 16, generator=g, device=DEV)
        loss = model(x).square().mean()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()


def tensors_of(model) -> dict:
    """Parameters and buffers (running stats, num_batches_tracked), by state_dict name."""
    return dict(model.state_dict())


def clone_state(model) -> dict:
    return {k: t.detach().clone() for k, t in tensors_of(model).items()}


def assert_state(model, want: dict) -> None:
    got = tensors_of(model)
    assert set(got) == set(want)
    for k, t in got.items():
        assert t.device == want[k].device, (k, t.device)
        assert t.dtype == want[k].dtype, (k, t.dtype)
        assert torch.equal(t, want[k]), k


def pointers(model) -> dict:
    return {k: t.data_ptr() for k, t in tensors_of(model).items()}


def make_opt(model, kind: str):
    if kind == "fused":
        try:
            return torch.optim.AdamW(model.parameters(), lr=1e-2, fused=True)
        except (TypeError, RuntimeError) as e:
            pytest.skip(f"fused AdamW unavailable: {e}")
    return torch.optim.AdamW(model.parameters(), lr=1e-2)


def opt_state(opt, model) -> dict:
    """name -> {state key: tensor} of an optimizer over ``model``'s parameters."""
    names = {id(p): n for n, p in model.named_parameters()}
    return {names[id(p)]: dict(s) for p, s in opt.state.items()}


@pytest.mark.parametrize("kind", ["default", "fused"])
def test_module_and_adamw_restore_into_fresh_gpu_objects(tmp_path, kind):
    model = make_model(0)
    opt = make_opt(model, kind)
    train(model, opt, 3, seed=1)
    path = pyckpt.Checkpoint(model=model, optimizer=opt).save(str(tmp_path / "ckpt"))

    model2 = make_model(7)
    opt2 = make_opt(model2, kind)  # no state yet: restored through load_state_dict
    ptrs = pointers(model2)
    pyckpt.Checkpoint(model=model2, optimizer=opt2).restore(path).assert_existing_objects_matched()
    torch.cuda.synchronize()

    assert pointers(model2) == ptrs, "module tensors must be filled in place"
    assert_state(model2, clone_state(model))
    want, got = opt_state(opt, model), opt_state(opt2, model2)
    assert set(got) == set(want)
    for name, state in want.items():
        assert set(got[name]) == set(state), name
        for key, value in state.items():
            if isinstance(value, torch.Tensor):
                other = got[name][key]
                assert isinstance(other, torch.Tensor), (name, key)
                assert other.device == value.device, (name, key, other.device, value.device)
                assert torch.equal(other, value), (name, key)
            else:
                assert got[name][key] == value, (name, key)
    for p in model2.parameters():
        assert p.is_cuda
        for key in ("exp_avg", "exp_avg_sq"):
            assert opt2.state[p][key].is_cuda, key
    assert opt2.param_groups[0]["lr"] == opt.param_groups[0]["lr"]

    # Both continue identically: the restored optimizer is the saved one.
    train(model, opt, 2, seed=9)
    train(model2, opt2, 2, seed=9)
    assert_state(model2, clone_state(model))


def test_copy_state_between_cuda_modules(tmp_path):
    src, dst = make_model(0), make_model(1)
    train(src, make_opt(src, "default"), 1, seed=2)  # running stats and counters move too
    ptrs = pointers(dst)
    pyckpt.copy_state(pyckpt.Checkpoint(model=src), pyckpt.Checkpoint(model=dst))
    assert pointers(dst) == ptrs
    assert_state(dst, clone_state(src))


def test_copy_state_between_cuda_state_dicts():
    src, dst = make_model(2), make_model(3)
    ptrs = pointers(dst)
    pyckpt.copy_state(src.state_dict(), dst.state_dict())
    assert pointers(dst) == ptrs
    assert_state(dst, clone_state(src))


def test_copy_state_of_cuda_trees_is_one_batched_copy(monkeypatch):
    """Two state dicts of one structure: one _foreach_copy_, no per-value path."""
    from pyckpt.graph import snapshot as snapshot_mod

    from pyckpt.testing.spies import count_calls

    src, dst = make_model(5), make_model(6)
    foreach = count_calls(monkeypatch, torch, "_foreach_copy_")
    per_value = count_calls(monkeypatch, snapshot_mod, "_sources")
    ptrs = pointers(dst)
    tree_src = {"model": src.state_dict(), "extra": [torch.arange(5, device=DEV)]}
    tree_dst = {"model": dst.state_dict(), "extra": [torch.zeros(5, dtype=torch.int64, device=DEV)]}
    pyckpt.copy_state(tree_src, tree_dst)
    assert (len(foreach), len(per_value)) == (1, 0)
    assert pointers(dst) == ptrs
    assert_state(dst, clone_state(src))
    assert torch.equal(tree_dst["extra"][0], tree_src["extra"][0])


def test_copy_state_strict_reports_a_mismatch():
    src = {"w": torch.zeros(3, 4, device=DEV)}
    dst = {"w": torch.zeros(4, 3, device=DEV)}
    with pytest.raises(ValueError):
        pyckpt.copy_state(src, dst)


def test_snapshot_keeps_the_values_of_its_call_and_restores_in_place():
    model = make_model(4)
    ckpt = pyckpt.Checkpoint(model=model)
    before = clone_state(model)
    snap = ckpt.snapshot()
    with torch.no_grad():  # changed right away, on the same stream
        for p in model.parameters():
            p.mul_(-3).add_(1)
    changed = clone_state(model)
    assert not all(torch.equal(changed[k], before[k]) for k in before)

    other = make_model(5)
    ptrs = pointers(other)
    pyckpt.Checkpoint(model=other).restore(snap)
    assert pointers(other) == ptrs
    assert_state(other, before)

    ptrs = pointers(model)
    ckpt.restore(snap)
    assert pointers(model) == ptrs
    assert_state(model, before)


def test_snapshot_into_reuses_and_refreshes():
    model = make_model(6)
    ckpt = pyckpt.Checkpoint(model=model)
    snap = ckpt.snapshot()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.5)
    now = clone_state(model)
    snap2 = ckpt.snapshot(into=snap)
    with torch.no_grad():
        for p in model.parameters():
            p.zero_()
    target = make_model(8)
    pyckpt.Checkpoint(model=target).restore(snap2)
    assert_state(target, now)


def test_snapshot_of_a_checkpoint_with_optimizer_state_restores(tmp_path):
    model = make_model(9)
    opt = make_opt(model, "default")
    train(model, opt, 2, seed=3)
    ckpt = pyckpt.Checkpoint(model=model, optimizer=opt)
    snap = ckpt.snapshot()
    want_model, want_opt = clone_state(model), {
        n: {k: v.clone() if isinstance(v, torch.Tensor) else v for k, v in s.items()}
        for n, s in opt_state(opt, model).items()}
    train(model, opt, 2, seed=4)  # moves parameters and optimizer state on
    ckpt.restore(snap)
    assert_state(model, want_model)
    got = opt_state(opt, model)
    for name, state in want_opt.items():
        for key, value in state.items():
            if isinstance(value, torch.Tensor):
                assert torch.equal(got[name][key].to(value.device), value), (name, key)


# -- the batched paths (issue 40 item 4) ----------------------------------------------------

def dict_state(seed: int, n: int = 40) -> dict:
    """Many small CUDA tensors of several dtypes, as a training state holds them."""
    g = torch.Generator(device=DEV)
    g.manual_seed(seed)
    out = {}
    for i in range(n):
        out[f"w{i}"] = torch.randn(3 + i, 5, generator=g, device=DEV)
    out["half"] = torch.randn(7, generator=g, device=DEV).to(torch.bfloat16)
    out["step"] = torch.tensor(seed, device=DEV)
    return out


def test_snapshot_and_restore_of_many_tensors_are_one_batched_copy_each(monkeypatch):
    from pyckpt.testing.spies import count_calls

    src = pyckpt.Checkpoint(state=dict_state(1))
    dst = pyckpt.Checkpoint(state=dict_state(2))
    want = {k: t.clone() for k, t in src.state.items()}
    foreach = count_calls(monkeypatch, torch, "_foreach_copy_")
    clones = count_calls(monkeypatch, torch, "_foreach_clone") \
        if hasattr(torch, "_foreach_clone") else []
    snap = src.snapshot()  # new buffers made and filled by one _foreach_clone
    assert (len(clones), len(foreach)) == ((1, 0) if hasattr(torch, "_foreach_clone") else (0, 1))
    assert {snap[k].data_ptr() for k in snap.keys()}.isdisjoint(
        {t.data_ptr() for t in src.state.values()})
    with torch.no_grad():  # queued right after the snapshot's copy, on the same stream
        for t in src.state.values():
            t.add_(1)
    ptrs = {k: t.data_ptr() for k, t in dst.state.items()}
    foreach.clear()
    dst.restore(snap).assert_consumed()
    assert len(foreach) == 1
    assert {k: t.data_ptr() for k, t in dst.state.items()} == ptrs
    for k, t in dst.state.items():
        assert t.dtype == want[k].dtype and torch.equal(t, want[k]), k


def test_snapshot_into_refills_its_buffers_in_one_batch(monkeypatch):
    from pyckpt.testing.spies import count_calls

    src = pyckpt.Checkpoint(state=dict_state(3))
    snap = src.snapshot()
    bufs = {k: snap[k].data_ptr() for k in snap.keys()}
    with torch.no_grad():
        for t in src.state.values():
            t.mul_(2)
    want = {k: t.clone() for k, t in src.state.items()}
    foreach = count_calls(monkeypatch, torch, "_foreach_copy_")
    snap2 = src.snapshot(into=snap)
    assert len(foreach) == 1
    assert {k: snap2[k].data_ptr() for k in snap2.keys()} == bufs
    with torch.no_grad():
        for t in src.state.values():
            t.zero_()
    for k, t in want.items():
        key = f"state/{k}/.ATTRIBUTES/VARIABLE_VALUE"
        assert torch.equal(snap2[key], t), k


def test_restore_of_a_mismatched_snapshot_names_the_key_and_copies_nothing():
    src = pyckpt.Checkpoint(state={"a": torch.ones(3, device=DEV), "b": torch.ones(4, device=DEV)})
    snap = src.snapshot()
    a, b = torch.zeros(3, device=DEV), torch.zeros(5, device=DEV)
    with pytest.raises(ValueError, match="state/b"):
        pyckpt.Checkpoint(state={"a": a, "b": b}).restore(snap)
    assert not a.any() and not b.any()


def test_copy_state_of_parameters_detaches_each_tensor_once(monkeypatch):
    """A parameter's target is one detached alias (the CUDA branch of the torch hooks
    no longer detaches before device_array does)."""
    from pyckpt import registry
    from pyckpt.testing.spies import count_calls

    p = torch.nn.Parameter(torch.ones(3, device=DEV))
    detach = count_calls(monkeypatch, torch.Tensor, "detach")
    target, _ = registry.target_view(p)
    assert len(detach) == 1 and not target.obj.requires_grad
    assert target.obj.data_ptr() == p.data_ptr()
    detach.clear()
    leaf = registry.leaf_array(p)
    assert len(detach) == 1 and leaf.obj.data_ptr() == p.data_ptr()


def test_copy_state_of_cuda_dicts_checks_every_pair_at_once(monkeypatch):
    from pyckpt.graph import snapshot as snapshot_mod
    from pyckpt.testing.spies import count_calls

    src, dst = dict_state(4), dict_state(5)
    ptrs = {k: t.data_ptr() for k, t in dst.items()}
    foreach = count_calls(monkeypatch, torch, "_foreach_copy_")
    per_value = count_calls(monkeypatch, snapshot_mod, "_sources")
    pyckpt.copy_state(src, dst)
    assert (len(foreach), len(per_value)) == (1, 0)
    assert {k: t.data_ptr() for k, t in dst.items()} == ptrs
    assert all(torch.equal(dst[k], src[k]) for k in src)

    bad = dict(dict_state(6), half=torch.zeros(7, device=DEV))  # float32 where bf16 was
    with pytest.raises(ValueError, match="half"):
        pyckpt.copy_state(src, bad)
    cpu = dict(dict_state(7), step=torch.tensor(0))  # one pair across devices: per value
    per_value.clear()
    pyckpt.copy_state(src, cpu)
    assert len(per_value) == 1 and int(cpu["step"]) == 4


def test_kept_walks_of_cuda_state_walk_once_and_see_new_storage(monkeypatch):
    """snapshot(into=) and restore(snapshot) of CUDA modules and tensors re-check the kept
    walk (graph/walk_cache.py) instead of walking again; a tensor given new storage
    (``.data =``) and a replaced parameter are filled, a new dtype is refused by key."""
    from pyckpt.graph import walk_cache
    from pyckpt.testing.spies import count_calls

    walks = count_calls(monkeypatch, walk_cache, "traverse")
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 4), torch.nn.Linear(4, 2)).to(DEV)
    src = pyckpt.Checkpoint(model=model, state=dict_state(5))
    snap = src.snapshot(into=src.snapshot())
    dst_model = torch.nn.Sequential(torch.nn.Linear(8, 4), torch.nn.Linear(4, 2)).to(DEV)
    dst = pyckpt.Checkpoint(model=dst_model, state=dict_state(6))
    dst.restore(snap).assert_consumed()
    ptrs = {k: t.data_ptr() for k, t in dst.state.items()}
    dst.restore(snap).assert_consumed()
    assert len(walks) == 2  # one per root
    assert {k: t.data_ptr() for k, t in dst.state.items()} == ptrs  # filled in place
    for k, t in src.state.items():
        assert torch.equal(dst.state[k], t), k
    new = torch.zeros_like(dst.state["w0"])
    dst.state["w0"].data = new
    p = torch.nn.Parameter(torch.zeros(4, 8, device=DEV))
    dst_model[0].weight = p
    dst.restore(snap).assert_consumed()
    assert len(walks) == 3
    assert torch.equal(new, src.state["w0"])
    assert torch.equal(p.detach(), model[0].weight.detach())
    dst.state["w1"].data = dst.state["w1"].data.double()
    with pytest.raises(ValueError, match="state/w1"):
        dst.restore(snap)



def test_snapshot_of_a_model_and_its_optimizer_restores_on_the_device(monkeypatch):
    """Checkpoint(model, optimizer).snapshot(): kept for the next snapshots (the state
    dict re-read, a new learning rate taken); restore(snapshot) loads the optimizer
    from new CUDA tensors (engine.clones), never through host memory."""
    from pyckpt.adapters import torch_device
    from pyckpt.testing.spies import count_calls

    model = make_model(7)
    opt = make_opt(model, "default")
    train(model, opt, 2, seed=1)
    ckpt = pyckpt.Checkpoint(model=model, opt=opt)
    snap = ckpt.snapshot()
    opt.param_groups[0]["lr"] = 3e-3
    snap = ckpt.snapshot(into=snap)
    want_model, want_opt = clone_state(model), {
        n: {k: v.clone() for k, v in s.items()} for n, s in opt_state(opt, model).items()}
    train(model, opt, 2, seed=2)
    opt.param_groups[0]["lr"] = 1.0
    to_host = count_calls(monkeypatch, torch_device.TorchCudaEngine, "to_host")
    ckpt.restore(snap).assert_consumed()
    torch.cuda.synchronize()
    assert to_host == []
    assert_state(model, want_model)
    assert opt.param_groups[0]["lr"] == 3e-3
    buffers = {a.obj.data_ptr() for a in snap.arrays.values() if hasattr(a, "obj")}
    for n, s in opt_state(opt, model).items():
        for k, v in s.items():
            assert v.device == want_opt[n][k].device and torch.equal(v, want_opt[n][k]), (n, k)
            assert v.data_ptr() not in buffers  # new memory, not the snapshot's
