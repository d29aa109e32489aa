"""``pyckpt inspect PATH [KEY]``: keys with dtype/shape/bytes, the object graph,
metadata; or one tensor's summary statistics."""

from __future__ import annotations

import argparse
import math
from typing import Any

import numpy as np

from ..checkpoint_reader import load_checkpoint
from .common import add_output_options, add_storage_options, emit_json, human, parse_options


def tensor_stats(arr: np.ndarray) -> dict:
    out: dict = {"dtype": arr.dtype.name, "shape": list(arr.shape), "bytes": arr.nbytes}
    if arr.size and (arr.dtype.kind in "biufc" or arr.dtype.name.startswith(("bfloat", "float8"))):
        x = arr.astype(np.complex128 if arr.dtype.kind == "c" else np.float64)
        finite = np.isfinite(x)
        out["nan"] = int(np.isnan(x).sum())
        out["inf"] = int((~finite).sum()) - out["nan"]
        xf = x[finite]
        if xf.size and arr.dtype.kind != "c":
            out.update(min=float(xf.min()), max=float(xf.max()), mean=float(xf.mean()),
                       std=float(xf.std()))
        elif xf.size:
            out.update(mean_abs=float(np.abs(xf).mean()))
    out["head"] = arr.reshape(-1)[:8].tolist()
    return out


def run(args: argparse.Namespace) -> int:
    reader = load_checkpoint(args.path, storage_options=parse_options(args.storage_option))
    m = reader._ck.manifest
    if args.key is not None:
        stats = {"key": args.key, **tensor_stats(reader.get_tensor(args.key))}
        if args.json:
            emit_json(stats)
        else:
            for k, v in stats.items():
                print(f"{k:6s} {v}")
        return 0
    tensors: list[dict[str, Any]] = [
        {"key": k, "dtype": m.dtype_names[i], "shape": list(m.shapes[i]),
         "bytes": math.prod(m.shapes[i]) * m.dtype(i).itemsize,
         "blocks": int(m.blocks.tensor_begin[i + 1] - m.blocks.tensor_begin[i])}
        for i, k in enumerate(m.keys)]
    graph = m.graph
    summary: dict[str, Any] = {
        "path": reader.path, "format_version": 1, "chunk_size": m.chunk_size,
        "files": [{"name": f.name, "bytes": f.size} for f in m.files],
        "bytes": sum(t["bytes"] for t in tensors), "info": m.info, "metadata": m.metadata,
        "object_graph": None if graph is None else {
            "nodes": len(graph["value"]), "values": sum(v is not None for v in graph["value"]),
            "root_edges": [e[0] for e in graph["children"][0]]},
        "tensors": tensors,
    }
    if args.json:
        emit_json(summary)
        return 0
    print(f"checkpoint  {summary['path']}")
    print(f"size        {human(summary['bytes'])} in {len(tensors)} tensors, "
          f"{len(m.files)} data file(s), checksum chunk {human(m.chunk_size)}")
    if m.info:
        print(f"written by  {m.info.get('library')} {m.info.get('version')}, attempt "
              f"{m.info.get('attempt')}, {m.info.get('world_size', 1)} worker(s)")
    if m.metadata:
        print(f"metadata    {m.metadata}")
    if graph is not None:
        og = summary["object_graph"]
        print(f"objects     {og['nodes']} nodes, {og['values']} values; root edges: "
              f"{', '.join(og['root_edges'])}")
    print()
    width = max([len(t["key"]) for t in tensors] + [3])
    for t in sorted(tensors, key=lambda t: t["key"]):
        extra = f"  ({t['blocks']} blocks)" if t["blocks"] > 1 else ""
        print(f"{t['key']:{width}s}  {t['dtype']:10s} {str(tuple(t['shape'])):18s} "
              f"{human(t['bytes']):>10s}{extra}")
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("inspect", help="show keys, dtypes, shapes, metadata; or one tensor's stats")
    p.add_argument("path")
    p.add_argument("key", nargs="?")
    add_storage_options(p)
    add_output_options(p)
    p.set_defaults(fn=run)
