"""Hostile or broken Hugging Face folders (issue 37, items 6, 8, 9): every defect is a
CorruptCheckpointError naming the file, never a raw FileNotFoundError or
RecursionError; ``pyckpt ls`` lists a broken folder as corrupt; a folder never
loads more tensor bytes than its files hold."""

from __future__ import annotations

import json
import os
import struct
import warnings

import numpy as np
import pytest

import pyckpt
from pyckpt.cli import main
from pyckpt.errors import CorruptCheckpointError
from pyckpt.interop.safetensors import export_hf

INDEX = "model.safetensors.index.json"


def _folder(tmp_path, name="hf"):
    pyckpt.save({"a": np.arange(4.0), "b": np.ones(4, np.float32), "c": np.zeros(2)},
                tmp_path / "ck")
    export_hf(tmp_path / "ck", tmp_path / name, max_shard_size=20)  # a file per tensor
    return tmp_path / name


def _edit_index(folder, edit):
    doc = json.loads((folder / INDEX).read_text())
    (folder / INDEX).write_text(edit(doc) if callable(edit) else edit)


def _cli(capsys, *args):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        code = main(list(args))
    return (code, *capsys.readouterr())


def test_a_missing_shard_is_corrupt_and_listed_as_such(tmp_path, capsys):
    folder = _folder(tmp_path)
    shard = folder / "model-00002-of-00003.safetensors"
    os.remove(shard)
    with pytest.raises(CorruptCheckpointError) as e:
        pyckpt.load(folder)
    assert str(shard) in str(e.value) and "'b'" in str(e.value)
    code, out, err = _cli(capsys, "ls", str(folder), "--json")
    (row,) = json.loads(out)
    assert code == 1 and row["status"] == "corrupt" and str(shard) in row["error"]
    code, out, err = _cli(capsys, "ls", str(tmp_path))  # the run directory holding it
    assert code == 0 and [[ln.split()[0], ln.split()[-1]] for ln in out.splitlines()[1:]] == [
        ["ck", "committed"], ["hf", "corrupt"]]
    code, out, err = _cli(capsys, "verify", str(folder))
    assert code == 1 and str(shard) in err and "Errno" not in err


def test_ls_lists_a_healthy_folder(tmp_path, capsys):
    folder = _folder(tmp_path)
    code, out, _ = _cli(capsys, "ls", str(folder), "--json")
    (row,) = json.loads(out)
    assert code == 0 and row["status"] == "committed" and row["format"] == "hf-safetensors"
    assert row["tensors"] == 3


def test_a_deeply_nested_index_is_corrupt(tmp_path):
    folder = _folder(tmp_path)
    _edit_index(folder, '{"weight_map": {}, "metadata": ' + "[" * 100_000 + "]" * 100_000 + "}")
    with pytest.raises(CorruptCheckpointError, match="nested 100001 levels deep") as e:
        pyckpt.load(folder)
    assert str(folder / INDEX) in str(e.value)


def test_a_deeply_nested_shard_header_is_corrupt(tmp_path):
    folder = _folder(tmp_path)
    shard = folder / "model-00001-of-00003.safetensors"
    body = b'{"a":' + b"[" * 100_000 + b"]" * 100_000 + b"}"
    shard.write_bytes(struct.pack("<Q", len(body)) + body)
    with pytest.raises(CorruptCheckpointError, match="levels deep") as e:
        pyckpt.load(folder)
    assert str(shard) in str(e.value)


def test_a_key_listed_twice_in_the_index_is_refused(tmp_path):
    folder = _folder(tmp_path)
    text = (folder / INDEX).read_text()
    (folder / INDEX).write_text(text.replace(
        '"a": "model-00001-of-00003.safetensors"',
        '"a": "model-00001-of-00003.safetensors", "a": "model-00002-of-00003.safetensors"'))
    with pytest.raises(CorruptCheckpointError, match="'a' appears twice") as e:
        pyckpt.load(folder)
    assert str(folder / INDEX) in str(e.value)


def test_one_file_under_two_names_is_refused(tmp_path):
    folder = _folder(tmp_path)
    os.remove(folder / "model-00002-of-00003.safetensors")  # b's name: a link to a's file
    os.link(folder / "model-00001-of-00003.safetensors", folder / "model-00002-of-00003.safetensors")
    with pytest.raises(CorruptCheckpointError, match="holds tensor 'a'.* gives to model-00001"):
        pyckpt.load(folder)


def test_overlapping_tensors_in_a_shard_are_refused(tmp_path):
    folder = _folder(tmp_path)
    header = {f"x{i}": {"dtype": "U8", "shape": [1024], "data_offsets": [0, 1024]}
              for i in range(50)}
    body = json.dumps(header).encode()
    shard = folder / "model-00001-of-00003.safetensors"
    shard.write_bytes(struct.pack("<Q", len(body)) + body + bytes(1024))
    _edit_index(folder, lambda d: json.dumps({**d, "weight_map": {
        **{k: v for k, v in d["weight_map"].items() if k != "a"},
        **{k: shard.name for k in header}}}))
    with pytest.raises(CorruptCheckpointError, match="overlaps") as e:
        pyckpt.load(folder)
    assert str(shard) in str(e.value)


def test_an_index_key_that_is_not_utf8_is_corrupt(tmp_path):
    folder = _folder(tmp_path)
    text = (folder / INDEX).read_text()
    (folder / INDEX).write_text(text.replace('"c":', '"c\\udc80":'))
    with pytest.raises(CorruptCheckpointError) as e:
        pyckpt.load(folder)
    assert "'c\\udc80'" in str(e.value) and str(folder / INDEX) in str(e.value)


def test_an_export_under_names_safetensors_cannot_hold_writes_nothing(tmp_path):
    pyckpt.save({"a": np.arange(3.0)}, tmp_path / "ck")
    for bad in ("__metadata__", "a\udc80"):
        with pytest.raises(ValueError) as e:
            export_hf(tmp_path / "ck", tmp_path / "hf", key_map={"a": bad})
        assert repr(bad) in str(e.value)
        assert not (tmp_path / "hf").exists() or not os.listdir(tmp_path / "hf")
