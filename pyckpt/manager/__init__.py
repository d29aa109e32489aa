"""CheckpointManager: retention, crash recovery and async saves of a training run."""

from .manager import CheckpointManager
from .options import AsyncOptions, CheckpointManagerOptions, IncrementalOptions, LocalTierOptions

__all__ = ["CheckpointManager", "CheckpointManagerOptions", "AsyncOptions", "LocalTierOptions",
           "IncrementalOptions"]
