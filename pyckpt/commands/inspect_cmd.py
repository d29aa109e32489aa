"""``pyckpt inspect PATH [KEY]``: keys with dtype/shape/bytes, the object graph,
metadata; or one tensor's summary statistics."""

from __future__ import annotations

import argparse
import math
from typing import Any

import numpy as np

from .. import progress as _progress
from .._dtypes import dtype_name
from ..checkpoint_reader import load_checkpoint
from ..runs import natural_key
from .common import (add_output_options, add_storage_options, emit_json, human,
                     parse_options, printable, progress_bar, reach)


def tensor_stats(arr: np.ndarray) -> dict:
    """Summary of one array: dtype, shape, bytes, its first 8 values (``head``) and, for
    numeric non-empty arrays, NaN and inf counts and min/max/mean/std of the finite
    values (``mean_abs`` instead for complex arrays)."""
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


def _one_tensor(args: argparse.Namespace, reader: Any) -> int:
    """``inspect PATH KEY``: that tensor's ``tensor_stats``, read under a progress bar."""
    src = reader.source
    i = src.index_of(args.key)  # an unknown key fails before the bar appears
    callback, close = progress_bar(args, "read")
    try:
        with _progress.reporting(callback, src.nbytes([i])):
            value = reader.get_tensor(args.key)
    finally:
        close()
    stats = {"key": args.key, **tensor_stats(value)}
    if args.json:
        emit_json(stats)
    else:
        for k, v in stats.items():
            print(f"{k:6s} {printable(v) if k == 'key' else v}")
    return 0


def _summary(reader: Any) -> dict[str, Any]:
    """What ``inspect PATH`` reports: the checkpoint's facts and its key table."""
    src = reader.source
    facts = src.describe()
    # the format's own names of dtypes numpy lacks (TensorFlow strings/variants, DCP's
    # torch.complex32 or quantized tensors)
    foreign = {**facts.get("tf_dtypes", {}), **facts.get("torch_dtypes", {})}

    def dtype_text(i: int) -> str:
        return foreign.get(src.keys[i]) or dtype_name(src.dtype(i))

    tensors: list[dict[str, Any]] = [
        {"key": k, "dtype": dtype_text(i), "shape": list(src.shape(i)),
         "bytes": (math.prod(src.shape(i)) * src.dtype(i).itemsize if src.dtype(i) != object
                   else src.nbytes([i])), "blocks": src.blocks(i)}
        for i, k in sorted(enumerate(src.keys), key=lambda ik: natural_key(ik[1]))]
    graph = src.graph
    return {
        "path": reader.path, "format": src.format, **facts,
        "bytes": sum(t["bytes"] for t in tensors), "info": src.info, "metadata": src.metadata,
        "object_graph": None if graph is None else {
            "nodes": len(graph["value"]), "values": sum(v is not None for v in graph["value"]),
            "root_edges": [e[0] for e in graph["children"][0]]},
        "tensors": tensors,
    }


def _print_summary(summary: dict[str, Any], fmt: str) -> None:
    """The human-readable form of ``_summary`` (``fmt``: the source's format name)."""
    facts, info, tensors = summary, summary["info"], summary["tensors"]
    print(f"checkpoint  {summary['path']}")
    where = (f", {len(facts['files'])} data file(s), checksum chunk {human(facts['chunk_size'])}"
             if "chunk_size" in facts else
             f", {len(facts['files'])} data file(s) ({facts.get('layout', fmt)})"
             if "files" in facts else f" ({fmt})")
    print(f"size        {human(summary['bytes'])} in {len(tensors)} tensors{where}")
    if facts.get("referenced_bytes"):
        held = sorted({f["in"] for f in facts["files"] if "in" in f})
        print(f"incremental {human(facts['own_bytes'])} held itself, "
              f"{human(facts['referenced_bytes'])} referenced in {', '.join(held)}")
    if info and "attempt" in info:
        print(f"written by  {info.get('library')} {info.get('version')}, attempt "
              f"{info.get('attempt')}, {info.get('world_size', 1)} worker(s)")
    elif info and info.get("library"):
        print(f"written by  {info.get('library')}")
    elif info and info.get("format"):  # a format that does not record its writer
        print(f"format      {info['format']}"
              + (f", producer version {info['producer']}" if "producer" in info else ""))
    if summary["metadata"]:
        print(f"metadata    {summary['metadata']}")
    og = summary["object_graph"]
    if og is not None:
        print(f"objects     {og['nodes']} nodes, {og['values']} values; root edges: "
              f"{', '.join(printable(e) for e in og['root_edges'])}")
    print()
    shown = [printable(t["key"]) for t in tensors]
    width = max([len(k) for k in shown] + [3])
    for t, key in zip(tensors, shown):
        extra = f"  ({t['blocks']} blocks)" if t["blocks"] > 1 else ""
        print(f"{key:{width}s}  {t['dtype']:10s} {str(tuple(t['shape'])):18s} "
              f"{human(t['bytes']):>10s}{extra}")


def run(args: argparse.Namespace) -> int:
    """Runs ``pyckpt inspect``: the checkpoint's summary and key table, or with KEY that
    tensor's ``tensor_stats`` (read under a progress bar); keys in natural order (``w/2``
    before ``w/10``); returns the exit status (0)."""
    options = parse_options(args.storage_option)
    reach(args, args.path, options)
    reader = load_checkpoint(args.path, storage_options=options)
    if args.key is not None:
        return _one_tensor(args, reader)
    summary = _summary(reader)
    if args.json:
        emit_json(summary)
    else:
        _print_summary(summary, reader.source.format)
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    """Adds the ``inspect`` subcommand to the command line's subparsers."""
    p = sub.add_parser("inspect", help="show keys, dtypes, shapes, metadata; or one tensor's stats",
                       description="Shows a checkpoint's summary and its tensors (key, dtype, "
                       "shape, bytes) in natural key order, or with KEY that tensor's summary "
                       "statistics.")
    p.add_argument("path", help="checkpoint, run directory (its latest checkpoint), "
                                ".safetensors file or TensorFlow checkpoint prefix (dir/ckpt-5): "
                                "a local path or an fsspec URL")
    p.add_argument("key", nargs="?", help="a tensor's key (e.g. params/w): read it and show its "
                                          "dtype, shape, min/max/mean/std, NaN/inf counts and "
                                          "first values")
    add_storage_options(p)
    add_output_options(p)
    p.set_defaults(fn=run)
