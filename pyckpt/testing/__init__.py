"""Test utilities shipped with pyckpt, for its own tests and for users' tests:

- ``servers``: real S3 (SeaweedFS, moto) and GCS (gcp-storage-emulator) servers
  started on 127.0.0.1 for the duration of a test session;
- ``faulty``: an fsspec filesystem that wraps another one and injects faults
  (fail the Nth request, fail a fraction, add latency, cut writes short) and
  counts requests and bytes;
- ``store_suite``: the conformance tests every storage backend passes.
"""

from .faulty import FaultyFileSystem, Faults

__all__ = ["FaultyFileSystem", "Faults"]
