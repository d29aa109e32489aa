"""Issue 22, smaller frictions: a flat load of an object-graph checkpoint says what to
call instead; `select` picks a key with glob characters by its exact name; `inspect`
escapes control characters in keys; `latest_checkpoint` passes over a checkpoint
whose index is garbage, with a warning."""

import os
import subprocess
import sys

import numpy as np
import pytest

import pyckpt


def test_flat_load_of_an_object_graph_checkpoint_says_what_to_call(tmp_path):
    pyckpt.Checkpoint(net={"w": np.ones(2)}).write(tmp_path / "c")
    with pytest.raises(pyckpt.CheckpointError, match=r"object-graph checkpoint.*"
                       r"'net/w/\.ATTRIBUTES/VARIABLE_VALUE'.*Checkpoint\(\*\*objects\)\.restore"):
        pyckpt.load(tmp_path / "c", into={"net": {"w": np.zeros(2)}})
    into = {"net": {"w": np.zeros(2)}}  # the key_map the message offers works
    pyckpt.load(tmp_path / "c", into=into,
                key_map=lambda k: k.removesuffix("/.ATTRIBUTES/VARIABLE_VALUE"))
    assert into["net"]["w"].tolist() == [1.0, 1.0]


def test_flat_missing_key_messages_stay_plain_for_flat_checkpoints(tmp_path):
    pyckpt.save({"a": np.ones(2)}, tmp_path / "f")
    with pytest.raises(KeyError) as e:
        pyckpt.load(tmp_path / "f", into={"b": np.zeros(2)})
    assert "object-graph" not in str(e.value)


def test_select_an_exact_key_with_glob_characters(tmp_path):
    pyckpt.save({"a*b": np.ones(1), "a1b": np.zeros(1), "x": {"[y]": np.ones(2), "y": 1}},
                tmp_path / "f")
    assert list(pyckpt.load(tmp_path / "f", select=["a*b"])) == ["a*b"]
    assert pyckpt.load(tmp_path / "f", select="x/[y]") == {"x": {"[y]": pytest.approx([1, 1])}}
    assert sorted(pyckpt.load(tmp_path / "f", select="a?b")) == ["a*b", "a1b"]  # a pattern


def test_inspect_escapes_control_characters_in_keys(tmp_path):
    pyckpt.save({"a\nb": np.ones(2), "tab\there": np.zeros(1), "plain\\x": np.ones(1)},
                tmp_path / "c")
    r = subprocess.run([sys.executable, "-m", "pyckpt", "inspect", str(tmp_path / "c")],
                       capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    rows = r.stdout.splitlines()
    assert any(row.startswith("a\\nb ") for row in rows), r.stdout
    assert any(row.startswith("tab\\there ") for row in rows), r.stdout
    assert any(row.startswith("plain\\x ") for row in rows), r.stdout  # printable: as is
    assert not any(row == "b" or row.startswith("b ") for row in rows)


def test_latest_checkpoint_passes_over_a_garbage_index(tmp_path):
    run = tmp_path / "run"
    pyckpt.save({"a": np.ones(2)}, run / "ckpt-1")
    pyckpt.save({"a": np.zeros(2)}, run / "ckpt-2")
    (run / "ckpt-2" / "pyckpt.index").write_bytes(b"garbage, not an index")
    with pytest.warns(UserWarning, match=r"ckpt-2 is not used as the latest checkpoint"):
        assert pyckpt.latest_checkpoint(run) == os.path.join(str(run), "ckpt-1")
    with pytest.warns(UserWarning, match="ckpt-2"):
        assert pyckpt.load(run)["a"].tolist() == [1.0, 1.0]
    with pytest.raises(pyckpt.CorruptCheckpointError):  # named directly: refused
        pyckpt.load(run / "ckpt-2")
    (run / "ckpt-1" / "pyckpt.index").write_bytes(b"")
    with pytest.warns(UserWarning):
        assert pyckpt.latest_checkpoint(run) is None


def test_inspect_claims_no_writer_for_tensorflow_checkpoints(tmp_path):
    """TensorFlow's format does not record its writer: `inspect` said "written by
    tensorflow" for a checkpoint pyckpt wrote."""
    from pyckpt.interop import tensorflow as tfio

    tfio.save({"w": np.ones(3)}, str(tmp_path / "tf" / "ckpt-1"))
    fixture = os.path.join(os.path.dirname(__file__), "interop_tf", "fixtures", "training",
                           "ckpt-5")
    for path in (str(tmp_path / "tf" / "ckpt-1"), fixture):
        r = subprocess.run([sys.executable, "-m", "pyckpt", "inspect", path],
                           capture_output=True, text=True, timeout=120, cwd=tmp_path)
        assert r.returncode == 0, r.stderr
        assert "written by" not in r.stdout
        assert "format      TensorBundle" in r.stdout, r.stdout
