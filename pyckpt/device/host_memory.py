"""Host memory whose pages exist before it is used: ``touched(nbytes)``.

A fresh ``np.empty`` of several GB has no pages yet: the first write to each
page faults it in (the kernel zeroes it), about 1-2 GB/s on one thread. Pinning
such memory (``cudaHostAlloc``, ``torch.empty(pin_memory=True)``) pays that on
one thread inside the call (2.4 s for 4.25 GB on an H200 host), and a copy into
it pays it on the copy's path. ``touched`` zeroes the buffer in slices on
several threads at once (numpy releases the GIL while it
fills), so the faults run in parallel; registering the touched buffer with the
device (``cudaHostRegister``) then only locks pages that exist (0.1-0.2 s for
4.25 GB). The one home of pre-touched host buffers: the pinned staging buffers
(``TorchCudaEngine.alloc_host``) and the plain ones a first save uses while the
pinned pool is prepared (``buffers.StagingBuffers(pinned=False)``).
"""

from __future__ import annotations

import os
import threading

import numpy as np

__all__ = ["touched", "touch_threads"]

_SLICE = 64 << 20  # bytes per thread at least: smaller buffers are touched on one thread


def touch_threads(nbytes: int) -> int:
    """Threads ``touched`` uses for ``nbytes``: one per 64 MiB, at most one per core
    (and 16)."""
    return max(1, min(os.cpu_count() or 1, 16, int(nbytes) // _SLICE))


def touched(nbytes: int) -> np.ndarray:
    """A 1-D uint8 host buffer of ``nbytes``, every page of it written (zeroed) by
    ``touch_threads(nbytes)`` threads in parallel (module doc)."""
    n = int(nbytes)
    buf = np.empty(n, dtype=np.uint8)
    threads = touch_threads(n)
    if threads == 1:
        buf.fill(0)
        return buf
    step = -(-n // threads)
    step = (step + 4095) // 4096 * 4096  # whole pages per thread
    errors: list[BaseException] = []

    def fill(begin: int) -> None:
        try:
            buf[begin:begin + step].fill(0)  # numpy fills without the GIL
        except BaseException as e:  # noqa: BLE001 - raised below, in the caller
            errors.append(e)

    workers = [threading.Thread(target=fill, args=(b,), name="pyckpt-touch", daemon=True)
               for b in range(0, n, step)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    if errors:
        raise errors[0]
    return buf
