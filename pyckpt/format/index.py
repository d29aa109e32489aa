"""The index file: the commit record of a checkpoint (docs/FORMAT.md, "Index file").

Layout (all integers little-endian)::

    0   8  magic            b"PYCKPTIX"
    8   4  u32 version      format major version (1; 2 with references to other
                            checkpoints' files, docs/FORMAT.md section 12)
    12  4  u32 flags        0
    16  8  u64 length L     manifest length in bytes
    24  4  u32 body crc     masked CRC32C of the manifest bytes
    28  4  u32 header crc   masked CRC32C of bytes [0, 28)
    32  L  manifest         UTF-8 JSON (see manifest.py)
    32+L 8 end magic        b"PYCKEND\\n"

The file is written under a temporary name, synced and renamed (or PUT in one
request on object stores), so it either exists whole or not at all.
"""

from __future__ import annotations

import json
import struct

from .._native import core as _core
from ..errors import CorruptCheckpointError
from .manifest import FORMAT_VERSION, Manifest

INDEX_NAME = "pyckpt.index"
MAGIC = b"PYCKPTIX"
END_MAGIC = b"PYCKEND\n"
HEADER = struct.Struct("<8sIIQII")
HEADER_SIZE = HEADER.size  # 32
MAX_MANIFEST_BYTES = 1 << 30
SUPPORTED_VERSION = FORMAT_VERSION  # 2: an older pyckpt refuses what it cannot read


def _mask(data: bytes | memoryview) -> int:
    return _core.crc32c_mask(_core.crc32c(data))


def encode_index(manifest: Manifest) -> bytes:
    """The bytes of the index file holding ``manifest`` (layout above)."""
    body = json.dumps(manifest.to_json(), separators=(",", ":"), ensure_ascii=False,
                      allow_nan=False).encode("utf-8")
    head = struct.pack("<8sIIQI", MAGIC, manifest.version, 0, len(body), _mask(body))
    return head + struct.pack("<I", _mask(head)) + body + END_MAGIC


def decode_index(data: bytes, name: str = "<index>") -> Manifest:
    """Parses and validates an index file; any defect raises CorruptCheckpointError."""
    def bad(what: str, begin: int, end: int) -> CorruptCheckpointError:
        return CorruptCheckpointError(f"index file '{name}', bytes [{begin}, {end}): {what}")

    if len(data) < HEADER_SIZE + len(END_MAGIC):
        raise bad(f"too short to be an index ({len(data)} bytes)", 0, len(data))
    magic, version, flags, length, body_crc, head_crc = HEADER.unpack_from(data, 0)
    if magic != MAGIC:
        raise bad("not a pyckpt index (bad magic)", 0, 8)
    if _mask(data[:28]) != head_crc:
        raise bad("header checksum mismatch", 0, HEADER_SIZE)
    if version > SUPPORTED_VERSION:
        raise bad(f"format version {version} is newer than this pyckpt supports "
                  f"({SUPPORTED_VERSION}); upgrade pyckpt", 8, 12)
    if version < 1 or flags != 0:
        raise bad(f"unsupported version {version} / flags {flags}", 8, 16)
    if length > MAX_MANIFEST_BYTES or HEADER_SIZE + length + len(END_MAGIC) != len(data):
        raise bad(f"manifest length {length} does not match the file size {len(data)}",
                  16, 24)
    end = HEADER_SIZE + length
    if data[end:] != END_MAGIC:
        raise bad("missing end marker (truncated or overwritten)", end, len(data))
    body = memoryview(data)[HEADER_SIZE:end]  # no copy of a manifest that may be large
    if _mask(body) != body_crc:
        raise bad("manifest checksum mismatch", HEADER_SIZE, end)
    try:
        text = str(body, "utf-8")
    except UnicodeDecodeError as e:
        raise bad(f"manifest is not valid JSON: {e}", HEADER_SIZE, end) from None
    body.release()

    def invalid(what: str) -> CorruptCheckpointError:
        return bad(what, HEADER_SIZE, end)

    try:  # parsed and validated member by member: see Manifest.from_text
        manifest = Manifest.from_text(text, invalid)
    except CorruptCheckpointError:
        raise
    except (ValueError, RecursionError) as e:  # JSONDecodeError, an over-long integer...
        raise bad(f"manifest is not valid JSON: {e}", HEADER_SIZE, end) from None
    if manifest.version > version:  # an older reader would have read it without them
        raise bad(f"the manifest references other checkpoints' files but the header says "
                  f"format version {version}", 8, 12)
    return manifest
