"""DCP checkpoints written in the test by torch (one process, FileSystemWriter; or
laid out with torch's classes where only several processes or other writers make
that layout): every dtype DCP stores, empty and large tensors, stored views with
offsets and strides, chunks in two dimensions, and the layouts pyckpt refuses."""

import gzip
import io
import warnings

import numpy as np
import pytest

import pyckpt
from pyckpt.codecs.distcp import UnsupportedDCPError
from pyckpt.codecs.distcp import checkpoint as dcp_checkpoint
from pyckpt.sharded import ShardedArray

torch = pytest.importorskip("torch")
dcp = pytest.importorskip("torch.distributed.checkpoint")


def _save(state, path, **writer):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "no process group: saving in a single process"
        dcp.save(state, storage_writer=dcp.FileSystemWriter(path, **writer))
    return path


def _numpy(t):
    """torch's value as numpy (dtypes numpy lacks through their bits)."""
    import ml_dtypes
    names = {torch.bfloat16: (torch.int16, ml_dtypes.bfloat16),
             torch.float8_e4m3fn: (torch.uint8, ml_dtypes.float8_e4m3fn),
             torch.float8_e5m2: (torch.uint8, ml_dtypes.float8_e5m2)}
    t = t.contiguous()
    if t.dtype in names:
        bits, dtype = names[t.dtype]
        return t.view(bits).numpy().view(dtype)
    return t.numpy()


def test_every_dtype(tmp_path, same_value):
    g = torch.Generator().manual_seed(3)
    base = torch.randn(2, 3, generator=g)
    state = {str(dt).replace("torch.", ""): (base * 50).to(dt) for dt in (
        torch.float16, torch.bfloat16, torch.float32, torch.float64, torch.int8, torch.int16,
        torch.int32, torch.int64, torch.uint8, torch.uint16, torch.uint32, torch.uint64,
        torch.bool, torch.float8_e4m3fn, torch.float8_e5m2)}
    state["complex64"] = torch.complex(base, -base)
    state["complex128"] = state["complex64"].to(torch.complex128)
    state["empty"] = torch.zeros(0, 3)
    state["scalar_i"] = torch.tensor(-9)
    path = _save(state, str(tmp_path / "ck"))
    reader = pyckpt.load_checkpoint(path)
    assert reader.keys() == sorted(state)
    for key, t in state.items():
        assert same_value(reader.get_tensor(key), _numpy(t)), key
    reader.verify()


def test_large_tensor_reads_its_storage_apart(tmp_path, recording_store, monkeypatch):
    """An item larger than WHOLE: its head and tail first, then only the storage."""
    big = torch.arange(600 * 600, dtype=torch.float32).reshape(600, 600)
    path = _save({"big": big, "small": torch.ones(2)}, str(tmp_path / "ck"))
    store = recording_store()
    src = dcp_checkpoint.DCPCheckpoint(store, path)
    store.reads.clear()
    assert np.array_equal(src.read_new([src.index["big"]])[0], big.numpy())
    st = src.tensors[src.index["big"]].chunks[0].storage
    assert len(store.reads) == 3
    head, tail, data = store.reads
    assert head[1:] == (st.offset, st.offset + dcp_checkpoint.HEAD)
    assert tail[1:] == (st.offset + st.length - dcp_checkpoint.TAIL, st.offset + st.length)
    assert data[2] - data[1] == big.numel() * 4
    # and a batch split in the middle of many items still reads them all
    monkeypatch.setattr(dcp_checkpoint, "BATCH_BYTES", 1)
    assert pyckpt.load(path)["small"].tolist() == [1.0, 1.0]


def test_stored_views_with_offsets_and_strides(tmp_path, build_dcp, saved):
    """Items holding a view (torch.save keeps the whole storage, an offset and strides):
    FileSystemWriter clones such tensors, other writers may not."""
    whole = torch.arange(40, dtype=torch.int64).reshape(5, 8)
    views = {"rows": whole[1:3], "cols": whole[:, 2:5], "step": whole[::2, ::3],
             "t": whole.t(), "elem": whole[4, 7], "expanded": whole[:, :1].expand(5, 3)}
    d = build_dcp(str(tmp_path / "ck"), {k: (tuple(v.shape), [((0,) * v.dim(), v)])
                                         for k, v in views.items()})
    reader = pyckpt.load_checkpoint(d)
    for key, v in views.items():
        assert np.array_equal(reader.get_tensor(key), v.contiguous().numpy()), key


