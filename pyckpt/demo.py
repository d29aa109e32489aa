"""``pyckpt demo``: saves a small model-like training state to local disk,
inspects it, verifies it, loads it back and checks it, printing each step."""

from __future__ import annotations

import os
import tempfile
import time
from typing import Callable

import numpy as np

import pyckpt


def _state(rng: np.random.Generator) -> dict:
    params = {
        "embedding": rng.standard_normal((1000, 64), dtype=np.float32),
        "layers": [
            {"w": rng.standard_normal((64, 64), dtype=np.float32),
             "b": np.zeros(64, dtype=np.float32)}
            for _ in range(4)
        ],
        "head": {"w": rng.standard_normal((64, 10), dtype=np.float32)},
    }
    zeros_like = lambda tree: {  # noqa: E731
        "embedding": np.zeros_like(tree["embedding"]),
        "layers": [{k: np.zeros_like(v) for k, v in layer.items()} for layer in tree["layers"]],
        "head": {"w": np.zeros_like(tree["head"]["w"])},
    }
    return {
        "params": params,
        "optimizer": {"m": zeros_like(params), "v": zeros_like(params), "step": 120},
        "data_iterator": {"epoch": 3, "position": 4096},
    }


def run(directory: str | None = None, out: Callable[[str], None] = print,
        keep: bool = False) -> int:
    """Runs the demo in ``directory`` (kept), or by default in a temporary directory,
    removed at the end unless ``keep``; reports each step through ``out``. Paths in a
    directory that is removed at the end are shown relative to it (``ckpt-120``), so
    that nothing printed names a path that no longer exists. Returns 0 when every
    check passed, else 1."""
    state = _state(np.random.default_rng(0))
    removed = directory is None and not keep
    tmp, root = _workdir(directory, removed)
    path = os.path.join(root, "ckpt-120")

    def shown(p: str | None) -> str:
        """``p`` as printed: relative to a directory that is removed at the end."""
        return str(p) if p is None or not removed else os.path.relpath(p, root)

    try:
        if removed:
            out("working in a temporary directory, removed at the end "
                "(pyckpt demo --keep keeps it; --dir DIR writes into DIR)")
        t = time.perf_counter()
        pyckpt.save(state, path, metadata={"step": 120, "note": "pyckpt demo"})
        out(f"saved   {shown(path)}  ({time.perf_counter() - t:.3f} s, durable)")
        files = sorted(os.listdir(path))
        out(f"files   {', '.join(files)}")
        _inspect(path, out)
        restored = _check_loads(path, state, out)
        latest = pyckpt.latest_checkpoint(root)
        out(f"latest  {shown(latest)}")
        if not removed:
            out(f"kept    {root}  (try: pyckpt ls {root}; pyckpt inspect {path})")
        return 0 if restored and latest == path else 1
    finally:
        if tmp is not None:
            tmp.cleanup()
            out("removed the temporary directory")


def _workdir(directory: str | None,
             removed: bool) -> tuple[tempfile.TemporaryDirectory | None, str]:
    """(the temporary directory to remove at the end, or None; the directory the demo
    works in): a new temporary one when ``removed``, else ``directory``, or a new one
    that stays when it is None."""
    if removed:
        tmp = tempfile.TemporaryDirectory(prefix="pyckpt-demo-")
        return tmp, tmp.name
    if directory is None:
        return None, tempfile.mkdtemp(prefix="pyckpt-demo-")
    return None, directory


def _inspect(path: str, out: Callable[[str], None]) -> None:
    """The checkpoint's tensors and metadata, then a check of every chunk checksum."""
    reader = pyckpt.load_checkpoint(path)
    total = reader.nbytes()
    out(f"inspect {len(reader.keys())} tensors, {total / 1e6:.2f} MB, metadata {reader.metadata}")
    for key, shape in pyckpt.list_variables(path)[:5]:
        out(f"          {key:32s} {str(shape):12s} {reader.get_variable_to_dtype_map()[key]}")
    out("          ...")

    reader.verify()
    out("verify  every chunk checksum matches")


def _check_loads(path: str, state: dict, out: Callable[[str], None]) -> bool:
    """Loads the checkpoint back, then restores it in place into a new state; whether
    both gave back ``state``'s values."""
    loaded = pyckpt.load(path)
    ok = (np.array_equal(loaded["params"]["embedding"], state["params"]["embedding"])
          and loaded["optimizer"]["step"] == 120
          and loaded["data_iterator"] == {"epoch": 3, "position": 4096})
    out(f"load    structure and values restored: {'yes' if ok else 'NO'}")

    fresh = _state(np.random.default_rng(1))
    pyckpt.load(path, into=fresh)
    same = np.array_equal(fresh["params"]["layers"][2]["w"], state["params"]["layers"][2]["w"])
    out(f"restore in place into a new model: {'yes' if same else 'NO'}")
    return bool(ok and same)
