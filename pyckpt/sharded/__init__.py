"""``pyckpt.ShardedArray``: one worker's block of a global array (docs/API.md section 6)."""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from .._dtypes import describe_dtypes, same_dtype

__all__ = ["ShardedArray"]


class ShardedArray:
    """This worker's block ``local`` of a global array of ``global_shape``,
    starting at index ``offsets`` in each dimension."""

    __slots__ = ("local", "global_shape", "offsets")

    def __init__(self, local: Any, global_shape: Sequence[int], offsets: Sequence[int]) -> None:
        local_arr = local if isinstance(local, np.ndarray) else np.asarray(local)
        gs = tuple(int(d) for d in global_shape)
        off = tuple(int(o) for o in offsets)
        if len(gs) != local_arr.ndim or len(off) != local_arr.ndim:
            raise ValueError(f"ShardedArray: local block has rank {local_arr.ndim}, "
                             f"global_shape {gs} and offsets {off} must match it")
        for o, s, g in zip(off, local_arr.shape, gs):
            if o < 0 or s < 0 or o + s > g:
                raise ValueError(f"ShardedArray: block at {off} of shape {local_arr.shape} "
                                 f"does not fit in {gs}")
        self.local = local_arr
        self.global_shape = gs
        self.offsets = off

    @property
    def dtype(self) -> np.dtype:
        """The dtype of the local block (and of the global array)."""
        return self.local.dtype

    @property
    def shape(self) -> tuple[int, ...]:
        """The global shape (not the local block's)."""
        return self.global_shape

    def check_against(self, shape: tuple[int, ...], dtype: np.dtype, key: str) -> list[str]:
        """Problems loading the stored tensor ``key`` (``shape``, ``dtype``) into this block:
        a different global shape or dtype, or a read-only block; empty when none."""
        if shape != self.global_shape or not same_dtype(dtype, self.local.dtype):
            stored, target = describe_dtypes(dtype, self.local.dtype)
            return [f"{key!r}: checkpoint has shape {shape} dtype {stored}, "
                    f"target is a block of global shape {self.global_shape} dtype {target}"]
        if not self.local.flags.writeable:
            return [f"{key!r}: target block is read-only"]
        return []

    def __repr__(self) -> str:
        return (f"ShardedArray(local shape={self.local.shape}, global_shape={self.global_shape}, "
                f"offsets={self.offsets}, dtype={self.local.dtype.name})")
