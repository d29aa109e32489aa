"""Exceptions raised by pyckpt (docs/API.md section 7).

Every error about a checkpoint derives from :class:`CheckpointError`; the
concrete classes also derive from the matching builtin so that existing
``except ValueError`` / ``except FileNotFoundError`` code keeps working.
The C++ core reports failures as Status values, which its binding turns into
these classes in one place (``cpp/bindings/status_to_python.h``).

This module is the one home of every exception class pyckpt defines (a test,
``tests/test_errors_home.py``, fails on a class deriving from an exception anywhere
else): the public ones of docs/API.md, then the internal ones that modules raise and
catch among themselves (a failed request, a malformed record, a plan that cannot be
combined), each named for what it means where it is raised.
"""

from __future__ import annotations

__all__ = [
    "CheckpointError",
    "CorruptCheckpointError",
    "CheckpointNotFoundError",
    "CheckpointIOError",
    "CheckpointKeyError",
    "ConcurrentWriterError",
    "DtypeUnavailableError",
    "UnsupportedDCPError",
    "UnsupportedTensorError",
    "DistributedSaveError",
    "WorkerTimeoutError",
]


def add_note(exc: BaseException, note: str) -> None:
    """Attaches a note (PEP 678) to an exception, shown under its traceback: how a
    failure's cleanup or outcome is reported without replacing the failure."""
    if hasattr(exc, "add_note"):
        exc.add_note(note)
    else:  # Python < 3.11: kept where 3.11's traceback would look for it
        exc.__notes__ = [*getattr(exc, "__notes__", []), note]  # type: ignore[attr-defined]


class CheckpointError(Exception):
    """Base class of every error pyckpt raises about a checkpoint."""


class CorruptCheckpointError(CheckpointError, ValueError):
    """A checksum, truncation or format failure.

    The message names the key, the file and the byte range involved.
    """


class CheckpointNotFoundError(CheckpointError, FileNotFoundError):
    """The path holds no committed checkpoint (missing or never committed)."""


class CheckpointIOError(CheckpointError, OSError):
    """The storage refused an operation (disk full, permission, network...).

    ``errno`` is the OS error number where there is one; an error raised for an
    ``OSError`` has that error as its ``__cause__`` (see :func:`io_error`).
    """


def io_error(err: OSError, what: str) -> CheckpointIOError:
    """The CheckpointIOError for an OSError of the storage, to raise ``from err``.

    ``what`` says what failed on which file ("cannot write '/run/ckpt-3/pyckpt.index'");
    the errno is kept, and the OS's own file name is added when it names another
    file (a temporary one, say)."""
    reason = err.strerror or str(err) or type(err).__name__
    msg = f"{what}: {reason}"
    for name in (err.filename, err.filename2):
        if name is not None and str(name) not in what:
            msg += f" ({name!s})"
    if err.errno is None:
        return CheckpointIOError(msg)
    return CheckpointIOError(err.errno, msg)


class CheckpointKeyError(CheckpointError, KeyError):
    """A key asked for is not in the checkpoint."""

    def __str__(self) -> str:  # KeyError's repr-quoting makes long messages unreadable
        return str(self.args[0]) if self.args else ""


class ConcurrentWriterError(CheckpointError, RuntimeError):
    """Another writer holds the checkpoint directory."""


class DtypeUnavailableError(CheckpointError, ImportError):
    """A tensor's stored dtype (bfloat16, float8...) cannot be decoded in this Python:
    ml_dtypes is missing or too old. The message names the key, the dtype and the
    install command; the checkpoint itself may be healthy (``verify`` checks its bytes)."""


class UnsupportedDCPError(CheckpointError, NotImplementedError):
    """A DCP checkpoint layout or tensor pyckpt does not read (safetensors
    serialization, stream transforms such as compression, sparse or quantized
    tensors, dtypes without a numpy equivalent)."""


class UnsupportedTensorError(CheckpointError, NotImplementedError):
    """A TensorFlow tensor pyckpt cannot read (a partitioned variable saved as
    slices, a variant or resource tensor, a dtype without a numpy type)."""


class DistributedSaveError(CheckpointError):
    """A multi-worker save failed; raised on every worker with every worker's error."""


class WorkerTimeoutError(CheckpointError, TimeoutError):
    """A worker did not take part in a collective step in time (dead or stuck)."""


# -- internal: raised and caught inside pyckpt, or turned into the classes above --


class StallError(TimeoutError):
    """A request moved no byte for ``stall_timeout`` seconds (a transient failure)."""


class StoreDown(TimeoutError):
    """A request not even tried: the store stopped answering moments ago and the
    follow-up window of that failure is spent (a transient failure)."""


class StoreProblem(Exception):
    """A remote store failed for a known reason (no credentials, unreachable...): the
    message names the cause and the fix; ``__cause__`` is the client's own error
    (the command line prints it)."""


class WriteEnded(OSError):
    """The writers of a ring-staged save ended before a value was written (their
    own error, raised by the job's wait, is the one reported)."""


class PlanError(ValueError):
    """Local plans that cannot be combined (workers disagree on a key's dtype, shape
    or kind, or blocks do not tile their array); becomes the global plan's error."""


class WireError(ValueError):
    """A malformed protobuf message (TensorFlow's records)."""


class StateFileSyntaxError(ValueError):
    """TensorFlow's ``checkpoint`` state file does not parse (its reader turns it into
    a CorruptCheckpointError naming the file)."""


class RelayAbort(Exception):
    """A test relay ends the connection (``rst``: with a reset of both sides):
    a malformed or stalled HTTP message (``pyckpt.testing.http_wire``)."""

    def __init__(self, rst: bool = False) -> None:
        super().__init__()
        self.rst = rst
