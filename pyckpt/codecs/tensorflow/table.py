"""LevelDB-format tables: the container of a TensorBundle's ``.index`` file
(docs/TF_FORMAT.md section 2). A reader of the whole file into sorted
``(key, value)`` pairs, and a writer.

The reader trusts nothing: the footer's magic, every block handle (inside the
file, before the footer, data blocks in file order and never overlapping, so no
block is read twice and no handle can loop), every block's masked CRC-32C,
restart arrays, prefix-compressed keys (the shared prefix never longer than the
previous key) and strictly increasing keys across the whole table. The work
it does is linear in the file size: the keys it rebuilds may total at most
``KEY_BYTES_PER_BYTE`` times the file's size. Every defect raises
CorruptCheckpointError naming the file and the byte range.
"""

from __future__ import annotations

import struct
from typing import Iterable

from ..._native import core as _core
from ...errors import CorruptCheckpointError
from .wire import WireError, read_varint, varint

__all__ = ["TABLE_MAGIC", "FOOTER_SIZE", "read_table", "build_table"]

TABLE_MAGIC = 0xDB4775248B80FB57
FOOTER_SIZE = 48        # two block handles padded to 40 bytes, then the 8-byte magic
TRAILER_SIZE = 5        # compression type (1 byte) + masked CRC-32C (4 bytes)
KEY_BYTES_PER_BYTE = 64  # rebuilt key bytes allowed per byte of file (hostile prefixes)
_NO_COMPRESSION, _SNAPPY = 0, 1


def _masked_crc(data: bytes | memoryview, extra: bytes = b"") -> int:
    crc = _core.crc32c(data)
    if extra:
        crc = _core.crc32c(extra, crc)
    return _core.crc32c_mask(crc)


class _Reader:
    def __init__(self, data: bytes | memoryview, url: str) -> None:
        self.data = memoryview(data)
        self.url = url
        self.key_budget = KEY_BYTES_PER_BYTE * len(data) + (1 << 20)

    def bad(self, what: str, begin: int, end: int) -> CorruptCheckpointError:
        return CorruptCheckpointError(f"TensorFlow index {self.url}, bytes [{begin}, {end}): {what}")

    def handle(self, buf: memoryview, pos: int, end: int, base: int) -> tuple[int, int, int]:
        """A block handle (offset, size) at buf[pos:end]; base: buf's offset in the file."""
        start = pos
        try:
            off, pos = read_varint(buf, pos, end)
            size, pos = read_varint(buf, pos, end)
        except WireError as e:
            raise self.bad(f"bad block handle ({e})", base + start, base + end) from None
        return off, size, pos

    def block(self, off: int, size: int, limit: int, what: str) -> memoryview:
        """The verified contents of the block at [off, off + size) (+ trailer), which
        must end by ``limit``."""
        if off > limit or size > limit - off or TRAILER_SIZE > limit - off - size:
            raise self.bad(f"{what} block handle (offset {off}, size {size}) points past "
                           f"the end of the blocks ({limit})", min(off, limit), limit)
        contents = self.data[off:off + size]
        ctype = self.data[off + size]
        stored = int.from_bytes(self.data[off + size + 1:off + size + 5], "little")
        actual = _masked_crc(contents, bytes([ctype]))
        if stored != actual:
            raise self.bad(f"{what} block checksum mismatch (stored 0x{stored:08x}, computed "
                           f"0x{actual:08x})", off, off + size + TRAILER_SIZE)
        if ctype == _SNAPPY:
            raise self.bad(f"{what} block is snappy-compressed, which this reader does not "
                           "support (TensorFlow writes bundle indexes uncompressed)",
                           off, off + size)
        if ctype != _NO_COMPRESSION:
            raise self.bad(f"{what} block has unknown compression type {ctype}", off, off + size)
        return contents

    def entries(self, contents: memoryview, base: int, prev: bytes | None,
                out: list[tuple[bytes, int, int]]) -> bytes | None:
        """Appends the block's (key, value begin, value end) to out (offsets in the
        file); keys must keep increasing from ``prev`` (None: no key yet). Returns
        the last key."""
        n = len(contents)
        if n < 4:
            raise self.bad("block too short for its restart count", base, base + n)
        (nrestarts,) = struct.unpack_from("<I", contents, n - 4)
        if nrestarts < 1 or nrestarts > (n - 4) // 4:
            raise self.bad(f"block claims {nrestarts} restart points", base, base + n)
        limit = n - 4 - 4 * nrestarts
        restarts = struct.unpack_from(f"<{nrestarts}I", contents, limit)
        pos, last, first, key = 0, -1, True, b""
        expected_restart = 0
        while pos < limit:
            start = pos
            try:
                shared, pos = read_varint(contents, pos, limit)
                unshared, pos = read_varint(contents, pos, limit)
                vlen, pos = read_varint(contents, pos, limit)
            except WireError as e:
                raise self.bad(f"bad entry header ({e})", base + start, base + limit) from None
            if unshared > limit - pos or vlen > limit - pos - unshared:
                raise self.bad(f"entry of {unshared} key and {vlen} value bytes runs past the "
                               "block's entries", base + start, base + limit)
            if first and shared:
                raise self.bad("first entry of a block shares a prefix", base + start, base + pos)
            if shared > len(key):
                raise self.bad(f"entry shares {shared} bytes with a key of {len(key)}",
                               base + start, base + pos)
            self.key_budget -= shared + unshared
            if self.key_budget < 0:
                raise self.bad("the keys' shared prefixes rebuild far more key bytes than the "
                               "file holds (a hostile table)", base + start, base + pos)
            # restart points: entries that share nothing, at the offsets listed in order
            if expected_restart < nrestarts and restarts[expected_restart] < start:
                raise self.bad(f"restart point {restarts[expected_restart]} is not at an entry",
                               base + limit, base + n)
            if expected_restart < nrestarts and restarts[expected_restart] == start:
                if shared:
                    raise self.bad("an entry at a restart point shares a prefix",
                                   base + start, base + pos)
                expected_restart += 1
            new = bytes(key[:shared]) + bytes(contents[pos:pos + unshared])
            if prev is not None and new <= prev:
                raise self.bad(f"key {new[:80]!r} does not sort after {prev[:80]!r} (keys must "
                               "strictly increase)", base + start, base + pos + unshared)
            pos += unshared
            out.append((new, base + pos, base + pos + vlen))
            pos += vlen
            key = prev = new
            first, last = False, start
        if expected_restart != nrestarts and not (last < 0 and restarts == (0,)):
            raise self.bad("restart points lie outside the block's entries", base + limit, base + n)
        return prev


