"""safetensors interop (issue 7): load() of .safetensors paths and conversions,
checked against safetensors' own reader and writer."""

import numpy as np
import pytest

import pyckpt
from pyckpt.interop import safetensors as st
from pyckpt.testing.requirements import require

safetensors_numpy = require("safetensors.numpy")
ml_dtypes = require("ml_dtypes")


@pytest.fixture
def tensors(rng):
    return {"model.embed.weight": rng.standard_normal((10, 4)).astype(np.float32),
            "model.norm.bias": np.arange(4, dtype=np.float16),
            "bf": rng.standard_normal(6).astype(ml_dtypes.bfloat16),
            "ids": np.arange(5, dtype=np.int64), "flag": np.array([True, False])}


def test_load_a_file_written_by_safetensors(tmp_path, tensors):
    path = str(tmp_path / "m.safetensors")
    safetensors_numpy.save_file(tensors, path, metadata={"format": "np", "source": "test"})
    out = pyckpt.load(path)
    assert set(out) == set(tensors)
    for k, v in tensors.items():
        assert out[k].dtype == v.dtype and out[k].tobytes() == v.tobytes()
    assert pyckpt.load(path, select=["model.*"], mmap=True)["model.norm.bias"].flags.writeable is False
    into = {"ids": np.zeros(5, np.int64)}
    pyckpt.load(path, into=into)
    np.testing.assert_array_equal(into["ids"], tensors["ids"])
    assert st.SafetensorsFile(*pyckpt.storage.resolve(path)).metadata == {"format": "np", "source": "test"}


def test_round_trip_through_a_checkpoint(tmp_path, tensors):
    src = str(tmp_path / "in.safetensors")
    safetensors_numpy.save_file(tensors, src, metadata={"note": "kept"})
    st.to_checkpoint(src, tmp_path / "ckpt")
    reader = pyckpt.load_checkpoint(tmp_path / "ckpt")
    assert reader.metadata == {"safetensors": {"note": "kept"}}
    assert reader.get_variable_to_dtype_map()["bf"] == ml_dtypes.bfloat16
    dst = str(tmp_path / "out.safetensors")
    st.from_checkpoint(tmp_path / "ckpt", dst)
    back = safetensors_numpy.load_file(dst)  # safetensors' own loader reads our file
    for k, v in tensors.items():
        assert back[k].dtype == v.dtype and back[k].tobytes() == v.tobytes()
    from safetensors import safe_open

    with safe_open(dst, "np") as f:
        assert f.metadata() == {"note": "kept"}


def test_unsupported_dtype_and_corrupt_header(tmp_path):
    pyckpt.save({"c": np.ones(2, np.complex128)}, tmp_path / "c")
    with pytest.raises(TypeError, match="complex128"):
        st.from_checkpoint(tmp_path / "c", str(tmp_path / "x.safetensors"))
    bad = tmp_path / "bad.safetensors"
    bad.write_bytes((10**9).to_bytes(8, "little") + b"{}")
    with pytest.raises(pyckpt.CorruptCheckpointError, match="header length"):
        pyckpt.load(str(bad))


@pytest.mark.parametrize("shape", [[2 ** 32, 2 ** 32, 0], [1] * 65])
def test_a_header_shape_beyond_the_limits_is_a_corrupt_file(tmp_path, shape):
    """A zero-size tensor whose other dimensions numpy cannot represent passed the
    header checks and failed in numpy ("array is too big"), naming nothing."""
    import json
    header = json.dumps({"t": {"dtype": "F32", "shape": shape, "data_offsets": [0, 0]}}).encode()
    bad = tmp_path / "big.safetensors"
    bad.write_bytes(len(header).to_bytes(8, "little") + header)
    with pytest.raises(pyckpt.CorruptCheckpointError, match="tensor 't'.*beyond the limits"):
        pyckpt.load(str(bad))
