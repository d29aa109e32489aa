"""Running many requests at once on an event loop: all-or-nothing (the first
failure cancels the rest) or best effort within a time bound."""

from __future__ import annotations

import asyncio
from typing import Any, Awaitable, Iterable


async def gather_or_cancel(coros: Iterable[Awaitable[Any]]) -> list:
    """Like asyncio.gather, but the first failure cancels the other tasks (and waits,
    briefly, for them to stop) before it is raised."""
    tasks = [asyncio.ensure_future(c) for c in coros]
    try:
        pending = set(tasks)
        while pending:
            done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_EXCEPTION)
            for t in tasks:
                if t in done and not t.cancelled() and t.exception() is not None:
                    raise t.exception()  # type: ignore[misc]
        return [t.result() for t in tasks]
    finally:
        rest = [t for t in tasks if not t.done()]
        for t in rest:
            t.cancel()
        if rest:
            await asyncio.wait(rest, timeout=2.0)
        for t in tasks:
            if t.done() and not t.cancelled():
                t.exception()


async def bounded(jobs: list[tuple[str, Awaitable[Any]]], timeout: float) -> dict[str, Any]:
    """Runs the jobs concurrently for at most ``timeout`` seconds; returns, per label,
    None (done), the exception raised, or a TimeoutError for one still running."""
    tasks = {asyncio.ensure_future(c): label for label, c in jobs}
    if not tasks:
        return {}
    done, pending = await asyncio.wait(tasks, timeout=timeout)
    for t in pending:
        t.cancel()
    if pending:
        await asyncio.wait(pending, timeout=2.0)
    out: dict[str, Any] = {}
    for t, label in tasks.items():
        if t in pending or t.cancelled():
            out[label] = TimeoutError(f"no answer within {timeout:g} s")
        else:
            out[label] = t.exception()
    return out
