"""Multi-worker saves over an existing distributed engine (docs/API.md section 6)."""

from .comm import (
    Communicator,
    MPIComm,
    SingleComm,
    TorchComm,
    WorkerTimeoutError,
    resolve_comm,
)

__all__ = ["Communicator", "SingleComm", "TorchComm", "MPIComm", "WorkerTimeoutError",
           "resolve_comm"]
