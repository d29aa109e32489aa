"""Hugging Face safetensors folders, as transformers' ``save_pretrained`` writes them,
read as one checkpoint source: a model that fits one file is ``model.safetensors``
alone (no index); a larger one is ``model-0000i-of-0000N.safetensors`` files and
``model.safetensors.index.json`` (``{"metadata": {"total_size": ...}, "weight_map":
{key: file}}``), given as the folder or its index file. A folder holding both is read
as transformers' ``from_pretrained`` reads it: ``model.safetensors``. Other files
(``config.json``, tokenizer files) are left alone. The index must name every
tensor of every file it lists, and only those: a tensor in a file the index does
not give it to, or a key the index gives to a file that lacks it, is refused
(CorruptCheckpointError naming both), as is a file name that is not a plain name
in the folder.
"""

from __future__ import annotations

import re
from typing import Any, Sequence

import numpy as np

from ..errors import CheckpointNotFoundError, CorruptCheckpointError
from ..format.json_scan import loads_untrusted
from ..storage import Store
from ..tree import check_utf8
from .safetensors import FlatTensors, SafetensorsFile

__all__ = ["INDEX_FILE", "SINGLE_FILE", "SHARD_NAME", "detect", "HFFolder", "shard_name",
           "is_shard_name", "weights_file"]

INDEX_FILE = "model.safetensors.index.json"
SINGLE_FILE = "model.safetensors"  # a model that fits one file: no index
_WEIGHTS = (SINGLE_FILE, INDEX_FILE)  # what a folder's weights are, in from_pretrained's order
SHARD_NAME = re.compile(r"^model-(\d{5,})-of-(\d{5,})\.safetensors$")
_MAX_INDEX = 256 << 20


def shard_name(i: int, n: int) -> str:
    """The name transformers gives file ``i`` (from 1) of ``n``."""
    return f"model-{i:05d}-of-{n:05d}.safetensors"


def is_shard_name(name: str) -> bool:
    return SHARD_NAME.match(name) is not None


def weights_file(names: Any) -> str | None:
    """Of a folder's file ``names``, the one transformers reads its weights from
    (``model.safetensors`` before the index), or None: no Hugging Face folder."""
    return next((n for n in _WEIGHTS if n in names), None)


def detect(store: Store, path: str) -> bool:
    """A folder holding ``model.safetensors`` or ``model.safetensors.index.json``, or
    that index file."""
    if path.endswith(".safetensors.index.json"):
        return store.exists(path) and not store.isdir(path)
    return bool(path) and any(store.exists(store.join(path, n)) for n in _WEIGHTS)


def _plain(name: Any, url: str) -> str:
    if not isinstance(name, str) or not name.endswith(".safetensors") or "/" in name \
            or "\\" in name or name.startswith("."):
        raise CorruptCheckpointError(f"{url}: weight_map names {name!r}, which is not a "
                                     ".safetensors file of this folder")
    return name


