"""Reading checkpoints that TensorFlow wrote (tests/interop_tf/fixtures, made by
make_fixtures.py), without TensorFlow: every entry point, every dtype, object-based
restore, the TF1 ensemble, integrity errors."""

import os
import shutil
import sys

import numpy as np
import pytest

import pyckpt
from pyckpt.errors import CorruptCheckpointError
from pyckpt.interop import tensorflow as tfio
from pyckpt.codecs.tensorflow import bundle


def test_tensorflow_is_never_imported(fixtures):
    pyckpt.load_checkpoint(os.path.join(fixtures, "mixed", "ckpt-1")).verify()
    assert "tensorflow" not in sys.modules


@pytest.mark.parametrize("group", ["training", "tf1", "mixed", "raw"])
def test_every_tensor_as_tensorflow_reads_it(fixtures, tf_expected, same, group):
    checked = 0
    for name, values in tf_expected(group).items():
        prefix = os.path.join(fixtures, group, name)
        reader = pyckpt.load_checkpoint(prefix)
        assert reader.source.format == "tensorflow"
        shapes = reader.get_variable_to_shape_map()
        dtypes = reader.get_variable_to_dtype_map()
        for key, want in values.items():
            if key == "part":  # sliced: refused (test_sliced_tensor_is_refused)
                continue
            got = reader.get_tensor(key)
            assert same(got, want), key
            assert shapes[key] == want.shape
            assert dtypes[key] == got.dtype
            assert same(pyckpt.load_variable(prefix, key), want)
            checked += 1
        reader.verify()
    assert checked >= 10


def test_list_variables_and_dtypes(fixtures):
    prefix = os.path.join(fixtures, "raw", "dtypes")
    listed = pyckpt.list_variables(prefix)
    assert [k for k, _ in listed] == sorted(k for k, _ in listed)
    assert dict(listed)["strings"] == (2, 2)
    dtypes = pyckpt.load_checkpoint(prefix).get_variable_to_dtype_map()
    assert {k: str(v) for k, v in dtypes.items()} == {
        "bf16": "bfloat16", "bool": "bool", "c128": "complex128", "c64": "complex64",
        "empty": "float32", "f16": "float16", "f32": "float32", "f64": "float64",
        "i16": "int16", "i32": "int32", "i64": "int64", "i8": "int8", "string_empty": "object",
        "string_scalar": "object", "strings": "object", "u16": "uint16", "u32": "uint32",
        "u64": "uint64", "u8": "uint8"}


def test_string_tensors(fixtures):
    prefix = os.path.join(fixtures, "raw", "dtypes")
    r = pyckpt.load_checkpoint(prefix)
    assert r.get_tensor("strings").tolist() == [[b"x", b""], [b"longer string " * 20, b"\x00\xff"]]
    assert r.get_tensor("string_scalar")[()] == b"a scalar string"
    assert r.get_tensor("string_empty").shape == (0,)
    words = pyckpt.load_variable(os.path.join(fixtures, "mixed", "ckpt-1"),
                                 "model/words/.ATTRIBUTES/VARIABLE_VALUE")
    assert words.tolist() == [b"", b"a", b"hello world", bytes(range(256)) * 3]


def test_latest_checkpoint_reads_tensorflow_state_file(fixtures):
    assert pyckpt.latest_checkpoint(os.path.join(fixtures, "training")) == \
        os.path.join(fixtures, "training", "ckpt-5")
    assert pyckpt.latest_checkpoint(os.path.join(fixtures, "mixed")) == \
        os.path.join(fixtures, "mixed", "ckpt-1")
    # the TF1 Saver wrote absolute paths of the machine that made the fixtures: the
    # checkpoint of that name in this directory is meant, never a path elsewhere
    run1 = os.path.join(fixtures, "tf1", "run_1")
    assert pyckpt.latest_checkpoint(run1) == os.path.join(run1, "model.ckpt-6")
    assert pyckpt.latest_checkpoint(os.path.join(fixtures, "raw")) is None
    r = pyckpt.load_checkpoint(os.path.join(fixtures, "training"))
    assert r.path == os.path.join(fixtures, "training", "ckpt-5")


