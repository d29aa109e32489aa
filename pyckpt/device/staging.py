"""Staging: copying live values (host arrays and DeviceArrays) into host buffers,
telling the consumer as soon as each one has landed.

``stage_values`` is the one place where a save moves device values to the host.
It issues every device-to-host copy at once, in the order the writers need
them (each engine orders its copies after the work already queued on the
device), copies the host values meanwhile, then waits for the device copies in
that order and calls ``mark(i)`` for each as it lands. The C++ writers
(``_core.StagedWrite`` in external mode) start on a value when it is marked, so
a blocking save from the device takes about max(copy, disk), not their sum.

It returns only when every copy has landed (also when one failed: no copy may
still write into a buffer the caller reuses), so the caller may change or free
the live values as soon as it returns: the contract of ``blocking=False``.
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

import numpy as np

from .._native import core as _core
from .array import DeviceArray
from .engine import Ticket, group_by_engine

__all__ = ["stage_values", "has_device_values"]


def has_device_values(values: Sequence[Any]) -> bool:
    """Whether any of ``values`` lives in device memory."""
    return any(isinstance(v, DeviceArray) for v in values)


def stage_values(live: Sequence[Any], staging: Sequence[np.ndarray], *,
                 order: Sequence[int] | None = None,
                 mark: Callable[[int], None] | None = None, threads: int = 0) -> None:
    """Copies each live value into its staging array (module doc). A staging
    array that *is* its live array is not copied, only marked."""
    n = len(live)
    if len(staging) != n:
        raise ValueError("one staging buffer per live value")
    order = list(range(n)) if order is None else list(order)
    rank = {i: r for r, i in enumerate(order)}
    mark = mark or (lambda i: None)
    pending: list[tuple[int, int, Ticket]] = []
    try:
        for eng, idxs in group_by_engine(live).items():
            idxs.sort(key=rank.__getitem__)
            tickets = eng.to_host([live[i] for i in idxs], [staging[i] for i in idxs])
            pending.extend((rank[i], i, t) for i, t in zip(idxs, tickets))
        pending.sort(key=lambda p: p[0])
        host = [i for i in order if not isinstance(live[i], DeviceArray)]
        copy = [i for i in host if staging[i] is not live[i]]
        if copy:  # while the device copies fly
            _core.copy_arrays([live[i] for i in copy], [staging[i] for i in copy], threads)
        for i in host:
            mark(i)
        while pending:
            _, i, t = pending[0]
            t.wait()
            pending.pop(0)
            mark(i)
    finally:
        for _, _, t in pending:  # after an error: let every issued copy land first
            try:
                t.wait()
            except BaseException:  # noqa: BLE001 - the first error is the one raised
                pass
