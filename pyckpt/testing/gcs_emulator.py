"""Runs gcp-storage-emulator with a threading HTTP server.

The emulator serves from a single-threaded ``http.server.HTTPServer``: while one
client keeps a keep-alive connection open, every other connection waits, so
clients with connection pools (gcsfs/aiohttp) stall. This launcher swaps in
``ThreadingHTTPServer`` (same handler, one thread per connection) and then runs
the emulator's own command line:

    python -m pyckpt.testing.gcs_emulator start --host 127.0.0.1 --port P --in-memory
"""

import sys
from http import server

import gcp_storage_emulator.server as emulator

emulator.server.HTTPServer = server.ThreadingHTTPServer

from gcp_storage_emulator.__main__ import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