def test_latest_without_state_file_scans_prefixes(fixture_copy):
    d = fixture_copy("training")
    os.remove(os.path.join(d, "checkpoint"))
    assert pyckpt.latest_checkpoint(d) == os.path.join(d, "ckpt-5")
    for f in os.listdir(d):
        if f.startswith("ckpt-5."):
            os.remove(os.path.join(d, f))
    assert pyckpt.latest_checkpoint(d) == os.path.join(d, "ckpt-4")


def test_state_file_naming_a_deleted_checkpoint_falls_back_to_the_listed_ones(fixture_copy):
    d = fixture_copy("training")
    os.remove(os.path.join(d, "ckpt-5.index"))
    assert pyckpt.latest_checkpoint(d) == os.path.join(d, "ckpt-4")


@pytest.mark.parametrize("text", [
    'model_checkpoint_path: ".."\n', 'model_checkpoint_path: "/etc/"\n',
    'model_checkpoint_path: "ckpt-5\n', "model_checkpoint_path: 5 5\n", "\xff\xfe",
    'model_checkpoint_path: "a\\q"\n',
])
def test_hostile_state_file_is_refused(fixture_copy, text):
    d = fixture_copy("training")
    with open(os.path.join(d, "checkpoint"), "wb") as f:
        f.write(text.encode("latin-1"))
    with pytest.raises(CorruptCheckpointError, match="checkpoint"):
        pyckpt.latest_checkpoint(d)


def test_state_file_paths_never_leave_the_directory(fixture_copy, tmp_path):
    d = fixture_copy("training")
    outside = tmp_path / "outside"
    shutil.copytree(d, outside)
    with open(os.path.join(d, "checkpoint"), "w") as f:
        f.write(f'model_checkpoint_path: "{outside}/ckpt-4"\n'
                'all_model_checkpoint_paths: "../outside/ckpt-3"\n')
    assert pyckpt.latest_checkpoint(d) == os.path.join(d, "ckpt-4")
    for f in os.listdir(d):
        if f.startswith("ckpt-4."):
            os.remove(os.path.join(d, f))
    assert pyckpt.latest_checkpoint(d) == os.path.join(d, "ckpt-3")


def test_load_returns_the_nested_keys(fixtures):
    tree = pyckpt.load(os.path.join(fixtures, "tf1", "run_0", "model.ckpt-5"))
    assert tree["dense"]["kernel"].shape == (4, 3)
    assert tree["dense/kernel/Adam_1"].shape == (4, 3)  # a leaf and a prefix: kept flat
    assert tree["global_step"] == 5
    sel = pyckpt.load(os.path.join(fixtures, "mixed", "ckpt-1"), select="model/layers/*")
    assert len(sel["model"]["layers"]) == 3
    words = pyckpt.load(os.path.join(fixtures, "mixed", "ckpt-1"), select="model/words/*")
    assert words["model"]["words"][".ATTRIBUTES"]["VARIABLE_VALUE"][2] == b"hello world"


def test_tf1_ensemble_with_key_map(fixtures, tf_expected, same):
    """Three TF1 Saver checkpoints of one graph loaded side by side (the seeds' ensemble)."""
    want = tf_expected("tf1")
    keys = [k for k, _ in pyckpt.list_variables(os.path.join(fixtures, "tf1", "run_0"))]
    into = {}
    for m in range(3):
        src = pyckpt.load_checkpoint(os.path.join(fixtures, "tf1", f"run_{m}")).source
        into[f"model_{m}"] = {k: np.zeros(src.shape(src.index[k]), src.dtype(src.index[k]))
                              for k in keys if k != "global_step"}
    for m in range(3):
        pyckpt.load(os.path.join(fixtures, "tf1", f"run_{m}"), into={f"model_{m}": into[f"model_{m}"]},
                    select=["dense/*", "beta*"], key_map=lambda k, m=m: f"model_{m}/{k}")
    for m in range(3):
        (name,) = [n for n in want if n.startswith(f"run_{m}/")]
        for k, v in into[f"model_{m}"].items():
            assert same(v, want[name][k]), (m, k)
    assert not np.array_equal(into["model_0"]["dense/kernel"], into["model_1"]["dense/kernel"])


