"""safetensors files to and from pyckpt checkpoints (``pyckpt cp``): the reading and
writing of the format is the codec's (``pyckpt.codecs.safetensors``), checkpoints
are opened through ``sources.open_source`` and written through ``saving``."""

from __future__ import annotations

from typing import Any, Callable

from .. import saving
from ..codecs.safetensors import SafetensorsFile, detect, dtype_name, is_safetensors_path, write_file
from ..format.source import CheckpointSource
from ..sources import open_source
from ..storage import resolve
from ..tree import validate_keys
from ..workers.comm import SingleComm

__all__ = ["is_safetensors_path", "detect", "SafetensorsFile", "to_checkpoint",
           "from_checkpoint", "dtype_name"]


def to_checkpoint(src: Any, dst: Any, *, src_options: dict | None = None,
                  dst_options: dict | None = None,
                  progress: Callable[[int, int], Any] | None = None) -> None:
    """A safetensors file (a path, or an opened SafetensorsFile) -> a pyckpt
    checkpoint (dtypes and metadata kept)."""
    if not isinstance(src, CheckpointSource):
        src = SafetensorsFile(*resolve(src, src_options))
    validate_keys(list(src.keys))  # a foreign file's names become stored keys
    values = src.read_new(range(len(src.keys)))
    saving.write([saving.Item(k, v) for k, v in zip(src.keys, values)], dst,
                 storage_options=dst_options, comm=SingleComm(), progress=progress,
                 metadata={"safetensors": src.metadata} if src.metadata else None)


def from_checkpoint(src: Any, dst: Any, *, src_options: dict | None = None,
                    dst_options: dict | None = None,
                    progress: Callable[[int, int], Any] | None = None) -> None:
    """A checkpoint (a path of any format, or any opened source) -> a safetensors
    file, tensor by tensor (verified reads)."""
    write_file(open_source(src, src_options), *resolve(dst, dst_options), progress=progress)
