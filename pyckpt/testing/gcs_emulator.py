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
saved again when a dict changed under it. Then the emulator's own command line
runs:

    python -m pyckpt.testing.gcs_emulator start --host 127.0.0.1 --port P --in-memory
"""

import sys
import threading
from http import server

import gcp_storage_emulator.server as emulator
import gcp_storage_emulator.storage as storage

emulator.server.HTTPServer = server.ThreadingHTTPServer

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


storage.Storage._write_config_to_file = _save_safely

from gcp_storage_emulator.__main__ import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