def test_get_tensor_reads_only_its_bytes(fixture_copy):
    d = fixture_copy("mixed")
    prefix = os.path.join(d, "ckpt-1")
    r = pyckpt.load_checkpoint(prefix)
    src = r.source
    i = src.index["model/big/.ATTRIBUTES/VARIABLE_VALUE"]
    data = os.path.join(d, "ckpt-1.data-00000-of-00001")
    with open(data, "r+b") as f:
        f.seek(int(src.offset[i]) + 1000)
        b = f.read(1)
        f.seek(int(src.offset[i]) + 1000)
        f.write(bytes([b[0] ^ 0x10]))
    assert r.get_tensor("model/f16/.ATTRIBUTES/VARIABLE_VALUE").shape == (3, 4)
    lo, hi = int(src.offset[i]), int(src.offset[i] + src.size[i])
    with pytest.raises(CorruptCheckpointError) as e:
        r.get_tensor("model/big/.ATTRIBUTES/VARIABLE_VALUE")
    msg = str(e.value)
    assert "model/big/.ATTRIBUTES/VARIABLE_VALUE" in msg and data in msg and f"[{lo}, {hi})" in msg
    with pytest.raises(CorruptCheckpointError, match="model/big"):
        r.verify()


@pytest.mark.parametrize("piece,step", [(bundle.PIECE, bundle.STEP), (3 * 4096 + 100, 4096),
                                        (1 << 30, bundle.STEP), (8192, 4096)])
@pytest.mark.parametrize("where", [0.0, 0.5, 1.0])
def test_large_entries_are_checked_whole(fixture_copy, monkeypatch, piece, step, where,
                                          tf_expected, same):
    """Large entries: parallel pieces read in steps, their CRCs combined into the
    entry's one CRC; a flipped byte in any piece is caught and named."""
    monkeypatch.setattr(bundle, "PIECE", piece)
    monkeypatch.setattr(bundle, "STEP", step)
    d = fixture_copy("mixed")
    prefix = os.path.join(d, "ckpt-1")
    want = tf_expected("mixed")["ckpt-1"]
    state = pyckpt.load(prefix)
    assert same(state["model"]["big"][".ATTRIBUTES"]["VARIABLE_VALUE"],
                want["model/big/.ATTRIBUTES/VARIABLE_VALUE"])
    r = pyckpt.load_checkpoint(prefix)
    i = r.source.index["model/big/.ATTRIBUTES/VARIABLE_VALUE"]
    off, size = int(r.source.offset[i]), int(r.source.size[i])
    assert size > 4 * 8192  # several pieces in the small settings
    with open(os.path.join(d, "ckpt-1.data-00000-of-00001"), "r+b") as f:
        f.seek(off + min(size - 1, int(size * where)))
        b = f.read(1)
        f.seek(-1, 1)
        f.write(bytes([b[0] ^ 1]))
    with pytest.raises(CorruptCheckpointError, match="checksum mismatch in tensor 'model/big") as e:
        r.get_tensor("model/big/.ATTRIBUTES/VARIABLE_VALUE")
    assert f"[{off}, {off + size})" in str(e.value)
    with pytest.raises(CorruptCheckpointError, match="model/big"):
        r.verify()
    # the other entries still read
    assert same(r.get_tensor("model/i64/.ATTRIBUTES/VARIABLE_VALUE"),
                want["model/i64/.ATTRIBUTES/VARIABLE_VALUE"])


def test_truncated_and_missing_data_files(fixture_copy):
    d = fixture_copy("mixed")
    prefix = os.path.join(d, "ckpt-1")
    data = prefix + ".data-00000-of-00001"
    size = os.path.getsize(data)
    with open(data, "r+b") as f:
        f.truncate(size - 10)
    r = pyckpt.load_checkpoint(prefix)
    with pytest.raises(CorruptCheckpointError, match=r"lie outside .*truncated") as e:
        r.verify()
    assert data in str(e.value)
    os.remove(data)
    with pytest.raises(CorruptCheckpointError, match="is missing"):
        pyckpt.load_variable(prefix, "model/big/.ATTRIBUTES/VARIABLE_VALUE")


