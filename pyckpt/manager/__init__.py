"""CheckpointManager: retention, crash recovery and async saves of a training run."""

from .manager import CheckpointManager

__all__ = ["CheckpointManager"]
