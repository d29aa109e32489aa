"""The files transformers' ``from_pretrained`` reads beside a Hugging Face folder's
weights (``config.json``, ``generation_config.json``, tokenizer files), for
``export_hf(config=...)``: gathered and checked before any weight file is written.
Files copied from a folder are read as every file pyckpt reads (never through a
link in their place, at most ``MAX_FILE_BYTES`` each); transformers itself is never
imported."""

from __future__ import annotations

import json
import os
from typing import Any

from ..codecs.record_file import read_record_file
from ..errors import CheckpointNotFoundError, CorruptCheckpointError
from ..format.json_scan import loads_untrusted
from ..storage import resolve

__all__ = ["CONFIG_FILE", "FOLDER_FILES", "MAX_FILE_BYTES", "config_files"]

CONFIG_FILE = "config.json"
#: what a config folder gives (those it holds; config.json it must hold)
FOLDER_FILES = (CONFIG_FILE, "generation_config.json", "tokenizer.json",
                "tokenizer_config.json", "special_tokens_map.json", "added_tokens.json",
                "vocab.json", "vocab.txt", "merges.txt", "tokenizer.model", "spiece.model",
                "sentencepiece.bpe.model", "chat_template.jinja", "chat_template.json",
                "preprocessor_config.json", "processor_config.json")
MAX_FILE_BYTES = 256 << 20


def config_files(config: Any, options: dict | None = None) -> dict[str, bytes]:
    """{file name: bytes} to write beside the weights for ``config``: None gives none;
    a dict gives ``config.json``; an object with ``to_json_string()`` or ``to_dict()``
    (a transformers ``PretrainedConfig``) gives ``config.json`` as its
    ``save_pretrained`` writes it; a path or URL (``options``: its storage options) of
    a folder gives those of ``FOLDER_FILES`` it holds, ``config.json`` among them; of
    a file, that file as ``config.json``. A ``config.json`` must be a JSON object."""
    if config is None:
        return {}
    if isinstance(config, (str, os.PathLike)):
        return _from_path(config, options)
    if isinstance(config, dict):
        try:
            text = json.dumps(config, indent=2, sort_keys=True) + "\n"
        except (TypeError, ValueError) as e:
            raise TypeError(f"config is not JSON: {e}") from None
    elif callable(getattr(config, "to_json_string", None)):
        text = config.to_json_string()
    elif callable(getattr(config, "to_dict", None)):
        return config_files(config.to_dict())
    else:
        raise TypeError("config must be a dict, a PretrainedConfig (anything with to_dict()), "
                        f"or the path of a folder or config.json file, not {type(config).__name__}")
    return {CONFIG_FILE: _checked(text.encode(), "config")}


def _from_path(config: Any, options: dict | None) -> dict[str, bytes]:
    store, path = resolve(config, options)
    url = store.url(path)
    if not store.isdir(path):  # a config.json file of any name
        return {CONFIG_FILE: _checked(_read(store, path, url), url)}
    out = {name: _read(store, store.join(path, name), url)
           for name in FOLDER_FILES if store.exists(store.join(path, name))}
    if CONFIG_FILE not in out:
        raise CheckpointNotFoundError(f"the config folder {url} holds no {CONFIG_FILE}")
    _checked(out[CONFIG_FILE], store.url(store.join(path, CONFIG_FILE)))
    return out


def _read(store: Any, path: str, folder_url: str) -> bytes:
    return read_record_file(store, path, MAX_FILE_BYTES, "config file",
                            f"config at {folder_url}")


def _checked(data: bytes, where: str) -> bytes:
    """``data`` when it is a JSON object (CorruptCheckpointError naming ``where``)."""
    try:
        doc = loads_untrusted(data)
    except ValueError as e:
        raise CorruptCheckpointError(f"{where}: {CONFIG_FILE} is not JSON ({e})") from None
    if not isinstance(doc, dict):
        raise CorruptCheckpointError(f"{where}: {CONFIG_FILE} is not a JSON object")
    return data
