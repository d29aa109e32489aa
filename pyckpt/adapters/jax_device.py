"""JAX arrays on accelerators as ``DeviceArray``s: saves issue every
``copy_to_host_async`` at once (the transfers overlap each other and the disk
writes of earlier values), then copy each landed host value into its staging
buffer. JAX arrays are immutable, so a save never races with the program;
loads build new arrays (``jax_support.restore``), so this engine has no
host-to-device or device-to-device copies.
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from ..device.array import DeviceArray
from ..device.engine import CopyEngine, Ticket

__all__ = ["JaxEngine", "device_array", "on_accelerator"]


class _HostCopyTicket(Ticket):
    __slots__ = ("src", "dst", "landed")

    def __init__(self, src: Any, dst: np.ndarray) -> None:
        self.src, self.dst, self.landed = src, dst, False

    def done(self) -> bool:
        return self.landed

    def wait(self) -> None:
        if not self.landed:
            np.copyto(self.dst, np.asarray(self.src), casting="no")
            self.landed, self.src = True, None


class JaxEngine(CopyEngine):
    """Copies of JAX arrays to the host (module doc)."""

    name = "jax"

    def to_host(self, srcs: Sequence[DeviceArray], dsts: Sequence[np.ndarray]) -> list[Ticket]:
        for s in srcs:
            s.obj.copy_to_host_async()
        return [_HostCopyTicket(s.obj, d) for s, d in zip(srcs, dsts)]

    def _immutable(self) -> TypeError:
        return TypeError("JAX arrays are immutable and cannot be filled in place: load "
                         "with pyckpt.adapters.jax_support.restore(path, target)")

    def to_device(self, srcs: Sequence[np.ndarray], dsts: Sequence[DeviceArray]) -> list[Ticket]:
        raise self._immutable()

    def copy(self, srcs: Sequence[DeviceArray], dsts: Sequence[DeviceArray]) -> None:
        raise self._immutable()

    def empty_like(self, src: DeviceArray) -> DeviceArray:
        raise self._immutable()


_ENGINE = JaxEngine()


def on_accelerator(arr: Any) -> bool:
    """Whether a jax.Array has a shard outside host memory (GPU, TPU)."""
    try:
        return any(d.platform != "cpu" for d in arr.devices())
    except (AttributeError, RuntimeError):
        return False


def device_array(arr: Any) -> DeviceArray:
    """A jax.Array as a DeviceArray of the JAX engine."""
    devices = sorted(str(d) for d in arr.devices())
    return DeviceArray(arr, tuple(arr.shape), np.dtype(arr.dtype), ",".join(devices), _ENGINE)
