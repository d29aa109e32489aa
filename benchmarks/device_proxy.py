"""The device path of torch state on CPU tensors, for measuring its Python cost without a
GPU (bench_copy_cost.py): ``install()`` places an adapter before torch's that makes
every CPU tensor a ``DeviceArray`` of ``ProxyEngine`` (as ``torch_support.writable``
makes a CUDA tensor one of ``TorchCudaEngine``) and sends the pairs of ``copy_state``'s
``copy`` hook to one ``foreach_copy`` (as it sends those of one CUDA device)."""

from __future__ import annotations

import numpy as np
import torch

from pyckpt.adapters import torch_device as td
from pyckpt import registry
from pyckpt.adapters import torch_support
from pyckpt.adapters.torch_support import _not_strided
from pyckpt.device.array import DeviceArray
from pyckpt.device.engine import CopyEngine, DoneTicket
from pyckpt.registry import _ADAPTERS, Adapter


class ProxyEngine(CopyEngine):
    """``TorchCudaEngine``'s ``copy``, ``batch``, ``copy_batches``, ``clones`` and
    ``empty_like``, on CPU tensors."""

    name = "proxy"

    def to_host(self, srcs, dsts):
        for s, d in zip(srcs, dsts):
            np.copyto(d, s.obj.numpy())
        return [DoneTicket() for _ in srcs]

    def to_device(self, srcs, dsts):
        for s, d in zip(srcs, dsts):
            d.obj.numpy()[...] = s
        return [DoneTicket() for _ in srcs]

    def copy(self, srcs, dsts):
        td.foreach_copy(torch, [x.obj for x in dsts], [x.obj for x in srcs])

    if hasattr(td, "tensor_batch"):  # (revisions that have batches)
        def batch(self, arrays):
            return td.tensor_batch(torch, arrays)

        def copy_batches(self, srcs, dsts):
            td.copy_tensor_batches(torch, srcs, dsts)

    if hasattr(td, "clone_tensor_batch"):
        def clones(self, srcs):
            return td.clone_tensor_batch(torch, srcs, self) or super().clones(srcs)

    def empty_like(self, src):
        t = torch.empty_like(src.obj, memory_format=torch.contiguous_format)
        return DeviceArray.trusted(t, src.shape, src.dtype, src.device, self)

    def alloc_host(self, nbytes):
        return np.empty(nbytes, np.uint8)

    def free_host(self, buf):
        pass

    def synchronize(self):
        pass


def as_device(obj):
    """``torch_support.writable``'s CUDA branch, for CPU tensors."""
    if not isinstance(obj, torch.Tensor):
        return None
    if obj.layout is not torch.strided:
        raise _not_strided(obj)
    return td.device_array(torch, obj)


def copy_hook(srcs, dsts):
    return td.copy_tensors(torch, srcs, dsts, lambda s, d: td.foreach_copy(torch, d, s))


def install() -> None:
    td._BY_INDEX[-1] = (ProxyEngine(), "cpu")  # what _engine_of finds for a CPU tensor
    # copy_tensors: every CPU pair in one batch, as the pairs of one CUDA device are
    # (else CPU pairs over 1 MiB go to the C++ core: a second group the GPU has not)
    td.SMALL_HOST_BYTES = 1 << 62
    # its targets depend on what torch's do: torch's stamp (revisions that have one)
    stamp = {"stamp": torch_support.stamp} if "stamp" in Adapter._fields else {}
    # a stored leaf of kind "proxy" comes back as a tensor, as one of kind "torch" does
    _ADAPTERS.insert(0, Adapter("proxy", leaf=as_device, target=as_device, copy=copy_hook,
                                from_host=torch_support.from_host, **stamp))
    if hasattr(registry, "touch"):
        registry.touch()
