"""``pyckpt inspect PATH [KEY]``: keys with dtype/shape/bytes, the values that are no
tensors (str, bytes, None: ``load`` returns them too), the object graph, metadata; or
one tensor's summary statistics, or one such value."""

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


#: keys longer than this are printed on a line of their own, the columns under them
KEY_WIDTH = 60
#: characters of a value shown in the table of values (``inspect KEY`` shows it all)
VALUE_WIDTH = 60


def _value_row(key: str, value: Any) -> dict[str, Any]:
    """A value that is no tensor (str, bytes or None), for the summary: bytes by their
    length (``head``: the first 32), the others as they are."""
    row: dict[str, Any] = {"key": key, "type": "None" if value is None else type(value).__name__}
    if isinstance(value, bytes):
        row.update(bytes=len(value), head=repr(value[:32]))
    else:
        row["value"] = value
    return row


def _one_value(args: argparse.Namespace, key: str, value: Any) -> int:
    """``inspect PATH KEY`` of a value that is no tensor: its type and value (bytes: its
    length and first 256 bytes)."""
    row = _value_row(key, value)
    if isinstance(value, bytes):
        row["head"] = repr(value[:256]) + (" ..." if len(value) > 256 else "")
    if args.json:
        emit_json(row)
    else:
        for k, v in row.items():
            print(f"{k:6s} {printable(v if k in ('key', 'head') else repr(v) if k == 'value' else v)}")
    return 0


def _one_tensor(args: argparse.Namespace, reader: Any) -> int:
    """``inspect PATH KEY``: that tensor's ``tensor_stats``, read under a progress bar
    (or a value that is no tensor: ``_one_value``)."""
    src = reader.source
    if args.key not in src.index:
        values = reader.text_values()
        if args.key in values:
            return _one_value(args, args.key, values[args.key])
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
    values = reader.text_values()
    return {
        "path": reader.path, "format": src.format, **facts,
        "bytes": sum(t["bytes"] for t in tensors), "info": src.info, "metadata": src.metadata,
        "object_graph": None if graph is None else {
            "nodes": len(graph["value"]), "values": sum(v is not None for v in graph["value"]),
            "root_edges": [e[0] for e in graph["children"][0]]},
        "tensors": tensors,
        "values": [_value_row(k, values[k]) for k in sorted(values, key=natural_key)],
    }


def _print_summary(summary: dict[str, Any], fmt: str) -> None:
    """The human-readable form of ``_summary`` (``fmt``: the source's format name)."""
    facts, info, tensors = summary, summary["info"], summary["tensors"]
    print(f"checkpoint  {summary['path']}")
    scalars = sum(not t["shape"] for t in tensors)
    print(f"tensors     {len(tensors)}" + (f" ({scalars} of them 0-d, single numbers)" if scalars else "")
          + f", {human(summary['bytes'])} of values")
    if summary["values"]:
        print(f"values      {len(summary['values'])} that are no tensors (str, bytes, None), "
              "listed after the tensors")
    if "files" in facts:
        on_disk = sum(f.get("bytes") or 0 for f in facts["files"] if "in" not in f)
        print(f"files       {len(facts['files'])} data file(s), {human(on_disk)} in its directory"
              + (f", checksum chunk {human(facts['chunk_size'])}" if "chunk_size" in facts else
                 f" ({facts.get('layout', fmt)})"))
    else:
        print(f"format      {fmt}")
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
    rows = [(printable(t["key"]), f"{t['dtype']:10s} {str(tuple(t['shape'])):18s} "
             f"{human(t['bytes']):>10s}" + (f"  ({t['blocks']} blocks)" if t["blocks"] > 1 else ""))
            for t in tensors]
    rows += [(printable(v["key"]), f"{v['type']:10s} " + _shown(v)) for v in summary["values"]]
    width = min(max([len(k) for k, _ in rows] + [3]), KEY_WIDTH)
    print()
    for n, (key, columns) in enumerate(rows):
        if n == len(tensors) and n:
            print()
        if len(key) > width:  # whole (to copy for inspect KEY), the columns under it
            print(key)
            key = ""
        print(f"{key:{width}s}  {columns}")


def _shown(row: dict[str, Any]) -> str:
    """A value of the values table, cut to VALUE_WIDTH characters."""
    if "bytes" in row:
        text = f"{human(row['bytes'])}: {row['head']}"
    else:
        text = "" if row["value"] is None else repr(row["value"])
    text = printable(text)
    return text if len(text) <= VALUE_WIDTH else text[:VALUE_WIDTH - 3] + "..."


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
                       description="Shows a checkpoint's summary, its tensors (key, dtype, "
                       "shape, bytes of values) and its values that are no tensors (str, bytes, "
                       "None) in natural key order, or with KEY that tensor's summary "
                       "statistics (or that value). The tensors line counts the bytes of their "
                       "values; the files line the bytes of the data files in the checkpoint's "
                       "directory (what pyckpt ls shows as OWNED).")
    p.add_argument("path", help="checkpoint, run directory (its latest checkpoint), "
                                ".safetensors file or TensorFlow checkpoint prefix (dir/ckpt-5): "
                                "a local path or an fsspec URL")
    p.add_argument("key", nargs="?", help="a tensor's key (e.g. params/w): read it and show its "
                                          "dtype, shape, min/max/mean/std, NaN/inf counts and "
                                          "first values; or the key of a value that is no "
                                          "tensor: its type and value")
    add_storage_options(p)
    add_output_options(p)
    p.set_defaults(fn=run)
