"""Object-based checkpoints: Trackable graphs, Checkpoint, restore matching."""

from .checkpoint import Checkpoint
from .module import Module
from .plan import Conflict, RestorePlan
from .restore import LoadStatus
from .snapshot import Snapshot, copy_state
from .trackable import Trackable

__all__ = ["Checkpoint", "Module", "Trackable", "LoadStatus", "RestorePlan", "Conflict",
           "Snapshot", "copy_state"]
