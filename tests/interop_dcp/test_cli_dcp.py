"""The command line on a DCP directory: inspect, verify, cp to pyckpt's format and to a
Hugging Face folder (and the ones that only need the public API: ls)."""

import json
import os
import struct

import numpy as np

import pyckpt
from pyckpt.cli import main


def _run(capsys, *argv):
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_inspect(ckpt, capsys, expected):
    code, out, _ = _run(capsys, "inspect", ckpt, "--json")
    assert code == 0
    doc = json.loads(out)
    assert doc["format"] == "dcp" and doc["info"]["format"] == "torch.distributed.checkpoint"
    rows = {t["key"]: t for t in doc["tensors"]}
    assert set(rows) == set(expected["tensors"])
    assert rows["model.sharded"]["blocks"] == 2 and rows["model.cols"]["dtype"] == "bfloat16"
    assert {e["key"] for e in doc["bytes_entries"]} == set(expected["bytes"])
    assert {f["name"] for f in doc["files"]} == {"__0_0.distcp", "__1_0.distcp"}
    code, out, _ = _run(capsys, "inspect", ckpt)
    assert code == 0 and "(2 blocks)" in out and "torch.distributed.checkpoint" in out
    code, out, _ = _run(capsys, "inspect", ckpt, "plain.i64", "--json")
    assert code == 0 and json.loads(out)["head"] == [2 ** 40, -7, 0]


def test_verify(ckpt, ckpt_copy, capsys):
    code, out, _ = _run(capsys, "verify", ckpt)
    assert code == 0 and "OK" in out
    src = pyckpt.load_checkpoint(ckpt_copy).source
    st = src.tensors[src.index["plain.bf16"]].chunks[0].storage
    path = os.path.join(ckpt_copy, st.relative_path)
    with open(path, "rb") as f:
        item = f.read()[st.offset:st.offset + st.length]
    name = item.index(b"archive/data/0")  # in the storage's local header, after its sizes
    start = name + len("archive/data/0") + struct.unpack_from("<H", item, name - 2)[0]
    with open(path, "r+b") as f:  # a byte of the stored values
        f.seek(st.offset + start)
        b = f.read(1)
        f.seek(st.offset + start)
        f.write(bytes([b[0] ^ 1]))
    code, _, err = _run(capsys, "verify", ckpt_copy)
    assert code != 0 and "plain.bf16" in err and st.relative_path in err


def test_cp_to_hugging_face(ckpt, tmp_path, capsys, expected, same_value):
    dst = str(tmp_path / "hf")
    code, _, err = _run(capsys, "cp", ckpt, dst, "--format", "hf")
    assert code == 0, err
    assert "nested.step (bytes)" in err  # the bytes entries are named as left out
    out = pyckpt.load(dst)
    assert set(out) == set(expected["tensors"])
    for key, want in expected["tensors"].items():
        assert same_value(out[key], want), key


def test_cp_to_pyckpt(ckpt, tmp_path, capsys, expected, same_value):
    dst = str(tmp_path / "copy")
    code, _, err = _run(capsys, "cp", ckpt, dst)
    assert code == 0, err
    out = pyckpt.load(dst)
    assert pyckpt.load_checkpoint(dst).source.format == "pyckpt"
    for key, want in expected["tensors"].items():
        assert same_value(np.asarray(out[key]), want), key
    for key, raw in expected["bytes"].items():
        assert out[key] == raw


def test_ls(ckpt, capsys):
    code, out, err = _run(capsys, "ls", ckpt, "--json")
    assert code == 0, err
    rows = json.loads(out)
    assert rows[0]["tensors"] == 9 and rows[0]["status"] == "committed"
