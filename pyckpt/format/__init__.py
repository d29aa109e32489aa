"""The on-disk format (docs/FORMAT.md): file names, the index file, the manifest."""

from .index import INDEX_NAME, decode_index, encode_index
from .manifest import Manifest, TensorEntry, Block, FORMAT_VERSION

__all__ = ["INDEX_NAME", "decode_index", "encode_index", "Manifest", "TensorEntry", "Block",
           "FORMAT_VERSION"]