class HFFolder(FlatTensors):
    """The safetensors files of a folder, joined by its index (module doc). Reads check
    sizes and bounds (safetensors has no checksums)."""

    format = "hf-safetensors"

    def __init__(self, store: Store, path: str) -> None:
        self.store = store
        if path.endswith(".safetensors.index.json"):
            self.folder, self.weights_path = path.rpartition("/")[0], path
        else:  # model.safetensors if there is one (the index is then not read), else the index
            name = next((n for n in _WEIGHTS if store.exists(store.join(path, n))), INDEX_FILE)
            self.folder, self.weights_path = path, store.join(path, name)
        url = store.url(self.weights_path)
        if not self.weights_path.endswith(".index.json"):  # model.safetensors alone
            try:
                sf = SafetensorsFile(store, self.weights_path)
            except FileNotFoundError:
                raise CheckpointNotFoundError(f"no Hugging Face weights at {url}") from None
            names = {k: SINGLE_FILE for k in sf.keys}
            self._metadata = dict(sf.metadata)
            self.files = {SINGLE_FILE: sf}
        else:
            names = self._read_index(url)
            self.files = {f: self._shard(url, f, names) for f in sorted(set(names.values()))}
        for f, sf in self.files.items():
            for k in sf.keys:
                if names.get(k) != f:
                    raise CorruptCheckpointError(
                        f"{sf.url} holds tensor {k!r}, which {url} "
                        + (f"gives to {names[k]}" if k in names else "does not name"))
        for k, f in names.items():
            if k not in self.files[f].index:
                raise CorruptCheckpointError(f"{url} gives tensor {k!r} to {f}, which lacks it")
        self._keys = list(names)
        self._index = {k: i for i, k in enumerate(self._keys)}
        self._where = [(self.files[names[k]], self.files[names[k]].index[k]) for k in self._keys]

    def _read_index(self, url: str) -> dict[str, str]:
        """The index's weight_map ({tensor: file}, every name checked); its metadata
        becomes the source's."""
        try:
            raw = self.store.read_bytes(self.weights_path)
        except FileNotFoundError:
            raise CheckpointNotFoundError(f"no Hugging Face index at {url}") from None
        if len(raw) > _MAX_INDEX:
            raise CorruptCheckpointError(f"{url}: {len(raw)} bytes is too large for an index")
        try:
            doc = loads_untrusted(raw)
        except ValueError as e:
            raise CorruptCheckpointError(f"{url}: not a JSON index ({e})") from None
        wmap = doc.get("weight_map") if isinstance(doc, dict) else None
        if not isinstance(wmap, dict) or not all(isinstance(k, str) for k in wmap):
            raise CorruptCheckpointError(f"{url}: no weight_map object of tensor names")
        try:
            check_utf8(list(wmap), "tensor name")
        except ValueError as e:
            raise CorruptCheckpointError(f"{url}: {e}") from None
        meta = doc.get("metadata")
        self._metadata = dict(meta) if isinstance(meta, dict) else {}
        return {k: _plain(f, url) for k, f in wmap.items()}

    def _shard(self, url: str, name: str, names: dict[str, str]) -> SafetensorsFile:
        """The file ``name`` of the folder, opened; one that is missing is a broken
        folder (CorruptCheckpointError naming it and a tensor the index gives it)."""
        path = self.store.join(self.folder, name)
        try:
            return SafetensorsFile(self.store, path)
        except FileNotFoundError:
            key = next(k for k, f in names.items() if f == name)
            raise CorruptCheckpointError(f"{url} gives tensor {key!r} to {name}, but "
                                         f"{self.store.url(path)} does not exist") from None

    @property
    def url(self) -> str:
        return self.store.url(self.folder)

    def shape(self, i: int) -> tuple[int, ...]:
        f, j = self._where[i]
        return f.shape(j)

    def dtype(self, i: int) -> np.dtype:
        f, j = self._where[i]
        return f.dtype(j)

    def describe(self) -> dict:
        return {"layout": "Hugging Face safetensors folder",
                "files": [{"name": f, "bytes": self.store.size(sf.path)}
                          for f, sf in self.files.items()]}

    def read_new(self, indices: Sequence[int], mmap: bool = False) -> list[np.ndarray]:
        out: list[Any] = [None] * len(indices)
        by_file: dict[int, list[int]] = {}
        for pos, i in enumerate(indices):
            by_file.setdefault(id(self._where[i][0]), []).append(pos)
        for positions in by_file.values():
            f = self._where[indices[positions[0]]][0]
            values = f.read_new([self._where[indices[p]][1] for p in positions], mmap=mmap)
            for p, v in zip(positions, values):
                out[p] = v
        return out

    def verify(self) -> None:
        """Reads every tensor of every file (sizes and bounds: no checksums)."""
        for f in self.files.values():
            f.verify()
