"""Staging: copying live values (host arrays and DeviceArrays) into host buffers,
telling the consumer as soon as each one has landed.

``stage_values`` is the one place where a save moves device values to the host.
It issues every device-to-host copy at once (``issue_copies``: a save issues
them before it plans its files, so the planning overlaps the copies), copies
the host values meanwhile, then waits for the device copies in the order the
writers need them and calls ``mark(i)`` for each as it lands. The C++ writers
(``_core.StagedWrite`` in external mode) start on a value when it is marked, so
a blocking save from the device takes about max(copy, disk), not their sum.

It returns only when every copy has landed (also when one failed: no copy may
still write into a buffer the caller reuses), so the caller may change or free
the live values as soon as it returns: the contract of ``blocking=False``.
"""

from __future__ import annotations

from typing import Any, Callable, Collection, Sequence

import numpy as np

from .._native import core as _core
from .array import DeviceArray
from .engine import Ticket, group_by_engine

__all__ = ["stage_values", "has_device_values", "IssuedCopies", "issue_copies"]


def has_device_values(values: Sequence[Any]) -> bool:
    """Whether any of ``values`` lives in device memory."""
    return any(isinstance(v, DeviceArray) for v in values)


class IssuedCopies:
    """The device-to-host copies of one staging, issued and not yet waited for
    (``issue_copies``): ``land`` waits for them in the writers' order, ``abandon``
    lets them land after an error. One of the two must run."""

    def __init__(self, live: Sequence[Any], staging: Sequence[np.ndarray],
                 skip: Collection[int] = ()) -> None:
        n = len(live)
        if len(staging) != n:
            raise ValueError("one staging buffer per live value")
        self.live, self.staging, self.skip = live, staging, skip
        self.tickets: dict[int, Ticket] = {}
        try:
            for eng, idxs in group_by_engine(live).items():
                idxs = [i for i in idxs if i not in skip]
                for i, t in zip(idxs, eng.to_host([live[i] for i in idxs],
                                                  [staging[i] for i in idxs])):
                    self.tickets[i] = t
        except BaseException:
            self.abandon()
            raise

    def land(self, *, order: Sequence[int] | None = None,
             mark: Callable[[int], None] | None = None, threads: int = 0) -> None:
        """Copies the host values (in parallel, while the device copies fly), then waits
        for the device copies in ``order``, calling ``mark(i)`` for each value as it is
        in its staging array. Returns once every copy landed (also after an error)."""
        live, staging = self.live, self.staging
        order = list(range(len(live))) if order is None else list(order)
        mark = mark or (lambda i: None)
        try:
            host = [i for i in order if i not in self.tickets and i not in self.skip]
            copy = [i for i in host if staging[i] is not live[i]]
            if copy:
                _core.copy_arrays([live[i] for i in copy], [staging[i] for i in copy], threads)
            for i in host:
                mark(i)
            for i in order:
                t = self.tickets.pop(i, None)
                if t is not None:
                    t.wait()
                    mark(i)
        finally:
            self.abandon()

    def abandon(self) -> None:
        """Waits for every copy still in flight (errors ignored: an earlier one is
        being raised), so that no copy writes into a buffer after this returns."""
        while self.tickets:
            _, t = self.tickets.popitem()
            try:
                t.wait()
            except BaseException:  # noqa: BLE001 - the first error is the one raised
                pass


def issue_copies(live: Sequence[Any], staging: Sequence[np.ndarray],
                 skip: Collection[int] = ()) -> IssuedCopies:
    """Issues the device-to-host copy of every DeviceArray of ``live`` (but those
    at the indices in ``skip``) into its staging array, in the order given (each
    engine orders them after the work already queued on its device);
    ``IssuedCopies.land`` finishes the staging (give it an ``order`` without the
    skipped indices)."""
    return IssuedCopies(live, staging, skip)


def stage_values(live: Sequence[Any], staging: Sequence[np.ndarray], *,
                 order: Sequence[int] | None = None,
                 mark: Callable[[int], None] | None = None, threads: int = 0) -> None:
    """Copies each live value into its staging array (module doc). A staging
    array that *is* its live array is not copied, only marked."""
    issue_copies(live, staging).land(order=order, mark=mark, threads=threads)
