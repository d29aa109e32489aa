"""pyckpt.save / pyckpt.load round trips (API.md sections 1 and 5)."""

import os

import numpy as np
import pytest

import pyckpt

ALL_DTYPES = ["bool", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64",
              "float16", "float32", "float64", "complex64", "complex128"]


def _random(rng, shape, dtype):
    dtype = np.dtype(dtype)
    if dtype.kind == "b":
        return rng.integers(0, 2, shape).astype(bool)
    if dtype.kind in "iu":
        info = np.iinfo(dtype)
        return rng.integers(info.min, info.max, shape, dtype=dtype, endpoint=True)
    if dtype.kind == "c":
        return (rng.standard_normal(shape) + 1j * rng.standard_normal(shape)).astype(dtype)
    return rng.standard_normal(shape).astype(dtype)


@pytest.mark.parametrize("dtype", ALL_DTYPES)
def test_every_builtin_dtype(ckpt_dir, rng, dtype):
    tree = {"x": _random(rng, (3, 5), dtype), "s": _random(rng, (), dtype)}
    pyckpt.save(tree, ckpt_dir)
    out = pyckpt.load(ckpt_dir)
    for k in tree:
        assert out[k].dtype == tree[k].dtype and out[k].shape == tree[k].shape
        np.testing.assert_array_equal(out[k], tree[k])


@pytest.mark.parametrize("shape", [(), (0,), (3, 0, 2), (1,), (7, 1, 3), (2, 3, 4, 5)])
def test_shapes(ckpt_dir, rng, shape):
    x = _random(rng, shape, "float32")
    pyckpt.save({"x": x}, ckpt_dir)
    out = pyckpt.load(ckpt_dir)["x"]
    assert out.shape == shape
    np.testing.assert_array_equal(out, x)


def test_non_contiguous_and_big_endian(ckpt_dir, rng):
    base = _random(rng, (40, 30), "float64")
    tree = {
        "transposed": base.T,
        "sliced": base[::3, 1::4],
        "reversed": base[::-1],
        "fortran": np.asfortranarray(base),
        "big_endian": base.astype(">f8"),
        "broadcast": np.broadcast_to(np.arange(5.0), (4, 5)),
    }
    pyckpt.save(tree, ckpt_dir)
    out = pyckpt.load(ckpt_dir)
    for k, v in tree.items():
        np.testing.assert_array_equal(out[k], v)
        assert out[k].flags.c_contiguous
    assert out["big_endian"].dtype == np.dtype("<f8")


def test_bytes_unicode_datetime_dtypes(ckpt_dir):
    tree = {"s": np.array([b"ab", b"xyz"]), "u": np.array(["héllo", "w"]),
            "t": np.array(["2024-01-01", "2025-06-30"], dtype="datetime64[D]"),
            "d": np.array([3, 5], dtype="timedelta64[ms]")}
    pyckpt.save(tree, ckpt_dir)
    out = pyckpt.load(ckpt_dir)
    for k, v in tree.items():
        assert out[k].dtype == v.dtype
        np.testing.assert_array_equal(out[k], v)


def test_ml_dtypes_round_trip(ckpt_dir, rng):
    ml_dtypes = pytest.importorskip("ml_dtypes")
    tree = {name: rng.standard_normal((4, 4)).astype(getattr(ml_dtypes, name))
            for name in ("bfloat16", "float8_e4m3fn", "float8_e5m2")}
    pyckpt.save(tree, ckpt_dir)
    out = pyckpt.load(ckpt_dir)
    for k, v in tree.items():
        assert out[k].dtype == v.dtype
        assert out[k].tobytes() == v.tobytes()
    assert pyckpt.load_checkpoint(ckpt_dir).get_variable_to_dtype_map()["bfloat16"] == ml_dtypes.bfloat16


def test_structure_is_rebuilt_exactly(ckpt_dir, rng):
    tree = {
        "layers": [{"w": rng.standard_normal((2, 2)), "b": np.zeros(2)}, {"w": np.ones((1,))}],
        "pair": (np.int32(4), 2.5),
        "step": 10,
        "flag": True,
        "c": 1 + 2j,
        "name": "run-a",
        "nothing": None,
        "blob": b"\x00\x01",
        "empty": {"l": [], "t": (), "d": {}},
        3: np.arange(3),
    }
    pyckpt.save(tree, ckpt_dir)
    out = pyckpt.load(ckpt_dir)
    assert out.keys() == tree.keys()
    assert isinstance(out["layers"], list) and isinstance(out["pair"], tuple)
    assert out["step"] == 10 and type(out["step"]) is int
    assert out["flag"] is True and out["c"] == 1 + 2j and type(out["pair"][1]) is float
    assert isinstance(out["pair"][0], np.int32) and out["pair"][0] == 4
    assert out["name"] == "run-a" and out["nothing"] is None and out["blob"] == b"\x00\x01"
    assert out["empty"] == {"l": [], "t": (), "d": {}}
    np.testing.assert_array_equal(out[3], np.arange(3))
    np.testing.assert_array_equal(out["layers"][0]["w"], tree["layers"][0]["w"])


