"""Hostile and damaged DCP checkpoints: pickles that would run code run nothing and
name the refused global; records outside the allow-list, impossible sizes and
ranges, tampered bytes, truncated and missing files raise CorruptCheckpointError
naming the key, file and byte range; layouts pyckpt does not read raise
UnsupportedDCPError. Nothing else escapes."""

import os
import pickle
import struct
import zlib

import numpy as np
import pytest

import pyckpt
from pyckpt.codecs.distcp import DCPCheckpoint, UnsupportedDCPError
from pyckpt.codecs.distcp.allowed import METADATA_GLOBALS
from pyckpt.codecs.distcp.unpickler import restricted_load
from pyckpt.errors import CheckpointError, CorruptCheckpointError
from pyckpt.storage.local import LocalStore


def _write_metadata(d, data: bytes) -> str:
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, ".metadata"), "wb") as f:
        f.write(data)
    return str(d)


def _exec_payload(code: str) -> bytes:
    """A protocol-2 pickle that runs builtins.exec(code) when unpickled."""
    c = code.encode()
    return b"\x80\x02cbuiltins\nexec\nq\x00X" + struct.pack("<I", len(c)) + c + b"q\x01\x85q\x02R."


def test_exec_payload_is_live_but_runs_nothing_here(tmp_path):
    marker = tmp_path / "ran"
    payload = _exec_payload(f"open({str(marker)!r}, 'w').close()")
    pickle.loads(payload)  # the payload works: Python's own unpickler runs it
    assert marker.exists()
    marker.unlink()
    d = _write_metadata(tmp_path / "ck", payload)
    with pytest.raises(CorruptCheckpointError, match=r"refused global builtins\.exec"):
        pyckpt.load_checkpoint(d)
    assert not marker.exists()


def test_os_system_reduce_is_refused(tmp_path):
    marker = tmp_path / "system-ran"
    cmd = f"touch {marker}".encode()
    payload = (b"\x80\x02cos\nsystem\nq\x00X" + struct.pack("<I", len(cmd)) + cmd
               + b"q\x01\x85q\x02R.")
    d = _write_metadata(tmp_path / "ck", payload)
    with pytest.raises(CorruptCheckpointError, match=r"refused global os\.system") as e:
        pyckpt.load(d)
    assert ".metadata" in str(e.value)
    assert not marker.exists()


class _Evil:
    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def test_metadata_holding_a_reduce_deep_inside(tmp_path, build_dcp):
    """A real DCP metadata whose planner_data holds an object that would run a command:
    refused by name (posix.system: os.system's own module) when the file is opened."""
    import torch
    d = build_dcp(str(tmp_path / "ck"), {"w": ((2,), [((0,), torch.ones(2))])})
    with open(os.path.join(d, ".metadata"), "rb") as f:
        md = pickle.load(f)
    marker = tmp_path / "ran"
    md.planner_data = {"w": _Evil(marker)}
    _write_metadata(d, pickle.dumps(md))
    with pytest.raises(CorruptCheckpointError, match=r"refused global (posix|os)\.system"):
        pyckpt.load_checkpoint(d)
    assert not marker.exists()


def test_class_outside_the_allow_list(tmp_path, build_dcp):
    import datetime
    import torch
    d = build_dcp(str(tmp_path / "ck"), {"w": ((2,), [((0,), torch.ones(2))])})
    with open(os.path.join(d, ".metadata"), "rb") as f:
        md = pickle.load(f)
    md.planner_data = {"w": datetime.date(2020, 1, 1)}
    _write_metadata(d, pickle.dumps(md))
    with pytest.raises(CorruptCheckpointError, match=r"refused global datetime\.date"):
        pyckpt.list_variables(d)


def test_archive_pickle_that_would_run_code(tmp_path, build_dcp, saved):
    """A .distcp item whose data.pkl calls builtins.eval (CRCs made to match)."""
    import torch
    archive = bytearray(saved(torch.arange(3.0)))
    evil = _exec_payload("raise SystemExit('ran')")
    good = _member(bytes(archive), "archive/data.pkl")
    archive = _replace_member(bytes(archive), "archive/data.pkl", evil.ljust(good[2], b"."))
    d = build_dcp(str(tmp_path / "ck"), {"w": ((3,), [((0,), torch.arange(3.0))])},
                  raw={("w", 0): archive})
    reader = pyckpt.load_checkpoint(d)
    with pytest.raises(CorruptCheckpointError, match=r"refused global builtins\.exec") as e:
        reader.get_tensor("w")
    assert "'w'" in str(e.value) and "__0_0.distcp" in str(e.value)


