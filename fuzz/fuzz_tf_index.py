"""atheris fuzz target for the TensorFlow checkpoint parsers (docs/TF_FORMAT.md).

Four modes, chosen by the first input byte:
  - index: arbitrary bytes -> a TensorBundle ``.index`` (LevelDB table, header and
    entry protos, column validation); an index that opens is then read, every
    entry, against a data file of zeros, which proves validated ranges never make
    a read go out of bounds (checksum mismatches are the expected outcome);
  - strings: the rest as one string tensor's stored bytes (and as a variant's);
  - graph: the rest as a TrackableObjectGraph, mapped to pyckpt's stored graph;
  - state: the rest as TensorFlow's text ``checkpoint`` state file.
The only acceptable exceptions are pyckpt's CheckpointError (and the codec's
WireError, a ValueError, for the bare decoders).

Run:  python fuzz/fuzz_tf_index.py fuzz/corpus_tf -max_total_time=600
Seed corpus:  python fuzz/fuzz_tf_index.py --make-corpus fuzz/corpus_tf
(the indexes of tests/interop_tf/fixtures, prefixed with the mode byte 0).
"""

import os
import sys
import tempfile

import atheris

from pyckpt.errors import CheckpointError, CorruptCheckpointError
from pyckpt.format import tf_state
from pyckpt.interop.tensorflow import TensorFlowCheckpoint
from pyckpt.interop.tensorflow import messages, object_graph, strings
from pyckpt.interop.tensorflow.wire import WireError
from pyckpt.storage import resolve

_DIR = tempfile.mkdtemp(prefix="pyckpt-fuzz-tf-")
_STORE, _PREFIX = resolve(os.path.join(_DIR, "x"))
_ZEROS = 1 << 16


def _data_files(num_shards: int) -> None:
    for shard in range(min(num_shards, 4)):
        path = os.path.join(_DIR, f"x.data-{shard:05d}-of-{num_shards:05d}")
        if not os.path.exists(path):
            with open(path, "wb") as f:
                f.write(bytes(_ZEROS))


def _index(body: bytes) -> None:
    ck = TensorFlowCheckpoint.from_index_bytes(_STORE, _PREFIX, body)
    _data_files(ck.num_shards)
    for i in range(len(ck.keys)):
        try:
            ck.read_new([i])
        except CheckpointError:
            pass
    try:
        ck.graph
    except CheckpointError:
        pass


def test_one_input(data: bytes) -> None:
    if not data:
        return
    mode, body = data[0] % 4, data[1:]
    try:
        if mode == 0:
            _index(body)
        elif mode == 1:
            count = body[0] if body else 0
            try:
                strings.decode_strings(body[1:], count)
            except WireError:
                pass
            try:
                strings.check_variants(body[1:], count)
            except WireError:
                pass
        elif mode == 2:
            try:
                nodes = messages.decode_object_graph(body)
            except WireError:
                return
            object_graph.to_pyckpt_graph(nodes, {"k": 0}, CorruptCheckpointError)
        else:
            tf_state.parse_state(body)
    except CheckpointError:
        pass


def make_corpus(out: str) -> None:
    fixtures = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests",
                            "interop_tf", "fixtures")
    os.makedirs(out, exist_ok=True)
    n = 0
    for root, _, files in os.walk(fixtures):
        for name in files:
            if name.endswith(".index") or name == "checkpoint":
                with open(os.path.join(root, name), "rb") as f:
                    mode = b"\x00" if name.endswith(".index") else b"\x03"
                    with open(os.path.join(out, f"seed-{n:03d}"), "wb") as g:
                        g.write(mode + f.read())
                n += 1
    print(f"wrote {n} seeds to {out}")


def main() -> None:
    if len(sys.argv) == 3 and sys.argv[1] == "--make-corpus":
        make_corpus(sys.argv[2])
        return
    # instrument_all, not instrument_imports: an editable install's import hook hides
    # pyckpt's modules from atheris' loader override (no coverage feedback otherwise)
    atheris.instrument_all()
    atheris.Setup(sys.argv, test_one_input)
    atheris.Fuzz()


if __name__ == "__main__":
    main()
