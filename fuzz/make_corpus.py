"""Writes seed inputs for fuzz_index.py: real index files (frame mode) and their
manifests (manifest mode) from a few small checkpoints."""

import os
import sys
import tempfile

import numpy as np

import pyckpt


def main(out: str) -> None:
    os.makedirs(out, exist_ok=True)
    rng = np.random.default_rng(0)
    trees = [
        {"a": np.arange(10)},
        {"layers": [{"w": rng.standard_normal((4, 4)).astype(np.float32), "b": np.zeros(4)}],
         "step": 3, "name": "x", "t": (1.5, None, b"z")},
        {"e": np.zeros((0, 3)), "s": np.array(["ab", "c"]), "big": np.ones(300_000, np.uint8)},
    ]
    with tempfile.TemporaryDirectory() as tmp:
        for i, tree in enumerate(trees):
            path = os.path.join(tmp, f"c{i}")
            pyckpt.save(tree, path)
            data = open(os.path.join(path, "pyckpt.index"), "rb").read()
            with open(os.path.join(out, f"frame-{i}"), "wb") as f:
                f.write(b"\x00" + data)
            with open(os.path.join(out, f"manifest-{i}"), "wb") as f:
                f.write(b"\x01" + data[32:-8])


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "fuzz/corpus")
