"""Which storage backend serves a URL, with install hints for missing ones.

Every protocol goes through fsspec (``fsspec.core.url_to_fs``); this module
only knows which package implements the common ones, so that a missing
package gives a clear message. Third parties can add fsspec implementations
the usual way (fsspec's own registry or entry points).
"""

from __future__ import annotations

import errno
import importlib.util

from ..errors import CheckpointIOError

# protocol -> (module that implements it, pip requirement)
KNOWN = {
    "s3": ("s3fs", "s3fs"),
    "s3a": ("s3fs", "s3fs"),
    "gs": ("gcsfs", "gcsfs"),
    "gcs": ("gcsfs", "gcsfs"),
    "az": ("adlfs", "adlfs"),
    "abfs": ("adlfs", "adlfs"),
    "hf": ("huggingface_hub", "huggingface_hub"),
}


def check_protocol(url: str) -> None:
    """Raises ImportError with an install hint when the backend is not installed."""
    for part in url.split("::"):
        proto = part.split("://", 1)[0] if "://" in part else None
        if proto in KNOWN:
            module, requirement = KNOWN[proto]
            if importlib.util.find_spec(module) is None:
                raise ImportError(f"{proto}:// paths need the {module} package: "
                                  f"pip install {requirement}")


def unknown_protocol(url: str) -> CheckpointIOError:
    """The error for a URL whose scheme no installed fsspec implementation serves."""
    proto = url.split("://", 1)[0]
    return CheckpointIOError(
        errno.EPROTONOSUPPORT,
        f"no storage serves {proto}:// URLs ({url}): fsspec knows no protocol {proto!r}. "
        "Check the URL (local paths need no scheme; file://, memory://, s3://, gs:// are "
        f"common), or install and import the fsspec implementation of {proto}://")


def import_client(url: str) -> None:
    """Imports the fsspec implementation that serves ``url`` (its modules only: no
    filesystem is made, no credentials are looked for); nothing for an unknown one."""
    import fsspec  # optional at import time: loaded with the first URL

    try:
        fsspec.get_filesystem_class(url.split("://", 1)[0])
    except (ImportError, ValueError):
        pass  # resolve() reports it
