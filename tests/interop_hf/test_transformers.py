"""Hugging Face folders against transformers itself (issue 24 item 3): what
save_pretrained writes (sharded) loads through pyckpt, and what export_hf writes
from a pyckpt checkpoint loads with from_pretrained, weights bit for bit."""

from __future__ import annotations

import json

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

import pyckpt  # noqa: E402
from pyckpt.interop.safetensors import export_hf  # noqa: E402


def _model(seed):
    torch.manual_seed(seed)
    cfg = transformers.GPT2Config(vocab_size=97, n_positions=16, n_embd=32, n_layer=2, n_head=2,
                                  bos_token_id=0, eos_token_id=0, tie_word_embeddings=True)
    return transformers.GPT2LMHeadModel(cfg)


def _same(a, b):
    return a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b)


def test_save_pretrained_folder_loads_through_pyckpt(tmp_path):
    model = _model(0)
    model.save_pretrained(tmp_path / "hf", max_shard_size="20KB")
    index = json.loads((tmp_path / "hf" / "model.safetensors.index.json").read_text())
    assert len(set(index["weight_map"].values())) > 1  # really sharded
    out = pyckpt.load(tmp_path / "hf")
    sd = model.state_dict()
    assert set(out) == set(index["weight_map"])
    for k, v in out.items():
        assert _same(v if isinstance(v, torch.Tensor) else torch.from_numpy(v), sd[k]), k


def test_export_hf_folder_loads_with_from_pretrained(tmp_path):
    model = _model(1)
    pyckpt.save({"model": model.state_dict()}, tmp_path / "ck")
    model.config.save_pretrained(tmp_path / "hf")
    export_hf(tmp_path / "ck", tmp_path / "hf", max_shard_size="30KB",
              key_map=lambda k: k.removeprefix("model/"))
    again = transformers.GPT2LMHeadModel.from_pretrained(tmp_path / "hf")
    theirs = again.state_dict()
    for k, v in model.state_dict().items():
        assert _same(theirs[k], v), k
    assert again.lm_head.weight.data_ptr() == again.transformer.wte.weight.data_ptr()
