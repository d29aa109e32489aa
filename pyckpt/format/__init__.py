"""The on-disk format (docs/FORMAT.md): the index file and the manifest it holds."""

from .index import INDEX_NAME, decode_index, encode_index
from .manifest import FORMAT_VERSION, Block, FileEntry, Manifest, TensorEntry, build_manifest

__all__ = ["INDEX_NAME", "decode_index", "encode_index", "Manifest", "TensorEntry", "Block",
           "FileEntry", "FORMAT_VERSION", "build_manifest"]
