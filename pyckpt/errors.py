"""Exceptions raised by pyckpt (API.md section 7).

Every error about a checkpoint derives from :class:`CheckpointError`; the
concrete classes also derive from the matching builtin so that existing
``except ValueError`` / ``except FileNotFoundError`` code keeps working.
The C++ core reports failures as Status values, which its binding turns into
these classes in one place (``cpp/bindings/status_to_python.h``).
"""

from __future__ import annotations

__all__ = [
    "CheckpointError",
    "CorruptCheckpointError",
    "CheckpointNotFoundError",
    "CheckpointIOError",
    "CheckpointKeyError",
    "ConcurrentWriterError",
]


class CheckpointError(Exception):
    """Base class of every error pyckpt raises about a checkpoint."""


class CorruptCheckpointError(CheckpointError, ValueError):
    """A checksum, truncation or format failure.

    The message names the key, the file and the byte range involved.
    """


class CheckpointNotFoundError(CheckpointError, FileNotFoundError):
    """The path holds no committed checkpoint (missing or never committed)."""


class CheckpointIOError(CheckpointError, OSError):
    """The storage refused an operation (disk full, permission, network...)."""


class CheckpointKeyError(CheckpointError, KeyError):
    """A key asked for is not in the checkpoint."""

    def __str__(self) -> str:  # KeyError's repr-quoting makes long messages unreadable
        return str(self.args[0]) if self.args else ""


class ConcurrentWriterError(CheckpointError, RuntimeError):
    """Another writer holds the checkpoint directory."""
