"""Issue 14: a real training run resumes bit for bit, random state included.

A tiny GPT-2 from transformers (random weights, tied embeddings, no download) with
dropout on, AdamW, a StepLR scheduler, a stateful data sampler and the global
random state (pyckpt.GlobalRNG): 5 steps, save, 5 more steps. A fresh process
builds everything with other seeds, restores, runs the same 5 steps: the losses
and the final weights are equal bit for bit, and the tied weights still tied.

The fresh process is this file run as a script (``python test_gpt2_resume.py
resume CKPT``), which prints its losses as JSON.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

import pyckpt  # noqa: E402

VOCAB, SEQ, N_DATA, BATCH = 97, 16, 40, 4


class ShuffleSampler:
    """Shuffled indices, epoch after epoch, from its own torch.Generator; resumable
    mid-epoch through state_dict() / load_state_dict() (tensors and ints)."""

    def __init__(self, n: int, seed: int) -> None:
        self.n = n
        self.generator = torch.Generator().manual_seed(seed)
        self.epoch, self.pos = 0, 0
        self.perm = torch.randperm(n, generator=self.generator)

    def take(self, k: int) -> list[int]:
        out = []
        for _ in range(k):
            if self.pos == self.n:
                self.epoch, self.pos = self.epoch + 1, 0
                self.perm = torch.randperm(self.n, generator=self.generator)
            out.append(int(self.perm[self.pos]))
            self.pos += 1
        return out

    def state_dict(self) -> dict:
        return {"epoch": self.epoch, "pos": self.pos, "perm": self.perm.clone(),
                "generator": self.generator.get_state()}

    def load_state_dict(self, sd: dict) -> None:
        self.epoch, self.pos = sd["epoch"], sd["pos"]
        self.perm = sd["perm"].clone()
        self.generator.set_state(sd["generator"])


def build(seed: int) -> tuple:
    """Model, optimizer, scheduler, sampler and checkpoint; ``seed`` decides every
    initial value (weights, sampler, global random state)."""
    torch.manual_seed(seed)
    cfg = transformers.GPT2Config(vocab_size=VOCAB, n_positions=SEQ, n_embd=32, n_layer=2,
                                  n_head=2, resid_pdrop=0.1, embd_pdrop=0.1, attn_pdrop=0.1,
                                  bos_token_id=0, eos_token_id=0, tie_word_embeddings=True)
    model = transformers.GPT2LMHeadModel(cfg)
    model.train()  # dropout on
    assert model.lm_head.weight is model.transformer.wte.weight
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.01)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=3, gamma=0.5)
    sampler = ShuffleSampler(N_DATA, seed=seed + 1)
    ckpt = pyckpt.Checkpoint(model=model, optimizer=opt, scheduler=sched, sampler=sampler,
                             rng=pyckpt.GlobalRNG())
    return model, opt, sched, sampler, ckpt


def data() -> "torch.Tensor":
    return torch.randint(0, VOCAB, (N_DATA, SEQ), generator=torch.Generator().manual_seed(7))


def train(model, opt, sched, sampler, steps: int) -> list[str]:
    """``steps`` steps; the losses as float.hex (exact)."""
    tokens = data()
    losses = []
    for _ in range(steps):
        batch = tokens[sampler.take(BATCH)]
        loss = model(input_ids=batch, labels=batch).loss
        opt.zero_grad()
        loss.backward()
        opt.step()
        sched.step()
        losses.append(float(loss.item()).hex())
    return losses


def digest(model) -> str:
    h = hashlib.sha256()
    for name, p in sorted(model.state_dict().items()):
        h.update(name.encode())
        h.update(p.detach().contiguous().numpy().tobytes())
    return h.hexdigest()


def resume(path: str) -> dict:
    """The fresh process: other seeds everywhere, then restore and train 5 steps."""
    model, opt, sched, sampler, ckpt = build(seed=1000)
    ckpt.restore(path).assert_consumed()
    tied = (model.lm_head.weight is model.transformer.wte.weight
            and model.lm_head.weight.data_ptr() == model.transformer.wte.weight.data_ptr())
    losses = train(model, opt, sched, sampler, 5)
    return {"losses": losses, "digest": digest(model), "tied": tied,
            "lr": opt.param_groups[0]["lr"], "last_epoch": sched.last_epoch}


def test_gpt2_with_dropout_resumes_bit_for_bit(tmp_path):
    torch.set_num_threads(1)
    model, opt, sched, sampler, ckpt = build(seed=0)
    train(model, opt, sched, sampler, 5)
    path = ckpt.save(tmp_path / "ckpt")
    keys = [k for k, _ in pyckpt.list_variables(path)]
    tied = [k for k in keys if k.endswith("wte/weight/.ATTRIBUTES/VARIABLE_VALUE")
            or k.endswith("lm_head/weight/.ATTRIBUTES/VARIABLE_VALUE")]
    assert len(tied) == 1  # the tied weight is stored once
    assert any(k.startswith("rng/torch/cpu/") for k in keys)
    assert "scheduler/last_epoch/.ATTRIBUTES/VARIABLE_VALUE" in keys
    assert "sampler/perm/.ATTRIBUTES/VARIABLE_VALUE" in keys
    expected = train(model, opt, sched, sampler, 5)

    env = dict(os.environ, OMP_NUM_THREADS="1")
    r = subprocess.run([sys.executable, __file__, "resume", path], capture_output=True,
                       text=True, timeout=600, env=env)
    assert r.returncode == 0, r.stderr[-4000:]
    got = json.loads(r.stdout.strip().splitlines()[-1])
    assert got["tied"]
    assert got["losses"] == expected
    assert got["digest"] == digest(model)
    assert got["lr"] == opt.param_groups[0]["lr"] and got["last_epoch"] == sched.last_epoch

    # without the random state, dropout makes the resumed run differ (the point of GlobalRNG)
    model2, opt2, sched2, sampler2, ckpt2 = build(seed=1000)
    del ckpt2.rng
    ckpt2.restore(path).expect_partial()
    assert train(model2, opt2, sched2, sampler2, 5) != expected


if __name__ == "__main__":
    if sys.argv[1:2] == ["resume"]:
        torch.set_num_threads(1)
        print(json.dumps(resume(sys.argv[2])))
