"""The translations between DCP's vocabulary and pyckpt's: torch dtypes and stored
dtype names, and DCP's planner data (the flattening map of a state dict) as JSON."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from .._dtypes import dtype_name
from ..adapters.torch_device import torch_dtype
from ..adapters.torch_support import to_numpy

__all__ = ["host_dtype_name", "torch_dtype_of", "stored_dtypes", "json_planner_data",
           "planner_data_of"]


_NAMES: dict[Any, str] = {}  # torch dtype -> stored dtype name (per tensor at commit)


def host_dtype_name(dtype: Any) -> str:
    """pyckpt's stored dtype name for a torch dtype (TypeError for one pyckpt lacks)."""
    found = _NAMES.get(dtype)
    if found is None:
        arr = to_numpy(torch.empty(0, dtype=dtype))
        assert isinstance(arr, np.ndarray)
        found = _NAMES[dtype] = dtype_name(arr.dtype)
    return found


_TORCH_DTYPES: dict[np.dtype, Any] = {}  # stored numpy dtype -> torch dtype (per-tensor path)


def torch_dtype_of(dtype: np.dtype) -> Any:
    """The torch dtype holding a stored numpy dtype's values (cached: the reader asks
    once per tensor and per read item)."""
    found = _TORCH_DTYPES.get(dtype)
    if found is None:
        found = _TORCH_DTYPES[dtype] = torch_dtype(torch, dtype)
    return found


def stored_dtypes(src: Any) -> list[tuple[np.dtype, Any]]:
    """(stored numpy dtype, torch dtype) of every tensor of the CheckpointSource
    ``src``, in stored order: each distinct dtype object is resolved once (a format
    hands out a few, one per dtype; the list keeps them alive, so ids stay unique)."""
    seen: dict[int, Any] = {}
    out = []
    for i in range(len(src.keys)):
        d = src.dtype(i)
        t = seen.get(id(d))
        if t is None:
            t = seen[id(d)] = torch_dtype_of(d)
        out.append((d, t))
    return out


def _path(key: str, path: Any) -> list:
    if not isinstance(path, (tuple, list)) or not all(
            isinstance(p, (str, int)) and not isinstance(p, bool) for p in path):
        raise ValueError(f"DCP planner data for {key!r} is {path!r}: pyckpt keeps the default "
                         "planners' data (a path of str and int per key), not a custom planner's")
    return list(path)


def json_planner_data(data: Any) -> dict | None:
    """DCP's planner data (key -> path in the nested state dict) as JSON; ValueError
    for data a custom planner made that pyckpt cannot keep."""
    if data is None:
        return None
    if not isinstance(data, dict):
        raise ValueError(f"DCP planner data of type {type(data).__name__}: pyckpt keeps the "
                         "default planners' data (a dict of key -> path), not a custom planner's")
    return {str(k): _path(k, v) for k, v in data.items()}


def planner_data_of(doc: Any) -> dict | None:
    """The inverse of ``json_planner_data`` for an index's ``info.dcp.planner_data``
    (None when absent or malformed: DCP then flattens as its planner does)."""
    if not isinstance(doc, dict):
        return None
    try:
        return {k: tuple(_path(k, v)) for k, v in doc.items()}
    except ValueError:
        return None
