"""Runs gcp-storage-emulator with a threading HTTP server.

The emulator serves from a single-threaded ``http.server.HTTPServer``: while one
client keeps a keep-alive connection open, every other connection waits, so
clients with connection pools (gcsfs/aiohttp) stall. This launcher swaps in
``ThreadingHTTPServer`` (same handler, one thread per connection). The emulator's
storage was not written for threads: it saves all its metadata (resumable
sessions included) with ``json.dumps`` of dicts that other requests change
meanwhile ("dictionary changed size during iteration"). A request that fails
there after it closed its session answers 500, and the client's retry then gets
a 404 for its own upload. So the metadata is saved by one thread at a time, and
saved again when a dict changed under it. Files on disk are written atomically
(a temporary file, then a rename), so a killed emulator restarts from whole
metadata. Then the emulator's own command line runs:

    python -m pyckpt.testing.gcs_emulator start --host 127.0.0.1 --port P --in-memory
"""

import os
import sys
import threading
from http import server

import gcp_storage_emulator.server as emulator
import gcp_storage_emulator.storage as storage

_SAVING = threading.Lock()
_save = storage.Storage._write_config_to_file


def _save_safely(self):
    with _SAVING:
        for _ in range(50):  # bounded: a dict changed during json.dumps, try again
            try:
                return _save(self)
            except RuntimeError:
                continue
        return _save(self)


_write_bytes = storage._FileStore.write_bytes


def _write_atomically(self, rel, content):
    """A file written on disk appears whole or not at all (a temporary file, then
    ``os.replace``): the emulator rewrites its metadata file at every change, and a
    kill in the middle of that write (the conformance tests kill it) left an empty
    file that the restarted emulator could not read."""
    if self._use_memory:
        return _write_bytes(self, rel, content)
    path = self._disk_path(self._norm(rel))
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f"{path.name}.tmp-{os.getpid()}-{threading.get_ident()}")
    tmp.write_bytes(content)
    os.replace(tmp, path)


def install() -> None:
    """Applies the changes above to the emulator's modules, in this process only (the
    launcher's own): the threaded server replaces ``http.server.HTTPServer`` for
    every user of that module, so importing this module changes nothing."""
    emulator.server.HTTPServer = server.ThreadingHTTPServer
    storage.Storage._write_config_to_file = _save_safely
    storage._FileStore.write_bytes = _write_atomically


if __name__ == "__main__":
    install()
    from gcp_storage_emulator.__main__ import main  # after install(): it may bind names

    sys.exit(main())
