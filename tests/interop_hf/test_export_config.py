"""export_hf with the model's config (issue 38, item 3): a dict, a PretrainedConfig,
or a folder whose config.json, generation_config.json and tokenizer files are copied,
from Python and from ``pyckpt cp --format hf --config``, so that transformers'
Auto classes load the folder; a bad config is refused before anything is written."""

from __future__ import annotations

import json
import os
import warnings

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

import pyckpt  # noqa: E402
from pyckpt.cli import main  # noqa: E402
from pyckpt.errors import CheckpointNotFoundError, CorruptCheckpointError  # noqa: E402
from pyckpt.interop import hf_files  # noqa: E402
from pyckpt.interop.safetensors import export_hf  # noqa: E402

IDS = [[1, 5, 7, 2, 90, 3]]


def _model(seed=0):
    torch.manual_seed(seed)
    cfg = transformers.GPT2Config(vocab_size=97, n_positions=16, n_embd=32, n_layer=2, n_head=2,
                                  bos_token_id=0, eos_token_id=0, tie_word_embeddings=True)
    return transformers.GPT2LMHeadModel(cfg).eval()


def _checkpoint(tmp_path, model):
    pyckpt.save({"model": model.state_dict()}, tmp_path / "ck")
    return tmp_path / "ck"


def _unprefix(k):
    return k.removeprefix("model/")


def _logits(model):
    with torch.no_grad():
        return model(torch.tensor(IDS)).logits


def _loads_equal(folder, model):
    again = transformers.AutoModelForCausalLM.from_pretrained(folder).eval()
    assert type(again) is type(model)
    assert torch.equal(_logits(again), _logits(model))


def _tokenizer():
    from tokenizers import Tokenizer, models, pre_tokenizers

    tok = Tokenizer(models.WordLevel({"[UNK]": 0, "a": 1, "b": 2}, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    return transformers.PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="[UNK]")


@pytest.mark.parametrize("given", ["dict", "PretrainedConfig", "config.json file"])
def test_a_config_makes_the_folder_load_with_auto_classes(tmp_path, given):
    model = _model()
    if given == "config.json file":
        model.config.save_pretrained(tmp_path / "cfg")
        os.rename(tmp_path / "cfg" / "config.json", tmp_path / "gpt2.json")
    config = {"dict": model.config.to_dict(), "PretrainedConfig": model.config,
              "config.json file": tmp_path / "gpt2.json"}[given]
    export_hf(_checkpoint(tmp_path, model), tmp_path / "hf", key_map=_unprefix, config=config)
    assert json.loads((tmp_path / "hf" / "config.json").read_text())["model_type"] == "gpt2"
    _loads_equal(tmp_path / "hf", model)


def test_a_folder_gives_its_config_generation_config_and_tokenizer(tmp_path):
    model = _model(1)
    model.save_pretrained(tmp_path / "pretrained")
    _tokenizer().save_pretrained(tmp_path / "pretrained")
    (tmp_path / "pretrained" / "notes.txt").write_text("not copied")
    export_hf(_checkpoint(tmp_path, model), tmp_path / "hf", key_map=_unprefix,
              max_shard_size="30KB", config=tmp_path / "pretrained")
    names = set(os.listdir(tmp_path / "hf"))
    copied = {"config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json"}
    assert copied <= names and not {"notes.txt", "model.safetensors"} & names
    for n in copied:
        assert (tmp_path / "hf" / n).read_bytes() == (tmp_path / "pretrained" / n).read_bytes()
    _loads_equal(tmp_path / "hf", model)
    assert transformers.AutoTokenizer.from_pretrained(tmp_path / "hf")("a b")["input_ids"] == [1, 2]


def _cli(capsys, *args):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        code = main([str(a) for a in args])
    return (code, *capsys.readouterr())


def test_cp_config(tmp_path, capsys):
    model = _model(2)
    model.save_pretrained(tmp_path / "pretrained")
    pyckpt.save(model.state_dict(), tmp_path / "ck")
    code, out, err = _cli(capsys, "cp", tmp_path / "ck", tmp_path / "hf", "--format", "hf",
                          "--config", tmp_path / "pretrained")
    assert code == 0, err
    _loads_equal(tmp_path / "hf", model)
    code, out, err = _cli(capsys, "cp", tmp_path / "ck", tmp_path / "copy",
                          "--config", tmp_path / "pretrained")
    assert code == 1 and "format hf" in err
    assert not (tmp_path / "copy").exists()
    code, out, err = _cli(capsys, "cp", tmp_path / "ck", tmp_path / "hf2", "--format", "hf",
                          "--config", tmp_path / "nowhere")
    assert code == 1 and str(tmp_path / "nowhere") in err and not (tmp_path / "hf2").exists()


def _refused(tmp_path, config, error, match):
    pyckpt.save({"w": torch.ones(3)}, tmp_path / "ck")
    with pytest.raises(error, match=match):
        export_hf(tmp_path / "ck", tmp_path / "hf", config=config)
    assert not (tmp_path / "hf").exists()  # refused before anything is written


def test_a_folder_without_config_json_is_refused(tmp_path):
    _tokenizer().save_pretrained(tmp_path / "tok")
    _refused(tmp_path, tmp_path / "tok", CheckpointNotFoundError,
             f"{tmp_path / 'tok'} holds no config.json")


@pytest.mark.parametrize("text", ["{not json", "[1, 2]", '{"a": 1, "a": 2}'])
def test_a_config_json_that_is_no_json_object_is_refused(tmp_path, text):
    (tmp_path / "cfg").mkdir()
    (tmp_path / "cfg" / "config.json").write_text(text)
    _refused(tmp_path, tmp_path / "cfg", CorruptCheckpointError,
             str(tmp_path / "cfg" / "config.json"))


def test_a_link_in_a_copied_files_place_is_refused(tmp_path):
    (tmp_path / "cfg").mkdir()
    (tmp_path / "cfg" / "config.json").write_text("{}")
    (tmp_path / "secret").write_text("private")
    os.symlink(tmp_path / "secret", tmp_path / "cfg" / "tokenizer.json")
    _refused(tmp_path, tmp_path / "cfg", CorruptCheckpointError, "symbolic link")


def test_a_copied_file_larger_than_the_bound_is_refused(tmp_path, monkeypatch):
    monkeypatch.setattr(hf_files, "MAX_FILE_BYTES", 1000)
    (tmp_path / "cfg").mkdir()
    (tmp_path / "cfg" / "config.json").write_text("{}")
    (tmp_path / "cfg" / "vocab.txt").write_text("x" * 1001)
    _refused(tmp_path, tmp_path / "cfg", CorruptCheckpointError, "vocab.txt has 1001 bytes")


@pytest.mark.parametrize("config", [42, {"x": object()}])
def test_a_config_of_another_kind_is_refused(tmp_path, config):
    _refused(tmp_path, config, TypeError, "config")


def test_config_to_an_object_store(tmp_path):
    model = _model(3)
    url = "memory://pyckpt-test-export-config/hf"
    export_hf(_checkpoint(tmp_path, model), url, key_map=_unprefix, config=model.config)
    import fsspec

    fs = fsspec.filesystem("memory")
    assert json.loads(fs.cat(url + "/config.json"))["model_type"] == "gpt2"
    fs.rm("memory://pyckpt-test-export-config", recursive=True)
