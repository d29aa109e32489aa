"""Keys that are not UTF-8 text (issue 37, item 8): a Python string may hold a lone
surrogate (``"a\\udc80"``, from ``os.fsdecode`` of a bad name, say), which no
format pyckpt writes can store. Every save refuses it with a ValueError naming
the key before anything is written; a stored one is a corrupt checkpoint."""

import json
import os
import struct
import warnings

import numpy as np
import pytest

import pyckpt
from pyckpt._reference_reader import crc32c, mask
from pyckpt.cli import main
from pyckpt.errors import CorruptCheckpointError
from pyckpt.tree import check_utf8, validate_key, validate_keys

BAD = "a\udc80"


def _refused(fn):
    with pytest.raises(ValueError) as e:
        fn()
    assert "a\\udc80'" in str(e.value) and "UTF-8" in str(e.value), str(e.value)  # repr


def test_the_key_rule():
    _refused(lambda: validate_key(BAD))
    _refused(lambda: validate_keys(["ok", "x/" + BAD]))
    _refused(lambda: check_utf8(["ok", BAD], "tensor name"))
    validate_keys(["ok", "é/日本", "\U0001F600"])  # any other text is fine
    check_utf8(["a//b", "é"])


@pytest.mark.parametrize("door", ["save", "nested", "background", "write", "manager"])
def test_every_save_refuses_it_and_writes_nothing(tmp_path, door):
    path = tmp_path / "ck"
    saves = {
        "save": lambda: pyckpt.save({BAD: np.arange(3)}, path),
        "nested": lambda: pyckpt.save({"x": {BAD: np.arange(3)}}, path),
        "background": lambda: pyckpt.save({BAD: np.arange(3)}, path, blocking=False).wait(),
        "write": lambda: pyckpt.Checkpoint(**{BAD: pyckpt.Variable(np.ones(2))}).write(path),
        "manager": lambda: pyckpt.CheckpointManager(
            pyckpt.Checkpoint(**{BAD: pyckpt.Variable(np.ones(2))}), path).save(),
    }
    _refused(saves[door])
    written = [n for _, _, f in os.walk(path) for n in f] if path.exists() else []
    assert written in ([], ["pyckpt-manager.lock"]), written


def test_cp_names_the_key_in_one_line(tmp_path, capsys):
    header = b'{"a\\udc80":{"dtype":"U8","shape":[4],"data_offsets":[0,4]}}'
    src = tmp_path / "s.safetensors"
    src.write_bytes(struct.pack("<Q", len(header)) + header + bytes(4))
    for fmt in ("pyckpt", "hf"):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            code = main(["cp", str(src), str(tmp_path / fmt), "--format", fmt])
        err = capsys.readouterr().err
        assert code == 1 and "'a\\udc80'" in err and "TypeError" not in err, err
        assert not (tmp_path / fmt).exists() or not os.listdir(tmp_path / fmt)


def test_a_stored_key_that_is_not_utf8_is_corrupt(tmp_path):
    ck = tmp_path / "ck"
    pyckpt.save({"ax": np.arange(3)}, ck)
    index = ck / "pyckpt.index"
    data = index.read_bytes()
    length = struct.unpack_from("<Q", data, 16)[0]
    body = data[32:32 + length].replace(b'"ax"', b'"a\\udc80"')  # a JSON escape: valid JSON
    version = struct.unpack_from("<I", data, 8)[0]
    head = struct.pack("<8sIIQI", b"PYCKPTIX", version, 0, len(body), mask(crc32c(body)))
    index.write_bytes(head + struct.pack("<I", mask(crc32c(head))) + body + b"PYCKEND\n")
    json.loads(body)  # still JSON
    with pytest.raises(CorruptCheckpointError) as e:
        pyckpt.load(ck)
    assert "'a\\udc80'" in str(e.value) and "pyckpt.index" in str(e.value)


def test_str_values_and_metadata_that_are_not_utf8_are_refused_before_writing(tmp_path):
    """Not only keys: a str leaf or a metadata value with a lone surrogate is refused
    naming it, before any data file is written (it raised UnicodeEncodeError from the
    index encoder after the data was written)."""
    import numpy as np
    import pyckpt
    path = tmp_path / "c"
    with pytest.raises(ValueError, match="'a'.*lone surrogate"):
        pyckpt.save({"a": "x\udc80", "w": np.ones(2)}, path)
    with pytest.raises(ValueError, match="metadata"):
        pyckpt.save({"w": np.ones(2)}, path, metadata={"m": "\udc80"})
    assert not path.exists() or not any(n.startswith("data-") for n in os.listdir(path))
