"""pyckpt: fast, verified, distributed checkpoints for machine-learning training state.

Public API (see docs/API.md / README.md):

- values: :class:`Variable`, :class:`ShardedArray`, :class:`PerWorker`
- name-based checkpoints: :func:`save`, :func:`load`
- object-based checkpoints: :class:`Trackable`, :class:`Module`, :class:`Checkpoint`,
  :class:`LoadStatus`, :class:`Snapshot`, :func:`copy_state`
- training runs: :class:`CheckpointManager` and its options
  (:class:`CheckpointManagerOptions`, :class:`AsyncOptions`, :class:`LocalTierOptions`,
  :class:`IncrementalOptions`)
- stateful values: :class:`GlobalRNG` (the process's random state)
- inspection: :func:`load_checkpoint`, :func:`list_variables`, :func:`load_variable`,
  :func:`latest_checkpoint`
- errors: :class:`CheckpointError`, :class:`CorruptCheckpointError`,
  :class:`CheckpointNotFoundError`
"""

from __future__ import annotations

from . import dist
from ._version import __version__
from .checkpoint_reader import (
    CheckpointReader,
    latest_checkpoint,
    list_variables,
    load_checkpoint,
    load_variable,
)
from .errors import (
    CheckpointError,
    CheckpointIOError,
    CheckpointKeyError,
    CheckpointNotFoundError,
    ConcurrentWriterError,
    CorruptCheckpointError,
)
from .flat import load, save
from .graph import (
    Checkpoint,
    Conflict,
    LoadStatus,
    Module,
    RestorePlan,
    Snapshot,
    Trackable,
    copy_state,
)
from .manager import (
    AsyncOptions,
    CheckpointManager,
    CheckpointManagerOptions,
    IncrementalOptions,
    LocalTierOptions,
)
from .rng import GlobalRNG
from .sharded import ShardedArray
from .variables import Variable
from .adapters import jax_support as _jax_support, torch_support as _torch_support
from . import perworker_hooks as _perworker
from .perworker_hooks import PerWorker

_torch_support.register()
_jax_support.register()
_perworker.register()

__all__ = [
    "__version__",
    "Variable",
    "ShardedArray",
    "PerWorker",
    "save",
    "load",
    "Trackable",
    "Module",
    "Checkpoint",
    "LoadStatus",
    "RestorePlan",
    "Conflict",
    "Snapshot",
    "copy_state",
    "CheckpointManager",
    "CheckpointManagerOptions",
    "AsyncOptions",
    "LocalTierOptions",
    "IncrementalOptions",
    "GlobalRNG",
    "CheckpointReader",
    "load_checkpoint",
    "list_variables",
    "load_variable",
    "latest_checkpoint",
    "CheckpointError",
    "CorruptCheckpointError",
    "CheckpointNotFoundError",
    "CheckpointIOError",
    "CheckpointKeyError",
    "ConcurrentWriterError",
]
