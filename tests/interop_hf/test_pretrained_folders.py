"""transformers' own folders, as save_pretrained writes them (issue 38, item 2): a
model that fits one file is ``model.safetensors`` alone, no index; a larger one is
sharded with an index; both with config.json and generation_config.json beside. Each
reads through load, load_checkpoint, ``pyckpt ls`` and ``pyckpt inspect``."""

from __future__ import annotations

import json
import os
import warnings

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

import pyckpt  # noqa: E402
from pyckpt.cli import main  # noqa: E402
from pyckpt.errors import CheckpointError  # noqa: E402
from pyckpt.interop.safetensors import export_hf  # noqa: E402


def _model(seed=0):
    torch.manual_seed(seed)
    cfg = transformers.GPT2Config(vocab_size=97, n_positions=16, n_embd=32, n_layer=2, n_head=2,
                                  bos_token_id=0, eos_token_id=0, tie_word_embeddings=True)
    return transformers.GPT2LMHeadModel(cfg)


def _cli(capsys, *args):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        code = main(list(args))
    return (code, *capsys.readouterr())


def _saved(tmp_path, sharded):
    model = _model()
    folder = tmp_path / "hf"
    model.save_pretrained(folder, **({"max_shard_size": "20KB"} if sharded else {}))
    names = set(os.listdir(folder))
    assert {"config.json", "generation_config.json"} <= names
    assert ("model.safetensors.index.json" in names) == sharded
    assert ("model.safetensors" in names) != sharded
    return model, folder


def _equal(out, model):
    sd = model.state_dict()  # save_pretrained leaves the tied lm_head.weight out
    assert set(out) == set(sd) - {"lm_head.weight"}
    for k, v in out.items():
        assert torch.equal(torch.from_numpy(np.asarray(v)), sd[k]), k


@pytest.mark.parametrize("sharded", [False, True], ids=["single-file", "sharded"])
def test_save_pretrained_folder_reads_everywhere(tmp_path, capsys, sharded):
    model, folder = _saved(tmp_path, sharded)
    _equal(pyckpt.load(folder), model)
    _equal(pyckpt.load(str(folder)), model)
    reader = pyckpt.load_checkpoint(folder)
    assert reader.source.format == "hf-safetensors"
    _equal({k: reader.get_tensor(k) for k in reader.keys()}, model)
    code, out, err = _cli(capsys, "ls", str(folder), "--json")
    (row,) = json.loads(out)
    assert code == 0, err
    assert row["status"] == "committed" and row["format"] == "hf-safetensors"
    assert row["tensors"] == len(model.state_dict()) - 1
    code, out, err = _cli(capsys, "ls", str(tmp_path), "--json")  # the folder above it
    assert code == 0 and [(r["name"], r["status"]) for r in json.loads(out)] == [
        ("hf", "committed")]
    code, out, err = _cli(capsys, "inspect", str(folder), "transformer.wte.weight")
    assert code == 0 and "[97, 32]" in out, err
    code, out, err = _cli(capsys, "verify", str(folder))
    assert code == 0, err


def test_model_safetensors_is_read_before_an_index_as_from_pretrained_does(tmp_path):
    old, folder = _saved(tmp_path, sharded=True)
    new = _model(1)
    new.save_pretrained(folder)  # leaves the old shards and index (as transformers does)
    assert "model.safetensors.index.json" in os.listdir(folder)
    again = transformers.GPT2LMHeadModel.from_pretrained(folder)
    assert torch.equal(again.transformer.wte.weight, new.transformer.wte.weight)
    _equal(pyckpt.load(folder), new)


def test_export_over_a_single_file_folder_replaces_its_weights(tmp_path):
    _, folder = _saved(tmp_path, sharded=False)
    new = _model(2)
    pyckpt.save({k: v for k, v in new.state_dict().items() if k != "lm_head.weight"},
                tmp_path / "ck")
    export_hf(tmp_path / "ck", folder)
    assert "model.safetensors" not in os.listdir(folder)  # else from_pretrained reads it
    again = transformers.GPT2LMHeadModel.from_pretrained(folder)
    assert torch.equal(again.transformer.wte.weight, new.transformer.wte.weight)


@pytest.mark.parametrize("sharded", [False, True], ids=["single-file", "sharded"])
def test_export_onto_the_folder_it_reads_is_refused(tmp_path, sharded):
    model, folder = _saved(tmp_path, sharded)
    before = sorted(os.listdir(folder))
    with pytest.raises(CheckpointError, match="replace the files it reads"):
        export_hf(folder, folder)
    if not sharded:
        with pytest.raises(CheckpointError, match="replace the files it reads"):
            export_hf(folder / "model.safetensors", folder)
    assert sorted(os.listdir(folder)) == before
    _equal(pyckpt.load(folder), model)


def test_a_link_in_model_safetensors_place_is_refused(tmp_path):
    _, folder = _saved(tmp_path, sharded=False)
    os.rename(folder / "model.safetensors", tmp_path / "elsewhere.safetensors")
    os.symlink(tmp_path / "elsewhere.safetensors", folder / "model.safetensors")
    with pytest.raises(CheckpointError, match="symbolic link"):
        pyckpt.load(folder)