def test_corrupt_string_tensor(fixture_copy):
    d = fixture_copy("raw")
    prefix = os.path.join(d, "dtypes")
    src = pyckpt.load_checkpoint(prefix).source
    i = src.index["strings"]
    with open(prefix + ".data-00000-of-00001", "r+b") as f:
        f.seek(int(src.offset[i]) + int(src.size[i]) - 3)
        f.write(b"?")
    with pytest.raises(CorruptCheckpointError, match="'strings'.*checksum mismatch|checksum mismatch in tensor 'strings'"):
        pyckpt.load_variable(prefix, "strings")
    with open(prefix + ".data-00000-of-00001", "r+b") as f:  # a length byte: the lengths' own checksum
        f.seek(int(src.offset[i]))
        f.write(b"\x05")
    with pytest.raises(CorruptCheckpointError, match="string lengths|add up"):
        pyckpt.load_variable(prefix, "strings")


def test_sliced_tensor_is_refused(fixtures):
    prefix = os.path.join(fixtures, "raw", "sliced")
    assert dict(pyckpt.list_variables(prefix)) == {"part": (4, 2), "plain": ()}
    assert pyckpt.load_variable(prefix, "plain") == 1
    with pytest.raises(tfio.UnsupportedTensorError, match="'part'.*partitioned variable.*slices"):
        pyckpt.load_variable(prefix, "part")
    pyckpt.load_checkpoint(prefix).verify()  # the slices' bytes are checked all the same


def test_variant_tensor_is_refused(fixtures):
    prefix = os.path.join(fixtures, "training", "ckpt-5")
    with pytest.raises(tfio.UnsupportedTensorError, match="ITERATOR_STATE.*variant"):
        pyckpt.load_variable(prefix, "iterator/.ATTRIBUTES/ITERATOR_STATE")


def test_sharded_checkpoint(fixtures, tf_expected, same):
    want = tf_expected("mixed")["ckpt-1"]
    r = pyckpt.load_checkpoint(os.path.join(fixtures, "mixed", "sharded"))
    assert r.source.num_shards == 2
    assert len(r.source.describe()["files"]) == 2
    # TensorFlow's sharding policy leaves the empty variable out
    assert set(want) - set(r.keys()) == {"model/empty/.ATTRIBUTES/VARIABLE_VALUE",
                                         "save_counter/.ATTRIBUTES/VARIABLE_VALUE"}  # write()
    for key in r.keys():
        if key != "_CHECKPOINTABLE_OBJECT_GRAPH":
            assert same(r.get_tensor(key), want[key]), key
    r.verify()


def test_mmap(fixtures, tf_expected, same):
    want = tf_expected("mixed")["ckpt-1"]
    prefix = os.path.join(fixtures, "mixed", "ckpt-1")
    r = pyckpt.load_checkpoint(prefix)
    keys = [k for k in want if r.source.dtype(r.source.index[k]) != object]
    values = r.source.read_new([r.source.index[k] for k in keys], mmap=True)
    for k, v in zip(keys, values):
        assert not v.flags.writeable
        assert same(v, want[k]), k
    tree = pyckpt.load(prefix, mmap=True, select="model/big/*")
    assert same(tree["model"]["big"][".ATTRIBUTES"]["VARIABLE_VALUE"],
                want["model/big/.ATTRIBUTES/VARIABLE_VALUE"])


def test_remote_store(fixtures, tf_expected, same):
    """Through fsspec's memory filesystem: ranged reads, no local files."""
    fsspec = pytest.importorskip("fsspec")
    fs = fsspec.filesystem("memory")
    src = os.path.join(fixtures, "training")
    for name in os.listdir(src):
        with open(os.path.join(src, name), "rb") as f:
            fs.pipe(f"/tfremote/{name}", f.read())
    assert pyckpt.latest_checkpoint("memory://tfremote").endswith("tfremote/ckpt-5")
    want = tf_expected("training")["ckpt-5"]
    r = pyckpt.load_checkpoint("memory://tfremote")
    for key, value in want.items():
        assert same(r.get_tensor(key), value), key
    r.verify()


def test_index_of_one_file_alone_opens(fixtures):
    """``dir/ckpt-5.index`` names the same checkpoint as ``dir/ckpt-5``."""
    r = pyckpt.load_checkpoint(os.path.join(fixtures, "training", "ckpt-5.index"))
    assert r.path.endswith("ckpt-5")