def test_keys_are_slash_joined(ckpt_dir):
    pyckpt.save({"layers": [{"w": np.zeros(2)}], "flat/name": np.ones(1)}, ckpt_dir)
    assert [k for k, _ in pyckpt.list_variables(ckpt_dir)] == ["flat/name", "layers/0/w"]
    out = pyckpt.load(ckpt_dir)
    assert "flat/name" in out  # the saved structure: one dict key with a slash


def test_variables_are_saved_as_arrays(ckpt_dir):
    v = pyckpt.Variable(np.arange(4.0), name="v")
    pyckpt.save({"v": v}, ckpt_dir)
    np.testing.assert_array_equal(pyckpt.load(ckpt_dir)["v"], np.arange(4.0))
    target = {"v": pyckpt.Variable(np.zeros(4))}
    pyckpt.load(ckpt_dir, into=target)
    np.testing.assert_array_equal(target["v"].numpy(), np.arange(4.0))


def test_large_tensor_many_chunks_and_small_tensors(ckpt_dir, rng):
    tree = {"big": rng.integers(0, 255, 5_000_003, dtype=np.uint8),
            **{f"small/{i}": rng.standard_normal(i % 7) for i in range(500)}}
    pyckpt.save(tree, ckpt_dir)
    out = pyckpt.load(ckpt_dir)
    for k, v in tree.items():
        np.testing.assert_array_equal(out[k], v)


def test_matches_the_pure_python_reference_reader(ckpt_dir, rng):
    from pyckpt import _reference_reader

    tree = {"a": rng.standard_normal((300, 301)).astype(np.float32), "b": np.arange(10),
            "c": rng.standard_normal((5, 5)).T}
    pyckpt.save(tree, ckpt_dir)
    ref = _reference_reader.read_all(ckpt_dir)
    for k, v in tree.items():
        np.testing.assert_array_equal(ref[k], v)


def test_overwrite_replaces_atomically_and_removes_old_files(ckpt_dir):
    pyckpt.save({"x": np.zeros(1000)}, ckpt_dir)
    old = set(os.listdir(ckpt_dir))
    pyckpt.save({"y": np.ones(10)}, ckpt_dir)
    new = set(os.listdir(ckpt_dir))
    assert not (old - {"pyckpt.index"}) & new
    assert list(pyckpt.load(ckpt_dir)) == ["y"]


def test_pathlike_and_file_url(tmp_path):
    p = tmp_path / "c"
    assert pyckpt.save({"x": np.ones(2)}, p) == str(p)
    np.testing.assert_array_equal(pyckpt.load(f"file://{p}")["x"], np.ones(2))


def test_metadata(ckpt_dir):
    pyckpt.save({"x": np.ones(1)}, ckpt_dir, metadata={"step": 3, "cfg": {"lr": 0.1}})
    assert pyckpt.load_checkpoint(ckpt_dir).metadata == {"step": 3, "cfg": {"lr": 0.1}}
    with pytest.raises(ValueError, match="JSON"):
        pyckpt.save({"x": np.ones(1)}, ckpt_dir + "2", metadata={"bad": object()})


def test_metadata_keys_json_stores_under_one_name_are_refused(ckpt_dir):
    """1 and "1" are both the JSON name "1": one of the two values was lost."""
    with pytest.raises(ValueError, match=r"metadata\['cfg'\]\[0\]: keys 1 and '1'"):
        pyckpt.save({"x": np.ones(1)}, ckpt_dir, metadata={"cfg": [{1: "a", "1": "b"}]})
    pyckpt.save({"x": np.ones(1)}, ckpt_dir, metadata={1: "a", "b": {True: 1}})
    assert pyckpt.load_checkpoint(ckpt_dir).metadata == {"1": "a", "b": {"true": 1}}


def test_dtype_mismatches_name_text_dtypes_as_users_write_them(ckpt_dir):
    pyckpt.save({"a": np.array(["ab" * 11]), "t": np.array(["2024-01-01"], "M8[D]")}, ckpt_dir)
    with pytest.raises(ValueError, match=r"dtype U22, target has shape \(1,\) dtype U1") as e:
        pyckpt.load(ckpt_dir, into={"a": np.array(["x"]), "t": np.zeros(1, "M8[s]")})
    assert "dtype M8[D], target has shape (1,) dtype M8[s]" in str(e.value)
    assert "str" not in str(e.value)
