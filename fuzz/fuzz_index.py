"""atheris fuzz target for the index parser and manifest validator.

Two modes, chosen by the first input byte:
  - frame: arbitrary bytes -> decode_index (magic, header, checksums, JSON);
  - manifest: the rest of the input as JSON text -> Manifest.from_json, bypassing
    the checksums so mutations reach the validator; a manifest that validates is
    then read through the C++ reader against zero-filled in-memory files, which
    proves validated ranges never make the core read out of bounds.
The only acceptable exception is CorruptCheckpointError (plus the reader's own
checksum mismatches for the zero-filled files).

Run:  python fuzz/fuzz_index.py fuzz/corpus -max_total_time=600
"""

import json
import sys

import atheris

with atheris.instrument_imports():
    import numpy as np

    from pyckpt import _core
    from pyckpt.errors import CorruptCheckpointError
    from pyckpt.format import decode_index
    from pyckpt.format.manifest import Manifest


def _bad(what):
    return CorruptCheckpointError(what)


def _read_against_zeros(m: Manifest) -> None:
    if sum(f.size for f in m.files) > (1 << 20) or not m.all_plain:
        return
    buffers = [np.zeros(f.size, dtype=np.uint8) for f in m.files]
    b = m.blocks
    n = len(m.keys)
    j = b.tensor_begin[:n]
    crc_begin = b.crc_begin[j.tolist() + [len(b.nbytes)]].astype(np.uint64) if n else np.zeros(1, np.uint64)
    try:
        _core.read_shards(names=[f.name for f in m.files], buffers=buffers,
                          bases=[0] * len(buffers), keys=list(m.keys),
                          sources=b.file[j].astype(np.uint32), offsets=b.offset[j],
                          nbytes=b.nbytes[j], crcs=b.crcs, crc_begin=crc_begin, dsts=[None] * n,
                          options=_core.ReadOptions(chunk_size=m.chunk_size, threads=1))
    except CorruptCheckpointError:
        pass


def test_one_input(data: bytes) -> None:
    if not data:
        return
    mode, body = data[0] % 2, data[1:]
    try:
        if mode == 0:
            decode_index(body, "fuzz")
        else:
            try:
                doc = json.loads(body.decode("utf-8"))
            except (UnicodeDecodeError, ValueError, RecursionError):
                return
            m = Manifest.from_json(doc, _bad)
            _read_against_zeros(m)
    except CorruptCheckpointError:
        pass


def main() -> None:
    atheris.Setup(sys.argv, test_one_input)
    atheris.Fuzz()


if __name__ == "__main__":
    main()
