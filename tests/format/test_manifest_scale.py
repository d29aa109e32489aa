"""Issue 10, weaker spot: opening a manifest of very many tensors costs a bounded,
small amount of memory per tensor (docs/FORMAT.md, "Limits").

A validated manifest keeps its keys as strings and everything else in numpy
columns; the tree, the graph and the key -> index dict are built when first used.
Memory is measured with tracemalloc (numpy reports its buffers to it too).
"""

from __future__ import annotations

import gc
import sys
import tracemalloc

import numpy as np

from pyckpt.format import decode_index, encode_index
from pyckpt.format.manifest import build_manifest

N = 50_000


def _index_bytes(n: int = N) -> tuple[bytes, list[str]]:
    keys = [f"layers/{i // 1000}/t{i % 1000}" for i in range(n)]
    m = build_manifest(chunk_size=1 << 20, files=[], keys=keys, dtype_names=["float32"] * n,
                       shapes=[(0,)] * n, file=np.zeros(n, np.int64),
                       offset=np.zeros(n, np.int64), nbytes=np.zeros(n, np.int64),
                       crcs=np.zeros(0, np.uint32),
                       tree={"d": [["layers", {"l": [{"d": [[f"t{j}", f"layers/{i}/t{j}"]
                                                            for j in range(1000)]}
                                                     for i in range(n // 1000)]}]]})
    return encode_index(m), keys


def test_memory_per_tensor_is_small_and_bounded():
    data, keys = _index_bytes()
    key_bytes = sum(sys.getsizeof(k) + 8 for k in keys) / N  # the keys are kept as strings
    del keys
    gc.collect()
    tracemalloc.start()
    try:
        base = tracemalloc.get_traced_memory()[0]
        m = decode_index(data, "big.index")
        current, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    retained = (current - base) / N - key_bytes
    peak_per_tensor = (peak - base) / N
    # before issue 10: ~380 B retained besides the keys, ~700 B at the peak, per tensor
    assert retained < 160, f"{retained:.0f} bytes per tensor kept besides the keys"
    assert peak_per_tensor < 600, f"{peak_per_tensor:.0f} bytes per tensor at the peak"
    # per-key objects are built on first use, and right
    assert m._index is None  # no key -> position dict until a lookup needs it
    assert len(m.keys) == N and m.shapes[N - 1] == (0,) and list(m.shapes)[:2] == [(0,), (0,)]
    assert m.dtype_names[5] == "float32" and m.dtype(5) == np.dtype("<f4")
    assert m.tree["d"][0][1]["l"][2]["d"][7] == ["t7", "layers/2/t7"]
    assert m.index["layers/2/t7"] == 2007
