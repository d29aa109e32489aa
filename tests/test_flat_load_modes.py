"""load(into=), select, key_map and mmap (API.md section 5)."""

import numpy as np
import pytest

import pyckpt


@pytest.fixture
def saved(ckpt_dir, rng):
    tree = {"enc": {"w": rng.standard_normal((4, 3)).astype(np.float32), "b": np.zeros(3)},
            "dec": {"w": rng.standard_normal((3, 4)).astype(np.float32)},
            "step": 7}
    pyckpt.save(tree, ckpt_dir)
    return ckpt_dir, tree


def test_into_fills_in_place_and_returns_into(saved):
    path, tree = saved
    w = np.empty((4, 3), np.float32)
    into = {"enc": {"w": w}, "step": 0}
    assert pyckpt.load(path, into=into) is into
    assert into["enc"]["w"] is w
    np.testing.assert_array_equal(w, tree["enc"]["w"])
    assert into["step"] == 7 and type(into["step"]) is int


def test_into_non_contiguous_target(saved):
    path, tree = saved
    buf = np.zeros((3, 4), np.float32)
    into = {"enc": {"w": buf.T}}
    pyckpt.load(path, into=into)
    np.testing.assert_array_equal(buf.T, tree["enc"]["w"])


def test_into_missing_keys_listed_before_anything_is_filled(saved):
    path, _ = saved
    w = np.full((4, 3), -1, np.float32)
    into = {"enc": {"w": w}, "nope": np.zeros(1), "also/missing": np.zeros(2)}
    with pytest.raises(KeyError) as ei:
        pyckpt.load(path, into=into)
    assert "nope" in str(ei.value) and "also/missing" in str(ei.value)
    assert isinstance(ei.value, pyckpt.CheckpointError)
    assert (w == -1).all()


def test_into_shape_and_dtype_mismatch(saved):
    path, _ = saved
    with pytest.raises(ValueError, match=r"enc/w.*\(4, 3\).*\(3, 4\)"):
        pyckpt.load(path, into={"enc": {"w": np.zeros((3, 4), np.float32)}})
    with pytest.raises(ValueError, match=r"enc/w.*float32.*float64"):
        pyckpt.load(path, into={"enc": {"w": np.zeros((4, 3), np.float64)}})


def test_into_read_only_target(saved):
    path, _ = saved
    w = np.zeros((4, 3), np.float32)
    w.flags.writeable = False
    with pytest.raises(ValueError, match="read-only"):
        pyckpt.load(path, into={"enc": {"w": w}})


def test_select_exact_glob_and_subtree(saved):
    path, tree = saved
    assert set(pyckpt.load(path, select="enc")["enc"]) == {"w", "b"}
    out = pyckpt.load(path, select=["*/w"])
    assert set(out) == {"enc", "dec"} and set(out["enc"]) == {"w"}
    assert pyckpt.load(path, select=["step"]) == {"step": 7}
    with pytest.raises(KeyError, match="nothing"):
        pyckpt.load(path, select=["nothing"])


def test_key_map_callable_dict_and_drop(saved):
    path, tree = saved
    out = pyckpt.load(path, key_map=lambda k: f"model_001/{k}")
    np.testing.assert_array_equal(out["model_001"]["enc"]["w"], tree["enc"]["w"])
    out = pyckpt.load(path, key_map={"enc/w": "encoder/kernel"}, select=["enc/w"])
    assert list(out) == ["encoder"]
    out = pyckpt.load(path, key_map=lambda k: None if k.startswith("dec") else k)
    assert "dec" not in out
    with pytest.raises(ValueError, match="maps both"):
        pyckpt.load(path, key_map=lambda k: "same")


def test_ensemble_side_by_side_with_key_map(tmp_path, rng):
    members = []
    for i in range(3):
        tree = {"w": rng.standard_normal((2, 2)), "b": rng.standard_normal(2)}
        pyckpt.save(tree, tmp_path / f"m{i}")
        members.append(tree)
    into = {f"model_{i:03d}": {"w": np.zeros((2, 2)), "b": np.zeros(2)} for i in range(3)}
    # Each load fills only its own member: into restricted to that member's subtree.
    for i in range(3):
        pyckpt.load(tmp_path / f"m{i}", into={f"model_{i:03d}": into[f"model_{i:03d}"]},
                    key_map=lambda k, i=i: f"model_{i:03d}/{k}")
    for i in range(3):
        np.testing.assert_array_equal(into[f"model_{i:03d}"]["w"], members[i]["w"])
        np.testing.assert_array_equal(into[f"model_{i:03d}"]["b"], members[i]["b"])


def test_mmap_is_read_only_and_file_backed(saved):
    path, tree = saved
    out = pyckpt.load(path, mmap=True)
    w = out["enc"]["w"]
    np.testing.assert_array_equal(w, tree["enc"]["w"])
    assert not w.flags.writeable and not w.flags.owndata
    import mmap

    base = w
    while isinstance(base, np.ndarray) and base.base is not None:
        base = base.base
    assert isinstance(getattr(base, "obj", base), mmap.mmap)


def test_mmap_detects_corruption(saved, flip, shard_files):
    path, _ = saved
    flip(shard_files(path)[0], 0)
    with pytest.raises(pyckpt.CorruptCheckpointError):
        pyckpt.load(path, mmap=True)
