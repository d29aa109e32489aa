"""Fixtures of the DCP reader's tests: the committed checkpoint (make_fixtures.py) and
its expected values, a store that records every read, and a builder of DCP
directories with torch's own classes (for layouts FileSystemWriter only writes
from several processes, or never: chosen chunk boxes, stored views, raw items)."""

import io
import os
import pickle
import shutil
from typing import Any

import numpy as np
import pytest

from pyckpt.storage.local import LocalStore

FIXTURES = os.path.join(os.path.dirname(os.path.abspath(__file__)), "fixtures")
CKPT = os.path.join(FIXTURES, "ckpt")


def load_expected() -> dict[str, dict[str, Any]]:
    """{"tensors": {key: array}, "bytes": {key: stored bytes}, "chunks": {key: rows of
    offsets + sizes}} from fixtures/expected.npz (bfloat16 kept as raw bits there)."""
    import ml_dtypes
    out: dict[str, dict[str, Any]] = {"tensors": {}, "bytes": {}, "chunks": {}}
    with np.load(os.path.join(FIXTURES, "expected.npz")) as z:
        for name in z.files:
            kind, key = name.split(":", 1)
            if kind == "t":
                out["tensors"][key] = z[name]
            elif kind == "bf16":
                out["tensors"][key] = z[name].view(ml_dtypes.bfloat16)
            elif kind == "b":
                out["bytes"][key] = z[name].tobytes()
            else:
                out["chunks"][key] = z[name]
    return out


@pytest.fixture(scope="session")
def expected():
    return load_expected()


@pytest.fixture
def ckpt():
    """The committed fixture checkpoint (read only)."""
    return CKPT


@pytest.fixture
def ckpt_copy(tmp_path):
    """A fresh copy of the fixture checkpoint, to damage."""
    dst = tmp_path / "ckpt"
    shutil.copytree(CKPT, dst)
    return str(dst)


class RecordingStore(LocalStore):
    """The local store, recording every read as (file name, start, end)."""

    def __init__(self) -> None:
        self.reads: list[tuple[str, int, int]] = []

    def read_bytes(self, path: str) -> bytes:
        data = super().read_bytes(path)
        self.reads.append((os.path.basename(path), 0, len(data)))
        return data

    def read_ranges(self, path, ranges):
        self.reads += [(os.path.basename(path), s, e) for s, e in ranges]
        return super().read_ranges(path, ranges)


@pytest.fixture
def recording_store():
    return RecordingStore


def same(got: np.ndarray, want: np.ndarray) -> bool:
    """Equal dtype, shape and bytes."""
    return got.dtype == want.dtype and got.shape == want.shape and \
        np.ascontiguousarray(got).tobytes() == np.ascontiguousarray(want).tobytes()


@pytest.fixture
def same_value():
    return same


# -- building DCP directories with torch ------------------------------------------------

def build(path: str, tensors: dict, bytes_entries: dict | None = None,
          raw: dict | None = None, transforms: dict | None = None) -> str:
    """Writes a DCP directory as FileSystemWriter lays it out (one ``__0_0.distcp``,
    items written by torch.save at increasing offsets, ``.metadata`` pickled) from
    ``tensors``: {key: (global shape, [(offsets, chunk tensor), ...])}; ``bytes_entries``:
    {key: bytes}; ``raw``: {(key, chunk #): bytes written instead of that chunk's
    archive}; ``transforms``: {key: descriptors recorded for its items}."""
    import torch
    from torch.distributed.checkpoint.filesystem import _StorageInfo
    from torch.distributed.checkpoint.metadata import (BytesStorageMetadata, ChunkStorageMetadata,
                                                       Metadata, MetadataIndex, TensorProperties,
                                                       TensorStorageMetadata)
    os.makedirs(path, exist_ok=True)
    raw, transforms = raw or {}, transforms or {}
    sdm: dict = {}
    storage: dict = {}
    with open(os.path.join(path, "__0_0.distcp"), "wb") as f:
        for key, data in (bytes_entries or {}).items():
            storage[MetadataIndex(key)] = _StorageInfo("__0_0.distcp", f.tell(), len(data))
            f.write(data)
            sdm[key] = BytesStorageMetadata()
        for key, (shape, chunks) in tensors.items():
            metas = []
            for n, (offsets, t) in enumerate(chunks):
                start = f.tell()
                if (key, n) in raw:
                    f.write(raw[(key, n)])
                else:
                    torch.save(t, f)
                storage[MetadataIndex(key, offsets)] = _StorageInfo(
                    "__0_0.distcp", start, f.tell() - start,
                    transform_descriptors=transforms.get(key))
                metas.append(ChunkStorageMetadata(torch.Size(offsets), torch.Size(t.shape)))
            dtype = chunks[0][1].dtype if chunks else torch.float32
            sdm[key] = TensorStorageMetadata(TensorProperties(dtype=dtype), torch.Size(shape), metas)
    with open(os.path.join(path, ".metadata"), "wb") as f:
        pickle.dump(Metadata(sdm, storage_data=storage, version="1.0.0"), f)
    return path


@pytest.fixture
def build_dcp():
    pytest.importorskip("torch")
    return build


def torch_saved(t: Any) -> bytes:
    """torch.save's archive of ``t``."""
    import torch
    buf = io.BytesIO()
    torch.save(t, buf)
    return buf.getvalue()


@pytest.fixture
def saved():
    pytest.importorskip("torch")
    return torch_saved
