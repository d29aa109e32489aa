"""Reading a DCP checkpoint never imports torch: in a fresh interpreter (run from an
empty directory, so that the installed pyckpt is the one imported), every read path
leaves ``torch`` out of ``sys.modules``."""

import json
import os
import subprocess
import sys

CKPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "fixtures", "ckpt")

SCRIPT = r"""
import json, sys
import numpy as np
import pyckpt
from pyckpt.codecs.distcp import DCPCheckpoint  # the reader's own modules, too
from pyckpt.sharded import ShardedArray
path = sys.argv[1]
reader = pyckpt.load_checkpoint(path)
values = {k: reader.get_tensor(k) for k in reader.keys()}
state = pyckpt.load(path)
block = ShardedArray(np.zeros((2, 3), np.float32), (5, 3), (2, 0))
pyckpt.load(path, into={"model.sharded": block})
reader.verify()
print(json.dumps({"torch": "torch" in sys.modules,
                  "dist": any(m.startswith("torch") for m in sys.modules),
                  "keys": len(values), "entries": len(state),
                  "format": reader.source.format}))
"""


def test_reading_does_not_import_torch(tmp_path):
    r = subprocess.run([sys.executable, "-c", SCRIPT, CKPT], capture_output=True, text=True,
                       cwd=str(tmp_path), timeout=120)
    assert r.returncode == 0, r.stderr
    got = json.loads(r.stdout.strip().splitlines()[-1])
    assert got == {"torch": False, "dist": False, "keys": 9, "entries": 11, "format": "dcp"}
