"""Fine-tuning a frozen GPT-2 with incremental saves: each save after the first writes
only the trained part.

A tiny GPT-2 from transformers (random weights, tied embeddings, no download, about
3.7 MB of float32) is frozen; a small residual adapter before the tied LM head and the
final layer norm are trained (neither is tied to a frozen weight), with AdamW over
those parameters only, dropout on and the global random state (pyckpt.GlobalRNG) in
the checkpoint. ``CheckpointManager(..., incremental=True, max_to_keep=3)`` saves
after every step.

- every save after the first writes (own bytes of its index, and data-file bytes in
  its directory) about the trained parameters + their AdamW state + the random state,
  far less than the model; the frozen base is referenced in the first save;
- every kept checkpoint restores bit for bit into a fresh model and optimizer
  (built from other seeds), the newest through ``pyckpt.load`` and ``verify`` too;
- training resumed from the newest gives the loss and weights of the run that went on.
"""

from __future__ import annotations

import os

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

import pyckpt  # noqa: E402
from pyckpt.engine.reader import open_checkpoint  # noqa: E402

VOCAB, SEQ, EMBD, BATCH, STEPS = 1000, 32, 128, 4, 6
KEEP = 3
SLACK = 64 * 1024


class FrozenGPT2WithAdapter(torch.nn.Module):
    """GPT-2 (frozen) whose last hidden state goes through ``h + adapter(h)`` and the
    final layer norm (both trained) to the tied LM head (frozen)."""

    def __init__(self) -> None:
        super().__init__()
        cfg = transformers.GPT2Config(vocab_size=VOCAB, n_positions=SEQ, n_embd=EMBD,
                                      n_layer=4, n_head=4, bos_token_id=0, eos_token_id=0,
                                      tie_word_embeddings=True)  # dropouts 0.1 (default)
        self.base = transformers.GPT2LMHeadModel(cfg)
        self.adapter = torch.nn.Linear(EMBD, EMBD)

    def forward(self, ids: "torch.Tensor") -> "torch.Tensor":
        h = self.base.transformer(input_ids=ids).last_hidden_state  # ln_f applied
        logits = self.base.lm_head(h + self.adapter(h))
        return torch.nn.functional.cross_entropy(logits[:, :-1].reshape(-1, VOCAB),
                                                 ids[:, 1:].reshape(-1))

    def trainable(self) -> list:
        return list(self.adapter.parameters()) + list(self.base.transformer.ln_f.parameters())


def build(seed: int) -> tuple:
    torch.manual_seed(seed)
    model = FrozenGPT2WithAdapter()
    model.train()  # dropout on: the random state matters
    assert model.base.lm_head.weight is model.base.transformer.wte.weight
    model.requires_grad_(False)
    for p in model.trainable():
        p.requires_grad_(True)
    trained = [p for p in model.parameters() if p.requires_grad]
    assert {id(p) for p in trained} == {id(p) for p in model.trainable()}
    assert all(p.data_ptr() != model.base.transformer.wte.weight.data_ptr() for p in trained)
    opt = torch.optim.AdamW(trained, lr=1e-3, weight_decay=0.01)
    ckpt = pyckpt.Checkpoint(model=model, optimizer=opt, rng=pyckpt.GlobalRNG())
    return model, opt, ckpt


def batch(step: int) -> "torch.Tensor":
    return torch.randint(0, VOCAB, (BATCH, SEQ), generator=torch.Generator().manual_seed(step))


def train_step(model, opt, step: int) -> str:
    loss = model(batch(step))
    opt.zero_grad()
    loss.backward()
    opt.step()
    return float(loss.item()).hex()


def tensor_bytes(ts) -> int:
    seen, n = set(), 0
    for t in ts:
        if t.data_ptr() not in seen:  # tied weights once
            seen.add(t.data_ptr())
            n += t.numel() * t.element_size()
    return n


def snapshot(model, opt) -> tuple[dict, dict]:
    sd = {k: v.detach().clone() for k, v in model.state_dict().items()}
    osd = opt.state_dict()
    state = {i: {k: (v.clone() if torch.is_tensor(v) else v) for k, v in s.items()}
             for i, s in osd["state"].items()}
    return sd, {"state": state, "param_groups": [dict(g) for g in osd["param_groups"]]}


def assert_same(model, opt, want: tuple[dict, dict]) -> None:
    sd, osd = snapshot(model, opt)
    want_sd, want_osd = want
    assert sd.keys() == want_sd.keys()
    for k in sd:
        a, b = sd[k], want_sd[k]
        assert a.dtype == b.dtype and a.shape == b.shape, k
        assert a.numpy().tobytes() == b.numpy().tobytes(), k
    assert osd["param_groups"] == want_osd["param_groups"]
    assert osd["state"].keys() == want_osd["state"].keys()
    for i, s in osd["state"].items():
        w = want_osd["state"][i]
        assert s.keys() == w.keys(), i
        for k in s:
            assert torch.is_tensor(s[k]) == torch.is_tensor(w[k]), (i, k)
            if torch.is_tensor(s[k]):
                assert s[k].dtype == w[k].dtype and s[k].shape == w[k].shape, (i, k)
                assert s[k].numpy().tobytes() == w[k].numpy().tobytes(), (i, k)
            else:
                assert s[k] == w[k], (i, k)


