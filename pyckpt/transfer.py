"""Copies and conversions between checkpoint locations and formats (``pyckpt cp``):
pyckpt to pyckpt (every chunk verified, the copy committed last), and to or from
``.safetensors`` files, Hugging Face safetensors folders and TensorFlow checkpoints. The commands reach formats only
through this module and the public API (docs/ARCHITECTURE.md)."""

from __future__ import annotations

from typing import Any, Callable

from . import saving
from .codecs import hf_folder
from .format import INDEX_NAME
from .format.read_plan import ReadPlan
from .format.source import CheckpointSource
from .interop import safetensors as st
from .interop import tensorflow as tfio
from .sources import checkpoint_path, open_source
from .storage import resolve
from .tree import validate_keys
from .workers.comm import SingleComm

__all__ = ["target_format", "occupied", "tensorflow_source", "is_safetensors_path", "transfer"]

is_safetensors_path = st.is_safetensors_path


def tensorflow_source(path: str, storage_options: dict | None = None) -> Any:
    """The TensorFlow checkpoint ``path`` designates (a prefix, its ``.index`` file, or a
    run directory whose latest checkpoint is TensorFlow's), opened; None for anything
    else (pyckpt checkpoints, safetensors files, missing paths)."""
    store, p = resolve(path, storage_options)
    p = checkpoint_path(store, p)
    return tfio.open_path(store, p) if tfio.detect(store, p) else None


def target_format(dst: str, fmt: str = "auto") -> tuple[str, str]:
    """(format of ``dst``, ``dst``): ``fmt`` unless ``auto``, else ``.safetensors`` and
    ``.index`` endings (``run/ckpt-5.index`` means the TensorFlow prefix ``run/ckpt-5``),
    else pyckpt."""
    if fmt == "auto":
        fmt = ("safetensors" if st.is_safetensors_path(dst)
               else "tf" if dst.endswith(".index") else "pyckpt")
    if fmt == "tf" and dst.endswith(".index"):
        dst = dst[:-len(".index")]
    return fmt, dst


def occupied(dst: str, options: dict | None, fmt: str = "pyckpt") -> str | None:
    """What at ``dst`` a copy would replace (a committed checkpoint, a file), or None."""
    store, path = resolve(dst, options)
    if fmt == "hf":
        return (f"{store.url(path)} already holds a Hugging Face folder"
                if hf_folder.detect(store, path) else None)
    if fmt == "tf":
        return (f"{store.url(path)} is already a TensorFlow checkpoint"
                if store.exists(path + ".index") else None)
    if st.is_safetensors_path(dst):
        return f"{store.url(path)} already exists" if store.exists(path) else None
    if store.exists(store.join(path, INDEX_NAME)):
        return f"{store.url(path)} already holds a committed checkpoint"
    return None


def transfer(src: str, dst: str, fmt: str, *, source: Any = None,
             src_options: dict | None = None, dst_options: dict | None = None,
             progress: Callable[[int, int], Any] | None = None,
             max_shard_size: Any = "5GB", config: Any = None) -> None:
    """Writes ``src`` at ``dst`` in format ``fmt`` (``target_format``; ``hf``: a Hugging
    Face safetensors folder of files of at most ``max_shard_size``, with the
    ``config.json`` and tokenizer files of ``config``, read with ``src_options``:
    ``export_hf``); ``source``: the opened TensorFlow checkpoint ``src`` designates
    (``tensorflow_source``), if any."""
    if config is not None and fmt != "hf":
        raise ValueError("a config is written with a Hugging Face folder only (format hf)")
    if fmt == "hf":
        st.export_hf(source if source is not None else src, dst, max_shard_size=max_shard_size,
                     config=config, src_options=src_options, dst_options=dst_options,
                     config_options=src_options, progress=progress)
    elif fmt == "tf":
        tfio.from_checkpoint(source if source is not None else src, dst,
                             src_options=src_options, dst_options=dst_options, progress=progress)
    elif source is not None:
        tfio.to_checkpoint(source, dst, dst_options=dst_options, progress=progress)
    elif st.is_safetensors_path(src):
        st.to_checkpoint(src, dst, src_options=src_options, dst_options=dst_options,
                         progress=progress)
    elif fmt == "safetensors":
        st.from_checkpoint(src, dst, src_options=src_options, dst_options=dst_options,
                           progress=progress)
    else:
        opened = open_source(src, src_options)
        if opened.format != "pyckpt":  # DCP directories, Hugging Face folders
            _foreign_to_checkpoint(opened, dst, dst_options, progress)
        else:
            (src_store, src_path), (dst_store, dst_path) = (resolve(src, src_options),
                                                            resolve(dst, dst_options))
            saving.copy(saving.CopyPlan(src_store, src_path, src_options, dst_store, dst_path,
                                        dst_options, progress=progress))


def _foreign_to_checkpoint(src: CheckpointSource, dst: str, dst_options: dict | None,
                           progress: Callable[[int, int], Any] | None) -> None:
    """Another format's checkpoint -> a pyckpt checkpoint: every tensor read (verified
    as that format can), its tree (values kept outside tensors, such as DCP's bytes
    entries) and metadata kept."""
    validate_keys(list(src.keys))  # a foreign checkpoint's names become stored keys
    values = ReadPlan(src, range(len(src.keys))).execute()
    saving.write(saving.SavePlan.build(
        [saving.Item(k, v) for k, v in zip(src.keys, values)], dst, storage_options=dst_options,
        comm=SingleComm(), progress=progress, tree=src.tree, metadata=src.metadata or None))
