"""``DeviceArray``: a value that lives in device memory (a CUDA tensor, a JAX GPU
array), as the rest of pyckpt sees it.

Adapters (``pyckpt/adapters/``) return one from their ``leaf`` and ``target``
hooks instead of copying the value to host memory themselves, so that the save,
load and copy paths can move the bytes in bulk through the value's
``CopyEngine`` (``device/engine.py``): asynchronous copies into pinned buffers,
overlapped with the disk. ``np.asarray(device_array)`` still works (a blocking
copy to a fresh host array), so no code path ever sees a wrong value.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:  # for signatures only
    from .engine import CopyEngine

__all__ = ["DeviceArray"]


class DeviceArray:
    """One array in device memory: ``shape``, ``dtype`` (the numpy dtype of its
    bytes on the host), ``device`` (e.g. ``"cuda:0"``), ``engine`` (the CopyEngine
    that moves its bytes), and ``obj``, the framework object itself (kept alive
    as long as this is)."""

    __slots__ = ("obj", "shape", "dtype", "device", "engine")

    def __init__(self, obj: Any, shape: tuple[int, ...], dtype: np.dtype, device: str,
                 engine: CopyEngine) -> None:
        self.obj = obj
        self.shape = tuple(int(d) for d in shape)
        self.dtype = np.dtype(dtype)
        self.device = device
        self.engine = engine

    @classmethod
    def trusted(cls, obj: Any, shape: tuple[int, ...], dtype: np.dtype, device: str,
                engine: "CopyEngine") -> "DeviceArray":
        """The constructor without its conversions, for adapters whose ``shape`` is
        already a tuple of ints and ``dtype`` a numpy dtype (their hot path)."""
        self = cls.__new__(cls)
        self.obj, self.shape, self.dtype, self.device, self.engine = obj, shape, dtype, device, engine
        return self

    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def size(self) -> int:
        n = 1
        for d in self.shape:
            n *= d
        return n

    @property
    def nbytes(self) -> int:
        return self.size * self.dtype.itemsize

    def __array__(self, dtype: Any = None, copy: Any = None) -> np.ndarray:
        """A blocking copy into a new host array (the slow, always-correct path)."""
        host = np.empty(self.shape, dtype=self.dtype)
        for ticket in self.engine.to_host([self], [host]):
            ticket.wait()
        return host if dtype is None else host.astype(dtype, copy=False)

    def __repr__(self) -> str:
        return f"<DeviceArray {self.shape} {self.dtype} on {self.device}>"