def read_table(data: bytes | memoryview, url: str) -> list[tuple[bytes, int, int]]:
    """Every ``(key, begin, end)`` of the table in ``data`` (a whole ``.index``
    file), in key order: the value of ``key`` is ``data[begin:end]``."""
    r = _Reader(data, url)
    size = len(r.data)
    if size < FOOTER_SIZE:
        raise r.bad(f"file of {size} bytes is shorter than a table footer", 0, size)
    fstart = size - FOOTER_SIZE
    (magic,) = struct.unpack_from("<Q", r.data, size - 8)
    if magic != TABLE_MAGIC:
        raise r.bad(f"bad table magic 0x{magic:016x} (not a TensorFlow index file?)",
                    size - 8, size)
    footer = r.data[fstart:size - 8]
    meta_off, meta_size, pos = r.handle(footer, 0, 40, fstart)
    index_off, index_size, _ = r.handle(footer, pos, 40, fstart)
    r.block(meta_off, meta_size, fstart, "metaindex")
    index = r.block(index_off, index_size, fstart, "index")
    handles: list[tuple[bytes, int, int]] = []
    r.entries(index, index_off, None, handles)
    out: list[tuple[bytes, int, int]] = []
    prev: bytes | None = None
    block_end = 0
    data_limit = min(index_off, meta_off) if meta_size or index_size else fstart
    for sep, vbegin, vend in handles:
        off, bsize, _ = r.handle(r.data, vbegin, vend, 0)
        if off < block_end:
            raise r.bad(f"data block at {off} overlaps the previous one (ending at "
                        f"{block_end}): blocks must follow each other", off, block_end)
        contents = r.block(off, bsize, data_limit, "data")
        block_end = off + bsize + TRAILER_SIZE
        prev = r.entries(contents, off, prev, out)
        if prev is not None and prev > sep:
            raise r.bad(f"data block's last key {prev[:80]!r} sorts after its index key "
                        f"{sep[:80]!r}", off, block_end)
    return out


# -- writing ---------------------------------------------------------------------------

class _BlockBuilder:
    def __init__(self, restart_interval: int) -> None:
        self.interval = restart_interval
        self.buf = bytearray()
        self.restarts = [0]
        self.count = 0
        self.last = b""

    def add(self, key: bytes, value: bytes) -> None:
        shared = 0
        if self.count < self.interval:
            n = min(len(key), len(self.last))
            while shared < n and key[shared] == self.last[shared]:
                shared += 1
        else:
            self.restarts.append(len(self.buf))
            self.count = 0
        self.buf += varint(shared) + varint(len(key) - shared) + varint(len(value))
        self.buf += key[shared:] + value
        self.last = key
        self.count += 1

    def size(self) -> int:
        return len(self.buf) + 4 * len(self.restarts) + 4

    def finish(self) -> bytes:
        return bytes(self.buf) + struct.pack(f"<{len(self.restarts)}I", *self.restarts) + \
            struct.pack("<I", len(self.restarts))


def _with_trailer(contents: bytes) -> bytes:
    return contents + bytes([_NO_COMPRESSION]) + struct.pack(
        "<I", _masked_crc(contents, bytes([_NO_COMPRESSION])))


def build_table(entries: Iterable[tuple[bytes, bytes]], block_size: int = 4096,
                restart_interval: int = 16) -> bytes:
    """A table holding ``entries`` (keys strictly increasing): data blocks of about
    ``block_size`` bytes, an empty metaindex block, the index block, the footer."""
    out = bytearray()
    index = _BlockBuilder(1)
    block = _BlockBuilder(restart_interval)
    prev: bytes | None = None

    def flush() -> None:
        nonlocal block
        offset = len(out)
        contents = block.finish()
        out.extend(_with_trailer(contents))
        index.add(block.last, varint(offset) + varint(len(contents)))
        block = _BlockBuilder(restart_interval)

    for key, value in entries:
        if prev is not None and key <= prev:
            raise ValueError(f"table keys must strictly increase: {key!r} after {prev!r}")
        prev = key
        block.add(key, value)
        if block.size() >= block_size:
            flush()
    if block.count:
        flush()
    meta_off = len(out)
    meta = _BlockBuilder(restart_interval).finish()
    out.extend(_with_trailer(meta))
    index_off = len(out)
    index_contents = index.finish()
    out.extend(_with_trailer(index_contents))
    handles = varint(meta_off) + varint(len(meta)) + varint(index_off) + varint(len(index_contents))
    out.extend(handles + bytes(40 - len(handles)) + struct.pack("<Q", TABLE_MAGIC))
    return bytes(out)