def test_two_dimensional_chunks_and_resharding(tmp_path, build_dcp):
    full = torch.arange(6 * 4, dtype=torch.float64).reshape(6, 4)
    boxes = [((0, 0), (3, 2)), ((0, 2), (3, 2)), ((3, 0), (3, 4))]
    chunks = [(off, full[off[0]:off[0] + s[0], off[1]:off[1] + s[1]].clone()) for off, s in boxes]
    d = build_dcp(str(tmp_path / "ck"), {"w": ((6, 4), chunks)})
    assert np.array_equal(pyckpt.load(d)["w"], full.numpy())
    for lo, shape in [((1, 1), (4, 2)), ((0, 3), (6, 1)), ((5, 0), (1, 4))]:
        block = ShardedArray(np.zeros(shape), (6, 4), lo)
        pyckpt.load(d, into={"w": block})
        assert np.array_equal(block.local, full[lo[0]:lo[0] + shape[0], lo[1]:lo[1] + shape[1]])


def test_nested_state_and_non_tensor_values(tmp_path):
    state = {"model": {"layer": {"w": torch.ones(2, 2)}}, "step": 7, "name": "run-1",
             "opt": {"param_groups": [{"lr": 0.1}]}, "blob": io.BytesIO(b"\x00\x01")}
    path = _save(state, str(tmp_path / "ck"))
    loaded = pyckpt.load(path)
    assert np.array_equal(loaded["model.layer.w"], np.ones((2, 2), np.float32))
    for key in ("step", "name", "opt.param_groups.0.lr", "blob"):
        raw = loaded[key]
        assert isinstance(raw, bytes) and raw[:4] == b"PK\x03\x04"  # torch.save'd, not decoded
    # the stored bytes are what DCP wrote: torch itself reads them back
    assert torch.load(io.BytesIO(loaded["step"]), weights_only=True) == 7


def _gzip_extension():
    from torch.distributed.checkpoint._extension import StreamTransformExtension

    class Gzip(StreamTransformExtension):
        @staticmethod
        def registry_name():
            return "test.gzip"

        @staticmethod
        def from_descriptor(version):
            return Gzip()

        def get_descriptor(self):
            return "test.gzip/1"

        def transform_to(self, output):
            return gzip.GzipFile(fileobj=output, mode="wb")

        def transform_from(self, input):
            return gzip.GzipFile(fileobj=input, mode="rb")

    return Gzip()


def test_stream_transforms_are_refused(tmp_path):
    path = _save({"w": torch.ones(3), "n": 5}, str(tmp_path / "ck"),
                 _extensions=[_gzip_extension()])
    reader = pyckpt.load_checkpoint(path)
    assert reader.keys() == ["w"]
    with pytest.raises(UnsupportedDCPError, match=r"stream transforms \['test.gzip/1'\]"):
        reader.get_tensor("w")
    with pytest.raises(UnsupportedDCPError, match="'n'"):
        pyckpt.load(path)


def test_safetensors_serialization_is_refused(tmp_path):
    pytest.importorskip("safetensors")
    from torch.distributed.checkpoint.filesystem import SerializationFormat
    path = _save({"w": torch.ones(3)}, str(tmp_path / "ck"),
                 serialization_format=SerializationFormat.SAFETENSORS)
    reader = pyckpt.load_checkpoint(path)
    with pytest.raises(UnsupportedDCPError, match="SerializationFormat.SAFETENSORS"):
        reader.get_tensor("w")


def test_a_replica_listed_twice_is_read_once(tmp_path, build_dcp):
    """Without DCP's deduplication every rank lists its copy of a replicated tensor:
    the same box twice, one storage record."""
    w = torch.arange(4.0)
    d = build_dcp(str(tmp_path / "ck"), {"w": ((4,), [((0,), w), ((0,), w)])})
    reader = pyckpt.load_checkpoint(d)
    assert reader.source.blocks(0) == 1
    assert np.array_equal(reader.get_tensor("w"), w.numpy())
