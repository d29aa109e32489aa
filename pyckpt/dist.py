"""The communicators of multi-worker saves, under their public name (docs/API.md section 6).

The implementation lives in ``pyckpt/workers/``; this module keeps the documented
``pyckpt.dist.TorchComm`` / ``MPIComm`` / ``SingleComm`` / ``WorkerTimeoutError``
names importable.
"""

from .workers.comm import (
    Communicator,
    MPIComm,
    SingleComm,
    TorchComm,
    WorkerTimeoutError,
    resolve_comm,
)

__all__ = ["Communicator", "SingleComm", "TorchComm", "MPIComm", "WorkerTimeoutError",
           "resolve_comm"]
