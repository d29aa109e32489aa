"""Names of the files inside a checkpoint (docs/FORMAT.md, "Directory layout")."""

from __future__ import annotations

import re
import secrets

from ..format import INDEX_NAME

__all__ = ["INDEX_NAME", "new_attempt_id", "data_file_name", "is_data_file", "attempt_of"]

_DATA = re.compile(r"^data-[0-9a-f]{12}-[0-9]{5}-[0-9]{4}\.bin$")


def new_attempt_id() -> str:
    """A random id shared by every file one save attempt writes."""
    return secrets.token_hex(6)


def data_file_name(attempt: str, rank: int, index: int) -> str:
    """The name of a data file: ``data-<attempt>-<rank:05d>-<index:04d>.bin``."""
    return f"data-{attempt}-{rank:05d}-{index:04d}.bin"


def is_data_file(name: str) -> bool:
    """Whether ``name`` is a data file name, as ``data_file_name`` makes them."""
    return bool(_DATA.match(name))


def rank_of(data_file: str) -> int:
    """The writer's rank in a data file name (``is_data_file`` must hold)."""
    return int(data_file[18:23])


def attempt_of(data_file: str) -> str:
    """The attempt id of a data file name (``is_data_file`` must hold)."""
    return data_file[5:17]