def _member(archive: bytes, name: str) -> tuple[int, int, int]:
    """(central entry offset, data offset, size) of a zip member."""
    pos = archive.index(b"PK\x01\x02")
    while True:
        nlen, elen, clen = struct.unpack_from("<HHH", archive, pos + 28)
        if archive[pos + 46:pos + 46 + nlen].decode() == name:
            size, = struct.unpack_from("<I", archive, pos + 24)
            header, = struct.unpack_from("<I", archive, pos + 42)
            hn, he = struct.unpack_from("<HH", archive, header + 26)
            return pos, header + 30 + hn + he, size
        pos += 46 + nlen + elen + clen
        assert pos < len(archive)


def _replace_member(archive: bytes, name: str, data: bytes) -> bytes:
    """The archive with member ``name``'s bytes replaced (same length), CRC fixed."""
    central, start, size = _member(archive, name)
    assert len(data) == size
    out = bytearray(archive)
    out[start:start + size] = data
    struct.pack_into("<I", out, central + 16, zlib.crc32(data))
    return bytes(out)


def _chunk_range(d, key, n=0):
    src = pyckpt.load_checkpoint(d).source
    st = src.tensors[src.index[key]].chunks[n].storage
    return os.path.join(d, st.relative_path), st.offset, st.length


def test_tampered_storage_byte(ckpt_copy):
    path, off, n = _chunk_range(ckpt_copy, "model.sharded", 1)
    with open(path, "rb") as f:
        item = f.read()[off:off + n]
    _, start, size = _member(item, "archive/data/0")
    with open(path, "r+b") as f:
        f.seek(off + start + 5)
        b = f.read(1)
        f.seek(off + start + 5)
        f.write(bytes([b[0] ^ 0x10]))
    reader = pyckpt.load_checkpoint(ckpt_copy)
    with pytest.raises(CorruptCheckpointError) as e:
        reader.get_tensor("model.sharded")
    msg = str(e.value)
    assert "checksum mismatch" in msg and "'model.sharded'" in msg
    assert os.path.basename(path) in msg and f"[{off + start}, {off + start + size})" in msg
    reader.get_tensor("plain.i64")  # the rest still reads
    with pytest.raises(CorruptCheckpointError, match="model.sharded"):
        reader.verify()


@pytest.mark.parametrize("where", ["start", "pickle", "directory", "end"])
def test_damaged_archive_bytes(ckpt_copy, where):
    path, off, n = _chunk_range(ckpt_copy, "plain.i64")
    with open(path, "rb") as f:
        item = f.read()[off:off + n]
    pos = {"start": 0, "pickle": _member(item, "archive/data.pkl")[1] + 3,
           "directory": item.index(b"PK\x01\x02") + 20, "end": n - 10}[where]
    with open(path, "r+b") as f:
        f.seek(off + pos)
        f.write(bytes([item[pos] ^ 0xFF]))
    with pytest.raises(CorruptCheckpointError, match="'plain.i64'"):
        pyckpt.load_checkpoint(ckpt_copy).get_tensor("plain.i64")


def test_tampered_bytes_entry_fails_verify(ckpt_copy):
    src = pyckpt.load_checkpoint(ckpt_copy).source
    st = src.bytes_entries["nested.step"].storage
    path = os.path.join(ckpt_copy, st.relative_path)
    with open(path, "rb") as f:
        item = f.read()[st.offset:st.offset + st.length]
    _, start, _ = _member(item, "archive/data.pkl")
    with open(path, "r+b") as f:
        f.seek(st.offset + start + 2)
        f.write(b"\x07")
    with pytest.raises(CorruptCheckpointError, match="bytes entry 'nested.step'"):
        pyckpt.load_checkpoint(ckpt_copy).verify()


def test_truncated_and_missing_data_files(ckpt_copy):
    path, off, n = _chunk_range(ckpt_copy, "model.sharded", 1)
    with open(path, "r+b") as f:
        f.truncate(off + n - 1)
    reader = pyckpt.load_checkpoint(ckpt_copy)
    with pytest.raises(CorruptCheckpointError, match=r"outside the file.*truncated") as e:
        reader.get_tensor("model.sharded")
    assert os.path.basename(path) in str(e.value) and f"[{off}, {off + n})" in str(e.value)
    os.remove(path)
    with pytest.raises(CorruptCheckpointError, match=f"{os.path.basename(path)}.*missing"):
        pyckpt.load_checkpoint(ckpt_copy).get_tensor("model.sharded")