def data_bytes(directory) -> int:
    return sum(os.path.getsize(os.path.join(directory, n)) for n in os.listdir(directory)
               if n.startswith("data-"))


def test_frozen_gpt2_incremental_saves_write_only_the_trained_part(tmp_path):
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        _run(tmp_path)
    finally:
        torch.set_num_threads(threads)


def _run(tmp_path):
    model, opt, ckpt = build(seed=0)
    run = tmp_path / "run"
    mgr = pyckpt.CheckpointManager(ckpt, run, incremental=True, max_to_keep=KEEP)
    saved, written = {}, []
    for step in range(1, STEPS + 1):
        train_step(model, opt, step)
        path = mgr.save()
        saved[path] = (step, snapshot(model, opt))
        man = open_checkpoint(path).manifest
        own, referenced = man.own_and_referenced_bytes()
        written.append((path, own, referenced, data_bytes(path), man.info["incremental"]))

    full_model = tensor_bytes(model.state_dict().values())
    trainable = (tensor_bytes(model.trainable())
                 + tensor_bytes(t for s in opt.state.values() for t in s.values()
                                if torch.is_tensor(t)))
    bound = 1.5 * trainable + SLACK
    figures = {"trainable": trainable, "full_model": full_model,
               "saves": [(os.path.basename(p), own, ref, disk) for p, own, ref, disk, _ in written]}
    print(figures)

    path, own, referenced, disk, inc = written[0]
    assert referenced == 0 and own >= full_model and disk >= own and inc["base"] is None
    for i, (path, own, referenced, disk, inc) in enumerate(written[1:], start=2):
        assert trainable <= own <= bound, (path, own, figures)
        assert trainable <= disk <= bound, (path, disk, figures)
        assert own * 10 < full_model and referenced >= full_model - trainable, (path, figures)
        assert inc["base"] == f"ckpt-{i - 1}" and inc["changed_bytes"] == own, inc
    # what the run directory holds: one full save, then the trained part per kept save
    on_disk = sum(data_bytes(run / n) for n in os.listdir(run) if n.startswith("ckpt-"))
    assert on_disk <= written[0][3] + KEEP * bound, (on_disk, figures)

    kept = mgr.checkpoints
    newest = mgr.latest_checkpoint
    assert len(kept) == KEEP and newest == kept[-1] and newest == written[-1][0]

    # the run goes on one step (before any restore touches the global random state)
    expected_loss = train_step(model, opt, STEPS + 1)
    expected_after = snapshot(model, opt)

    for path in kept:  # every kept checkpoint, bit for bit, into a fresh model + optimizer
        m2, o2, c2 = build(seed=1000)
        assert not torch.equal(m2.adapter.weight, saved[path][1][0]["adapter.weight"])
        c2.restore(path).assert_consumed()
        assert_same(m2, o2, saved[path][1])
        assert m2.base.lm_head.weight is m2.base.transformer.wte.weight

    # resuming from the newest: the loss and weights of the uninterrupted run
    m3, o3, c3 = build(seed=2000)
    c3.restore(newest).assert_consumed()
    step = saved[newest][0]
    assert step == STEPS
    assert train_step(m3, o3, step + 1) == expected_loss
    assert_same(m3, o3, expected_after)

    # the other readers see whole checkpoints (referenced data included)
    pyckpt.load_checkpoint(newest).verify()
    flat = pyckpt.load(newest)  # the nested tree of the checkpoint's keys
    want_sd, want_osd = saved[newest][1]
    trained_idx = 2  # the adapter's weight in the optimizer's parameter order
    checks = [("model/adapter/weight", want_sd["adapter.weight"]),
              ("model/base/transformer/ln_f/bias", want_sd["base.transformer.ln_f.bias"]),
              # the tied embedding is stored once, under the LM head's name
              ("model/base/lm_head/weight", want_sd["base.transformer.wte.weight"]),
              ("model/base/transformer/h/0/attn/c_attn/weight",
               want_sd["base.transformer.h.0.attn.c_attn.weight"]),
              (f"optimizer/state/{trained_idx}/exp_avg_sq",
               want_osd["state"][trained_idx]["exp_avg_sq"]),
              (f"optimizer/state/{trained_idx}/step", want_osd["state"][trained_idx]["step"])]
    assert want_osd["state"][trained_idx]["exp_avg"].shape == (EMBD, EMBD)
    for key, want in checks:
        got = flat
        for part in (key + "/.ATTRIBUTES/VARIABLE_VALUE").split("/"):
            got = got[part]
        # (object-graph checkpoints come back as numpy arrays today, not torch tensors)
        got = got.numpy() if torch.is_tensor(got) else np.asarray(got)
        assert got.dtype == want.numpy().dtype and got.shape == tuple(want.shape), key
        assert got.tobytes() == want.numpy().tobytes(), key
