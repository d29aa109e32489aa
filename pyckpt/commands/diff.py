"""``pyckpt diff A B``: keys added, removed and changed; max |a - b| per tensor.
Exit status 0 when identical, 1 when they differ."""

from __future__ import annotations

import argparse
from typing import Any

import numpy as np

from .. import progress as _progress
from ..checkpoint_reader import load_checkpoint
from ..runs import natural_key
from .common import (add_output_options, add_storage_options, emit_json,
                     parse_options, progress_bar, reach)


def compare(a: np.ndarray, b: np.ndarray) -> dict:
    """Compares two tensors: ``{"status": "equal"}`` when their bytes are; else
    ``"changed"`` with each side's ``[dtype, shape]`` when those differ, or, for
    numeric non-empty tensors, ``max_abs_diff`` and ``elements_differing``."""
    if a.shape != b.shape or a.dtype != b.dtype:
        return {"status": "changed", "a": [str(a.dtype), list(a.shape)],
                "b": [str(b.dtype), list(b.shape)]}
    if a.tobytes() == b.tobytes():
        return {"status": "equal"}
    out: dict = {"status": "changed"}
    numeric = a.dtype.kind in "biufc" or a.dtype.name.startswith(("bfloat", "float8"))
    if numeric and a.size:
        if a.dtype.kind in "iu":  # exactly: in the unsigned type of the same width
            u = np.dtype(f"u{a.dtype.itemsize}")
            out["max_abs_diff"] = int((np.maximum(a, b).astype(u)
                                       - np.minimum(a, b).astype(u)).max())
        else:
            kind = np.complex128 if a.dtype.kind == "c" else np.float64
            d = np.abs(a.astype(kind) - b.astype(kind))
            out["max_abs_diff"] = float(np.nanmax(d)) if not np.isnan(d).all() else float("nan")
        # elements whose bytes differ (NaN against the same NaN is equal, 0.0 and -0.0 not)
        size = a.dtype.itemsize
        ra = np.ascontiguousarray(a).view(np.uint8).reshape(a.size, size)
        rb = np.ascontiguousarray(b).view(np.uint8).reshape(b.size, size)
        out["elements_differing"] = int((ra != rb).any(axis=1).sum())
    return out


def _compare_texts(ra: Any, rb: Any, report: dict) -> None:
    """Adds the text, None and bytes values both checkpoints keep outside their
    tensors (``CheckpointReader.text_values``) to ``report``, as keys are: added,
    removed, changed (with both values) or equal."""
    ta, tb = ra.text_values(), rb.text_values()
    report["added"] += sorted(set(tb) - set(ta), key=natural_key)
    report["removed"] += sorted(set(ta) - set(tb), key=natural_key)
    for key in sorted(set(ta) & set(tb), key=natural_key):
        a, b = ta[key], tb[key]
        if type(a) is type(b) and a == b:
            report["equal"] += 1
        else:
            report["changed"][key] = {"status": "changed", "a_value": repr(a)[:200],
                                      "b_value": repr(b)[:200]}


def run(args: argparse.Namespace) -> int:
    """Runs ``pyckpt diff``: prints (or emits as JSON) the keys added, removed and
    changed (keys in natural order), reading one pair of tensors at a time under a
    progress bar; returns 0 when identical, else 1."""
    so = parse_options(args.storage_option)
    for url in (args.a, args.b):
        reach(args, url, so)
    ra, rb = load_checkpoint(args.a, storage_options=so), load_checkpoint(args.b, storage_options=so)
    ka, kb = set(ra.keys()), set(rb.keys())
    report: dict[str, Any] = {"a": ra.path, "b": rb.path,
                              "added": sorted(kb - ka, key=natural_key),
                              "removed": sorted(ka - kb, key=natural_key), "changed": {},
                              "equal": 0}
    common = sorted(ka & kb, key=natural_key)
    sa, sb = ra.source, rb.source
    total = (sa.nbytes([sa.index_of(k) for k in common])
             + sb.nbytes([sb.index_of(k) for k in common]))
    callback, close = progress_bar(args, "diff")
    try:
        with _progress.reporting(callback, total):
            for key in common:  # one tensor at a time: memory stays at two tensors
                result = compare(ra.get_tensor(key), rb.get_tensor(key))
                if result["status"] == "equal":
                    report["equal"] += 1
                else:
                    report["changed"][key] = result
    finally:
        close()
    _compare_texts(ra, rb, report)
    same = not (report["added"] or report["removed"] or report["changed"])
    if args.json:
        emit_json({**report, "identical": same})
        return 0 if same else 1
    for k in report["added"]:
        print(f"+ {k}")
    for k in report["removed"]:
        print(f"- {k}")
    for k, r in report["changed"].items():
        detail = (f"max |a-b| = {r['max_abs_diff']:.6g} in {r['elements_differing']} element(s)"
                  if "max_abs_diff" in r else f"{r.get('a')} -> {r.get('b')}" if "a" in r
                  else f"{r['a_value']} -> {r['b_value']}" if "a_value" in r
                  else "bytes differ")
        print(f"~ {k}: {detail}")
    print(f"{report['equal']} equal, {len(report['changed'])} changed, {len(report['added'])} "
          f"added, {len(report['removed'])} removed")
    return 0 if same else 1


def register(sub: argparse._SubParsersAction) -> None:
    """Adds the ``diff`` subcommand to the command line's subparsers."""
    p = sub.add_parser("diff", help="compare two checkpoints key by key",
                       description="Compares two checkpoints key by key: keys added (+), "
                       "removed (-) and changed (~, with max |a-b|). Exit status 0 when they "
                       "are identical, 1 when they differ.")
    p.add_argument("a", help="the first (older) checkpoint: a local path or an fsspec URL")
    p.add_argument("b", help="the second (newer) checkpoint: a local path or an fsspec URL")
    add_storage_options(p)
    add_output_options(p)
    p.set_defaults(fn=run)