def test_truncated_metadata(ckpt_copy):
    with open(os.path.join(ckpt_copy, ".metadata"), "rb") as f:
        data = f.read()
    for cut in (0, 1, 2, 100, len(data) // 2, len(data) - 1):
        _write_metadata(ckpt_copy, data[:cut])
        with pytest.raises(CorruptCheckpointError, match=r"\.metadata"):
            pyckpt.load_checkpoint(ckpt_copy)


def _rewrite(d, change):
    """The checkpoint's metadata loaded with torch, changed, and written back."""
    with open(os.path.join(d, ".metadata"), "rb") as f:
        md = pickle.load(f)  # our own test file
    change(md)
    _write_metadata(d, pickle.dumps(md))


def _chunk_md(md, key, n=0):
    return md.state_dict_metadata[key].chunks[n]


def _storage_md(md, key, n=0):
    from torch.distributed.checkpoint.metadata import MetadataIndex
    return md.storage_data[MetadataIndex(key, _chunk_md(md, key, n).offsets)]


def _set_size(md, key, size):
    import torch
    md.state_dict_metadata[key].size = torch.Size(size)


def _set_sizes(md, key, *sizes):
    import torch
    for n, size in enumerate(sizes):
        _chunk_md(md, key, n).sizes = torch.Size(size)


@pytest.mark.parametrize("change, match", [
    (lambda md: _set_size(md, "model.sharded", [4, 3]), r"not inside the tensor's shape"),
    (lambda md: _set_size(md, "model.sharded", [6, 3]), r"do not tile it \(blocks cover 15 of 18"),
    (lambda md: _set_sizes(md, "model.sharded", [4, 3], [1, 3]), r"overlap"),
    (lambda md: md.state_dict_metadata["model.sharded"].chunks.pop(), r"do not tile"),
    (lambda md: (_set_size(md, "model.sharded", [2 ** 40, 3]),
                 _set_sizes(md, "model.sharded", [3, 3], [2 ** 40 - 3, 3])),
     r"chunk 1: \[1099511627773, 3\] float32 values cannot fit in its item, __1_0.distcp bytes"),
    (lambda md: setattr(_storage_md(md, "plain.i64"), "relative_path", "../../etc/passwd"),
     r"not a plain file name"),
    (lambda md: setattr(_storage_md(md, "plain.i64"), "offset", -5), r"offset is -5"),
    (lambda md: setattr(md, "storage_data", None), r"storage_data is None"),
    (lambda md: md.storage_data.clear(), r"has no storage record"),
], ids=["chunk-outside", "gap", "overlap", "missing-chunk", "too-large", "path", "negative",
        "no-storage", "no-records"])
def test_impossible_metadata(ckpt_copy, change, match):
    pytest.importorskip("torch")
    _rewrite(ckpt_copy, change)
    with pytest.raises(CorruptCheckpointError, match=match) as e:
        pyckpt.load_checkpoint(ckpt_copy)
    assert ".metadata" in str(e.value)


@pytest.mark.parametrize("field, value, match", [
    # reaching into the next item of its file: refused when opened (two items sharing bytes)
    ("length", 10 ** 6, r"tensor 'plain.i64' chunk at \[0\] and .* share bytes of file"),
    ("offset", 10 ** 9, r"outside the file"),
    ("length", 100, r"no zip end record|not a torch.save archive|directory"),
])
def test_wrong_ranges(ckpt_copy, field, value, match):
    pytest.importorskip("torch")
    _rewrite(ckpt_copy, lambda md: setattr(_storage_md(md, "plain.i64"), field, value))
    with pytest.raises(CorruptCheckpointError, match=match) as e:
        pyckpt.load_checkpoint(ckpt_copy).get_tensor("plain.i64")
    assert "'plain.i64'" in str(e.value) and "__" in str(e.value)


def test_chunk_shape_differs_from_archive(tmp_path, build_dcp, saved):
    import torch
    d = build_dcp(str(tmp_path / "ck"), {"w": ((4,), [((0,), torch.ones(2)), ((2,), torch.ones(2))])},
                  raw={("w", 1): saved(torch.ones(3))})
    reader = pyckpt.load_checkpoint(d)
    with pytest.raises(CorruptCheckpointError, match=r"shape \[3\]; the metadata gives chunk 1 "
                       r"at \[2\] the shape \[2\]") as e:
        reader.get_tensor("w")
    assert "'w'" in str(e.value) and "__0_0.distcp" in str(e.value)


def test_dtype_differs_from_archive(tmp_path, build_dcp):
    import torch
    d = build_dcp(str(tmp_path / "ck"), {"w": ((2,), [((0,), torch.ones(2))])})
    _rewrite(d, lambda md: setattr(md.state_dict_metadata["w"].properties, "dtype", torch.int32))
    with pytest.raises(CorruptCheckpointError, match=r"holds a float32 tensor, the metadata says int32"):
        pyckpt.load_checkpoint(d).get_tensor("w")


def test_restricted_loader_refuses_what_it_does_not_know():
    for payload, match in [
        (b"\x80\x02cos\nsystem\n.", r"refused global os\.system"),
        (b"\x80\x02}q\xff\xff\xff\xff.", r"unsupported pickle opcode"),  # not LONG_BINPUT
        (b"\x80\x02Nr\xff\xff\xff\x7f.", None),  # a huge memo index: a dict entry, no alloc
        (b"\x80\x02c__builtin__\nset\n)R.", r"refused global __builtin__\.set"),
        (b"\x80\x02]i__main__\nX\n.", r"unsupported pickle opcode 0x69"),  # INST
        (b"\x80\x02\x82\x01.", r"unsupported pickle opcode 0x82"),  # EXT1
        (b"\x80\x02(]]d.", r"unsupported dict key"),
        (b"\x80\x02\x8b\x00\x00\x01\x00" + b"\x01" * 65536 + b".", r"integer of 65536 bytes"),
        (b"\x80\x02X\xff\xff\xff\x7fab.", r"truncated"),
        (b"\x80\x02ctorch\nSize\nK\x01\x85R.", r"torch\.Size"),
        (b"\x80\x02ctorch\nfloat32\n)R.", r"REDUCE of torch\.float32"),
        (b"\x80\x02N", r"no STOP"),
        (b"\x80\x02N.junk", r"bytes after the pickle"),
        (b"\x80\x02.", r"stack underflow"),
    ]:
        if match is None:
            assert restricted_load(payload, METADATA_GLOBALS, where="t") is None
            continue
        with pytest.raises(CorruptCheckpointError, match=match):
            restricted_load(payload, METADATA_GLOBALS, where="t")


def test_zip64_end_records_are_followed(ckpt_copy, expected):
    """torch writes ZIP64 end records beside the classic one; an archive whose classic
    record defers to them (as large ones do) reads the same."""
    path, off, n = _chunk_range(ckpt_copy, "plain.i64")
    with open(path, "r+b") as f:
        f.seek(off + n - 22 + 8)
        f.write(struct.pack("<HHII", 0xFFFF, 0xFFFF, 0xFFFFFFFF, 0xFFFFFFFF))
    got = pyckpt.load_checkpoint(ckpt_copy).get_tensor("plain.i64")
    assert np.array_equal(got, expected["tensors"]["plain.i64"])


@pytest.mark.filterwarnings("ignore:ComplexHalf support is experimental")
def test_unsupported_layouts_say_so(tmp_path, build_dcp):
    import torch
    d = build_dcp(str(tmp_path / "ck"),
                  {"w": ((2,), [((0,), torch.ones(2))]),
                   "c": ((2,), [((0,), torch.ones(2, dtype=torch.complex32))])},
                  transforms={"w": ["stream.zstd/1"]})
    reader = pyckpt.load_checkpoint(d)
    assert reader.keys() == ["c", "w"]  # listed
    src = reader.source
    assert src.describe()["torch_dtypes"] == {"c": "torch.complex32"}
    assert src.nbytes([src.index["c"]]) == 8  # torch's size of 2 complex32 values
    with pytest.raises(UnsupportedDCPError, match=r"stream transforms \['stream.zstd/1'\]"):
        reader.get_tensor("w")
    with pytest.raises(UnsupportedDCPError, match=r"torch.complex32"):
        reader.get_tensor("c")
    assert isinstance(UnsupportedDCPError("x"), CheckpointError)


def test_opening_never_takes_pyckpt_checkpoints(tmp_path):
    """A `.metadata` older than pyckpt's index is never read (test_mixed_dir.py: the
    commit record written last is)."""
    (tmp_path / "ck").mkdir()
    (tmp_path / "ck" / ".metadata").write_bytes(b"not a pickle")
    os.utime(tmp_path / "ck" / ".metadata", (1, 1))
    pyckpt.save({"a": np.ones(2)}, str(tmp_path / "ck"))
    with pytest.warns(UserWarning, match="reading pyckpt's"):
        assert pyckpt.load_checkpoint(str(tmp_path / "ck")).source.format == "pyckpt"


def test_from_metadata_bytes(ckpt):
    with open(os.path.join(ckpt, ".metadata"), "rb") as f:
        data = f.read()
    src = DCPCheckpoint.from_metadata_bytes(LocalStore(), ckpt, data)
    assert src.read_new([src.index["plain.i64"]])[0][0] == 2 ** 40
