"""Values in device memory (GPU) and how their bytes move: ``DeviceArray``, the
copy-engine interface, reusable pinned staging buffers, and reads that land in
device memory through bounce buffers (docs/ARCHITECTURE.md, "Device memory").

Nothing here imports a framework: adapters (``pyckpt/adapters/torch_device.py``)
provide the engines; ``pyckpt.testing.late_copies`` provides a test double.
"""

from .array import DeviceArray
from .buffers import StagingBuffers, pinned_memory_kept, release_staging_memory
from .engine import CopyEngine, HostCopyEngine, Ticket

__all__ = ["DeviceArray", "CopyEngine", "HostCopyEngine", "Ticket", "StagingBuffers",
           "pinned_memory_kept", "release_staging_memory"]
