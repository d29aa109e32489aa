"""The command line on TensorFlow checkpoints: ls, inspect, verify, and cp in both
directions (the format of DST: --format tf, or a DST ending in .index)."""

import json
import os
import warnings

import numpy as np
import pytest

import pyckpt
from pyckpt.cli import main


def cli(capsys, *args):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        code = main(list(args))
    out, err = capsys.readouterr()
    return code, out, err


def test_ls_inspect_verify(fixtures, capsys):
    d = os.path.join(fixtures, "training")
    code, out, _ = cli(capsys, "ls", d)
    assert code == 0 and [ln.split()[0] for ln in out.splitlines()[1:]] == ["ckpt-3", "ckpt-4", "ckpt-5"]
    code, out, _ = cli(capsys, "ls", os.path.join(fixtures, "tf1", "run_2", "model.ckpt-7"))
    assert code == 0 and "model.ckpt-7" in out and "committed" in out
    code, out, _ = cli(capsys, "inspect", d, "--json")
    doc = json.loads(out)
    assert code == 0 and doc["format"] == "tensorflow" and doc["path"].endswith("ckpt-5")
    dtypes = {t["key"]: t["dtype"] for t in doc["tensors"]}
    assert dtypes["iterator/.ATTRIBUTES/ITERATOR_STATE"] == "variant"
    assert dtypes["_CHECKPOINTABLE_OBJECT_GRAPH"] == "string"
    assert dtypes["step/.ATTRIBUTES/VARIABLE_VALUE"] == "int32"
    assert doc["object_graph"]["root_edges"] == ["iterator", "net", "optimizer", "step",
                                                 "save_counter"]
    code, out, _ = cli(capsys, "inspect", os.path.join(fixtures, "raw", "dtypes"), "bf16")
    assert code == 0 and "bfloat16" in out
    code, out, _ = cli(capsys, "verify", os.path.join(fixtures, "mixed", "sharded"))
    assert code == 0 and out.startswith("OK:")


def test_verify_fails_on_damage(fixture_copy, capsys):
    d = fixture_copy("mixed")
    with open(os.path.join(d, "ckpt-1.data-00000-of-00001"), "r+b") as f:
        f.seek(5000)
        b = f.read(1)
        f.seek(5000)
        f.write(bytes([b[0] ^ 4]))
    code, _, err = cli(capsys, "verify", os.path.join(d, "ckpt-1"))
    assert code == 1 and "checksum mismatch" in err and "ckpt-1.data-00000-of-00001" in err


def test_cp_both_directions(fixtures, tmp_path, capsys, tf_expected, same):
    src = os.path.join(fixtures, "mixed", "ckpt-1")
    py = str(tmp_path / "py")
    code, out, _ = cli(capsys, "cp", src, py)
    assert code == 0 and "converted" in out
    r = pyckpt.load_checkpoint(py)
    assert r.source.format == "pyckpt"
    want = tf_expected("mixed")["ckpt-1"]
    for key, value in want.items():
        got = r.get_tensor(key)
        if value.dtype == object:
            assert got.dtype.kind == "S" and [bytes(x) for x in got] == [bytes(x) for x in value]
        else:
            assert same(got, value), key
    assert r.object_graph is not None  # TensorFlow's graph, as pyckpt's
    # pyckpt -> TensorFlow: --format tf, or a DST ending in .index
    tf = str(tmp_path / "tf" / "ckpt-1")
    code, out, _ = cli(capsys, "cp", py, tf, "--format", "tf")
    assert code == 0 and os.path.exists(tf + ".index")
    assert pyckpt.latest_checkpoint(str(tmp_path / "tf")) == tf
    code, _, err = cli(capsys, "cp", py, tf + ".index")
    assert code == 1 and "--force" in err
    code, _, _ = cli(capsys, "cp", py, tf + ".index", "--force")
    assert code == 0
    back = pyckpt.load_checkpoint(tf)
    for key, value in want.items():
        assert same(back.get_tensor(key), value), key
    # and the round trip restores TensorFlow's objects as the original did
    m = {"big": pyckpt.Variable(np.zeros((256, 1024), np.float32))}
    status = pyckpt.Checkpoint(model=m).read(tf)
    assert same(m["big"].numpy(), want["model/big/.ATTRIBUTES/VARIABLE_VALUE"])
    assert "model/f16/.ATTRIBUTES/VARIABLE_VALUE" in status.unmatched_checkpoint_keys()


def test_cp_refuses_what_it_cannot_write(fixtures, tmp_path, capsys):
    code, _, err = cli(capsys, "cp", os.path.join(fixtures, "training"),
                       str(tmp_path / "x.safetensors"))
    assert code == 1 and "safetensors cannot hold" in err
    code, _, err = cli(capsys, "cp", os.path.join(fixtures, "raw", "sliced"), str(tmp_path / "s"))
    assert code == 0  # the sliced tensor is left out with a warning, the rest converted
    assert pyckpt.list_variables(str(tmp_path / "s")) == [("plain", ())]
