"""Scale and hostile inputs of the openers (issue 37, item 2): index and ``.metadata``
files that once took time quadratic in their size to open, and legitimate layouts of
many blocks. Each must open, or be refused with CorruptCheckpointError, in time
about linear in its size.

Used by tests (tests/format/test_partition_scale.py, tests/interop_dcp/
test_hostile_scale.py, generous bounds) and benchmarks/bench_open_scale.py (the
figures). Run directly as a regression check, every case once:

    python fuzz/hostile_open.py [--scale 1.0] [--per-mb 5]   # exit status 1: a case was slow

The DCP cases built from torch's own classes need torch (skipped without it); the
hand-written pickles do not.
"""

from __future__ import annotations

import argparse
import io
import math
import pickle
import struct
import sys
import time
from typing import Callable

import numpy as np

from pyckpt.errors import CorruptCheckpointError
from pyckpt.format import decode_index, encode_index
from pyckpt.format.manifest import build_manifest
from pyckpt.format.records import FileEntry

# -- pyckpt indexes -------------------------------------------------------------------------


def index_of_boxes(shapes: list[tuple[int, ...]], boxes: list[list[tuple[tuple[int, ...],
                   tuple[int, ...]]]], itemsize: int = 4) -> bytes:
    """The index bytes of float32 tensors ``t0, t1, ...`` of ``shapes``, tensor i stored
    as the blocks ``boxes[i]`` (offsets, shape), back to back in one data file."""
    nblocks = np.array([len(b) for b in boxes], dtype=np.int64)
    flat = [b for bs in boxes for b in bs]
    nbytes = np.array([math.prod(s) * itemsize for _, s in flat], dtype=np.int64)
    offset = np.zeros(len(flat), dtype=np.int64)
    np.cumsum(nbytes[:-1], out=offset[1:])
    chunk = 1 << 20
    nchunks = int((-(-nbytes // chunk)).sum())
    keys = [f"t{i}" for i in range(len(shapes))]
    m = build_manifest(chunk_size=chunk, files=[FileEntry("data-0", int(nbytes.sum()))],
                       keys=keys, dtype_names=["float32"] * len(keys), shapes=shapes,
                       file=np.zeros(len(flat), np.int64), offset=offset, nbytes=nbytes,
                       crcs=np.zeros(nchunks, np.uint32), nblocks=nblocks,
                       box=[[list(o), list(s)] for o, s in flat],
                       tree={"d": [[k, k] for k in keys]})
    return encode_index(m)


def columns(blocks: int, rows: int = 2) -> list[tuple[tuple[int, ...], tuple[int, ...]]]:
    """``blocks`` boxes splitting a (rows, blocks) tensor by columns (dimension 1)."""
    return [((0, j), (rows, 1)) for j in range(blocks)]


def index_columns(tensors: int, blocks: int, rows: int = 2) -> bytes:
    """``tensors`` tensors of ``blocks`` column blocks each (1,024 ranks x 20 tensors,
    each sharded on its second dimension: the legitimate case of the issue)."""
    return index_of_boxes([(rows, blocks)] * tensors, [columns(blocks, rows)] * tensors)


def index_sized(nbytes: int) -> bytes:
    """One column-sharded tensor with as many blocks as make an index of about ``nbytes``
    (the hostile 300 KB index: its blocks all start at row 0)."""
    per_block = len(index_columns(1, 2000, 1)) / 2000
    return index_columns(1, max(2, int(nbytes / per_block)), 1)


def irregular_boxes(dims: int, n: int, seed: int = 0) -> tuple[tuple[int, ...], list]:
    """A random guillotine partition of a (2**20,) * dims tensor into about ``n`` boxes: a
    tiling whose corners rarely cancel (the general, irregular case)."""
    rng = np.random.default_rng(seed)
    shape = (1 << 20,) * dims
    boxes = [((0,) * dims, shape)]
    for _ in range(n - 1):
        i = int(rng.integers(len(boxes)))
        o, s = boxes[i]
        k = int(rng.integers(dims))
        if s[k] < 2:
            continue
        cut = int(rng.integers(1, s[k]))
        a = (o, s[:k] + (cut,) + s[k + 1:])
        b = (o[:k] + (o[k] + cut,) + o[k + 1:], s[:k] + (s[k] - cut,) + s[k + 1:])
        boxes[i] = a
        boxes.append(b)
    return shape, boxes


# -- DCP .metadata --------------------------------------------------------------------------


def dcp_metadata(tensors: dict[str, tuple[tuple[int, ...], list]],
                 bytes_entries: dict[str, tuple[str, int, int]] | None = None,
                 storage: Callable[[str, int], tuple[str, int, int]] | None = None) -> bytes:
    """A ``.metadata`` pickled from torch's own classes: ``tensors``: {key: (shape,
    [(offsets, sizes), ...])}, float32; each chunk's item is 100 bytes past the last
    unless ``storage(key, n)`` gives (file, offset, length); ``bytes_entries``: {key:
    (file, offset, length)}."""
    import torch
    from torch.distributed.checkpoint.filesystem import _StorageInfo
    from torch.distributed.checkpoint.metadata import (BytesStorageMetadata,
                                                       ChunkStorageMetadata, Metadata,
                                                       MetadataIndex, TensorProperties,
                                                       TensorStorageMetadata)
    sdm: dict = {}
    records: dict = {}
    at = 0
    for key, (f, off, n) in (bytes_entries or {}).items():
        records[MetadataIndex(key)] = _StorageInfo(f, off, n)
        sdm[key] = BytesStorageMetadata()
    for key, (shape, chunks) in tensors.items():
        metas = []
        for n, (offsets, sizes) in enumerate(chunks):
            where = storage(key, n) if storage else ("__0_0.distcp", at, 100 + 4 * math.prod(sizes))
            at = max(at, where[1] + where[2])
            records[MetadataIndex(key, offsets)] = _StorageInfo(*where)
            metas.append(ChunkStorageMetadata(torch.Size(offsets), torch.Size(sizes)))
        sdm[key] = TensorStorageMetadata(TensorProperties(dtype=torch.float32),
                                         torch.Size(shape), metas)
    buf = io.BytesIO()
    pickle.dump(Metadata(sdm, storage_data=records, version="1.0.0"), buf)
    return buf.getvalue()


def dcp_columns(tensors: int, chunks: int, rows: int = 2) -> bytes:
    """``tensors`` tensors of ``chunks`` column chunks each (torch)."""
    return dcp_metadata({f"model.layer{i}.w": ((rows, chunks), columns(chunks, rows))
                         for i in range(tensors)})


def dcp_sized(nbytes: int) -> bytes:
    """One column-sharded tensor with as many chunks as make about ``nbytes`` (torch):
    the hostile 1 MB ``.metadata``."""
    per_chunk = len(dcp_columns(1, 1000, 1)) / 1000
    return dcp_columns(1, max(2, int(nbytes / per_chunk)), 1)


class Pickler:
    """A tiny pickle assembler for hand-made hostile pickles (protocol 4 opcodes)."""

    def __init__(self) -> None:
        self.out = bytearray(b"\x80\x04")
        self.memos = 0

    def op(self, code: bytes) -> "Pickler":
        self.out += code
        return self

    def memo(self) -> int:
        self.out += b"\x94"
        self.memos += 1
        return self.memos - 1

    def define(self, push: Callable[[], object]) -> int:
        """Runs ``push`` (which pushes one value), memoizes the value and pops it."""
        push()
        i = self.memo()
        self.out += b"0"
        return i

    def get(self, i: int) -> "Pickler":
        return self.op(b"h" + bytes([i]) if i < 256 else b"j" + struct.pack("<I", i))

    def num(self, v: int) -> "Pickler":
        return self.op(b"K" + bytes([v]) if 0 <= v < 256 else b"J" + struct.pack("<i", v))

    def text(self, s: str) -> "Pickler":
        raw = s.encode()
        return self.op(b"X" + struct.pack("<I", len(raw)) + raw)

    def glob(self, module: str, name: str) -> "Pickler":
        return self.op(b"c" + f"{module}\n{name}\n".encode())

    def done(self) -> bytes:
        return bytes(self.out + b".")


_M = "torch.distributed.checkpoint.metadata"


def wide_key(nbytes: int) -> bytes:
    """A wide tuple of 256-byte integers used again and again as a dict key (hashing it
    each time was quadratic): the hostile 128 KB pickle of the issue."""
    p = Pickler()
    p.op(b"\x8a\xff" + b"\x7f" * 255)
    big = p.memo()
    p.op(b"(")
    for _ in range(nbytes // 4):
        p.get(big)
    p.op(b"t")
    key = p.memo()
    p.op(b"}(")
    while len(p.out) < nbytes:
        p.get(key).num(1)
    return p.op(b"u").done()


def equal_keys(nbytes: int) -> bytes:
    """Two equal long strings (different objects), the second set as a key of a dict
    holding the first again and again (comparing them each time was quadratic)."""
    p = Pickler()
    text = "k" * (nbytes // 3)
    p.text(text)
    a = p.memo()
    p.text(text)
    b = p.memo()
    p.op(b"}").get(a).num(0).op(b"s(")
    while len(p.out) < nbytes:
        p.get(b).num(1)
    return p.op(b"u").done()


def size_calls(nbytes: int) -> bytes:
    """``torch.Size`` called again and again on one wide list (each call copied it)."""
    p = Pickler()
    p.glob("torch", "Size")
    size = p.memo()
    p.op(b"]" + b"(" + b"K\x01" * (nbytes // 4) + b"e\x85")
    args = p.memo()
    p.op(b"N")
    while len(p.out) < nbytes:
        p.op(b"0").get(size).get(args).op(b"R")
    return p.done()


def path_calls(nbytes: int) -> bytes:
    """``pathlib.PosixPath`` joining a wide tuple of one long string, again and again
    (each call built a string of width x length)."""
    p = Pickler()
    p.glob("pathlib", "PosixPath")
    fn = p.memo()
    p.text("p" * (nbytes // 4))
    part = p.memo()
    p.op(b"(")
    for _ in range(nbytes // 8):
        p.get(part)
    p.op(b"t")
    args = p.memo()
    p.op(b"N")
    while len(p.out) < nbytes:
        p.op(b"0").get(fn).get(args).op(b"R")
    return p.done()


def nested_message(levels: int = 24) -> bytes:
    """A tuple of 8 references to a tuple of 8 references ... ``levels`` deep, given to
    a call that refuses it: rendering it for the message took 8**levels steps."""
    p = Pickler()
    p.num(0)
    for _ in range(levels):
        i = p.memo()
        p.op(b"(")
        for _ in range(8):
            p.get(i)
        p.op(b"t")
    args = p.memo()
    p.op(b"0").glob("torch", "Size").get(args).op(b"R")
    return p.done()


class _Records:
    """Hand-made DCP metadata records (the classes memoized once, strings too)."""

    def __init__(self) -> None:
        self.p = p = Pickler()
        self.cls = {n: p.define(lambda n=n: p.glob(_M, n)) for n in (
            "Metadata", "MetadataIndex", "ChunkStorageMetadata", "TensorStorageMetadata",
            "TensorProperties")}
        self.cls["_StorageInfo"] = p.define(
            lambda: p.glob("torch.distributed.checkpoint.filesystem", "_StorageInfo"))
        size = p.define(lambda: p.glob("torch", "Size"))
        self.zero = p.define(lambda: p.get(size).op(b"K\x00\x85\x85R"))
        self.one = p.define(lambda: p.get(size).op(b"K\x01\x85\x85R"))
        self.props = p.define(lambda: self.obj("TensorProperties", lambda: (
            p.op(b"(").glob("torch", "float32").glob("torch", "strided").op(b"\x89N\x89t"))))
        self.s = {n: p.define(lambda n=n: p.text(n)) for n in (
            "fqn", "offset", "index", "offsets", "sizes", "properties", "size", "chunks",
            "relative_path", "length", "__0_0.distcp", "state_dict_metadata", "storage_data")}

    def obj(self, cls: str, state: Callable[[], object]) -> None:
        """Pushes a record of ``cls`` (NEWOBJ, no arguments) whose state ``state()`` pushes."""
        self.p.get(self.cls[cls]).op(b")\x81")
        state()
        self.p.op(b"b")

    def fields(self, **values: Callable[[], object]) -> None:
        """Pushes a dict of the memoized field names to what each callable pushes."""
        self.p.op(b"}(")
        for name, push in values.items():
            self.p.get(self.s[name])
            push()
        self.p.op(b"u")

    def storage_info(self, offset: int) -> None:
        p = self.p
        self.obj("_StorageInfo", lambda: self.fields(
            relative_path=lambda: p.get(self.s["__0_0.distcp"]),
            offset=lambda: p.op(b"J" + struct.pack("<i", offset)), length=lambda: p.num(100)))

    def metadata(self, sdm: Callable[[], object], storage: Callable[[], object]) -> bytes:
        self.obj("Metadata", lambda: self.fields(state_dict_metadata=sdm, storage_data=storage))
        return self.p.done()


def shared_chunks(nbytes: int) -> bytes:
    """Many tensors sharing one tensor record whose chunk list names one chunk again and
    again: each tensor walked the whole list (quadratic)."""
    r = _Records()
    p = r.p
    chunk = p.define(lambda: r.obj("ChunkStorageMetadata", lambda: r.fields(
        offsets=lambda: p.get(r.zero), sizes=lambda: p.get(r.one))))
    p.op(b"](")
    for _ in range(nbytes // 4):
        p.get(chunk)
    p.op(b"e")
    chunks = p.memo()
    p.op(b"0")
    tensor = p.define(lambda: r.obj("TensorStorageMetadata", lambda: r.fields(
        properties=lambda: p.get(r.props), size=lambda: p.get(r.one),
        chunks=lambda: p.get(chunks))))
    keys = max(2, (nbytes - len(p.out)) // 110)

    def sdm() -> None:
        p.op(b"}(")
        for i in range(keys):
            p.text(f"k{i}").get(tensor)
        p.op(b"u")

    def storage() -> None:
        p.op(b"}(")
        for i in range(keys):
            r.obj("MetadataIndex", lambda i=i: r.fields(
                fqn=lambda: p.text(f"k{i}"), offset=lambda: p.get(r.zero),
                index=lambda: p.op(b"N")))
            r.storage_info(100 * i)
        p.op(b"u")

    return r.metadata(sdm, storage)


def shared_state(nbytes: int) -> bytes:
    """Storage records sharing one state dict of many fields: each record's fields were
    all checked again (quadratic)."""
    r = _Records()
    p = r.p
    wide = nbytes // 2 // 10

    def state() -> None:
        p.op(b"}(").get(r.s["fqn"]).text("w").get(r.s["offset"]).get(r.zero)
        for i in range(wide):
            p.text(f"x{i}").op(b"N")
        p.op(b"u")

    st = p.define(state)
    info = p.define(lambda: r.storage_info(0))

    def storage() -> None:
        p.op(b"}(")
        while len(p.out) < nbytes:
            p.get(r.cls["MetadataIndex"]).op(b")\x81").get(st).op(b"b").get(info)
        p.op(b"u")

    return r.metadata(lambda: p.op(b"}"), storage)


def long_name(nbytes: int) -> bytes:
    """Storage records sharing one very long fqn: each record's description repeated it
    (quadratic)."""
    r = _Records()
    p = r.p
    name = p.define(lambda: p.text("n" * (nbytes // 2)))
    info = p.define(lambda: r.storage_info(0))

    def storage() -> None:
        p.op(b"}(")
        while len(p.out) < nbytes:
            r.obj("MetadataIndex", lambda: r.fields(fqn=lambda: p.get(name),
                                                    offset=lambda: p.get(r.zero)))
            p.get(info)
        p.op(b"u")

    return r.metadata(lambda: p.op(b"}"), storage)


# -- running them ---------------------------------------------------------------------------

#: (name, legitimate?, builder(scale) -> bytes, kind: "index" or "dcp", needs torch?)
CASES: list[tuple[str, bool, Callable[[float], bytes], str, bool]] = [
    ("index: 1,024 blocks x 20 tensors (columns)", True,
     lambda s: index_columns(20, int(1024 * s)), "index", False),
    ("index: 200,000 blocks of one tensor", True,
     lambda s: index_columns(1, int(200_000 * s)), "index", False),
    ("index: 300 KB hostile (columns)", False,
     lambda s: index_sized(int(300_000 * s)), "index", False),
    ("dcp: 1,024 chunks x 20 tensors (columns)", True,
     lambda s: dcp_columns(20, int(1024 * s)), "dcp", True),
    ("dcp: 200,000 chunks of one tensor", True,
     lambda s: dcp_columns(1, int(200_000 * s)), "dcp", True),
    ("dcp: 1 MB hostile (columns)", False,
     lambda s: dcp_sized(int(1_000_000 * s)), "dcp", True),
    ("dcp: 128 KB wide tuple key", False, lambda s: wide_key(int(128_000 * s)), "dcp", False),
    ("dcp: 1 MB equal string keys", False, lambda s: equal_keys(int(1e6 * s)), "dcp", False),
    ("dcp: 1 MB torch.Size calls", False, lambda s: size_calls(int(1e6 * s)), "dcp", False),
    ("dcp: 1 MB PosixPath calls", False, lambda s: path_calls(int(1e6 * s)), "dcp", False),
    ("dcp: nested tuple in a message", False, lambda s: nested_message(), "dcp", False),
    ("dcp: 1 MB shared chunk list", False, lambda s: shared_chunks(int(1e6 * s)), "dcp", False),
    ("dcp: 1 MB shared record state", False, lambda s: shared_state(int(1e6 * s)), "dcp", False),
    ("dcp: 1 MB long shared fqn", False, lambda s: long_name(int(1e6 * s)), "dcp", False),
]


def open_bytes(kind: str, data: bytes) -> str:
    """Opens ``data`` as a pyckpt index or a DCP ``.metadata``: "opened" or "refused: ..."."""
    from pyckpt.codecs.distcp.metadata import decode_metadata
    try:
        if kind == "index":
            decode_index(data, "pyckpt.index")
        else:
            decode_metadata(data, "/ck/.metadata")
    except CorruptCheckpointError as e:
        return f"refused: {e}"
    return "opened"


def have_torch() -> bool:
    try:
        import torch  # noqa: F401
    except ImportError:
        return False
    return True


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--scale", type=float, default=1.0, help="size factor of every case")
    ap.add_argument("--per-mb", type=float, default=5.0,
                    help="seconds a case may take per MB of input (2 s at least)")
    args = ap.parse_args()
    slow = []
    torch = have_torch()
    for name, _, build, kind, needs_torch in CASES:
        if needs_torch and not torch:
            print(f"{name:40s} skipped (no torch)")
            continue
        data = build(args.scale)
        t = time.perf_counter()
        outcome = open_bytes(kind, data)
        dt = time.perf_counter() - t
        print(f"{name:40s} {len(data) / 1e3:9.0f} KB {dt:8.3f} s  {outcome[:90]}")
        if dt > max(2.0, args.per_mb * len(data) / 1e6):
            slow.append(name)
    if slow:
        print("over the limit:", ", ".join(slow))
    return 1 if slow else 0


if __name__ == "__main__":
    sys.exit(main())
