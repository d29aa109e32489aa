"""Issue 37 item 3: no format's reader returns bytes from a file that a link in the
checkpoint points to (a DCP data file, a safetensors shard of a Hugging Face folder),
neither through ``load`` nor through ``pyckpt cp``."""

from __future__ import annotations

import os
import shutil

import numpy as np
import pytest

import pyckpt
from pyckpt.errors import CorruptCheckpointError
from pyckpt.transfer import transfer


def _link_in_place(path: str, elsewhere: str) -> None:
    """Moves ``path`` out (same bytes: only the link is hostile) and links it back."""
    shutil.move(path, elsewhere)
    os.symlink(elsewhere, path)


def test_dcp_data_file_link_is_refused(ckpt_copy, tmp_path):
    _link_in_place(os.path.join(ckpt_copy, "__0_0.distcp"), str(tmp_path / "secret"))
    with pytest.raises(CorruptCheckpointError, match="symbolic link"):
        pyckpt.load(ckpt_copy)
    with pytest.raises(CorruptCheckpointError, match="symbolic link"):  # pyckpt cp
        transfer(ckpt_copy, str(tmp_path / "copy"), "pyckpt")
    assert not os.path.exists(tmp_path / "copy" / "pyckpt.index")


def test_dcp_metadata_link_is_refused(ckpt_copy, tmp_path):
    _link_in_place(os.path.join(ckpt_copy, ".metadata"), str(tmp_path / "meta"))
    with pytest.raises(CorruptCheckpointError, match="symbolic link"):
        pyckpt.load(ckpt_copy)


def test_hf_folder_shard_link_is_refused(tmp_path):
    from pyckpt.interop.safetensors import export_hf
    src, folder = str(tmp_path / "src"), str(tmp_path / "hf")
    pyckpt.save({"a": np.ones((64, 64), np.float32), "b": np.zeros((64, 64), np.float32)}, src)
    export_hf(src, folder, max_shard_size="20KB")
    shards = sorted(n for n in os.listdir(folder) if n.endswith(".safetensors"))
    assert len(shards) == 2
    _link_in_place(os.path.join(folder, shards[1]), str(tmp_path / "secret.safetensors"))
    with pytest.raises(CorruptCheckpointError, match="symbolic link"):
        pyckpt.load(folder)
