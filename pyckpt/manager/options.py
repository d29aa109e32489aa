"""The options of a ``CheckpointManager`` beyond docs/API.md's positional signature,
grouped by concern (docs/API.md section 3): ``CheckpointManagerOptions`` holds the
background saves (``AsyncOptions``), the fast local tier (``LocalTierOptions``,
section 13), incremental saves (``IncrementalOptions``, section 18), the writer
lease, the clock and the communicator. Each group checks its own fields when it is
built (``ValueError`` naming the field); the checks that need the job's size run
when the manager starts (``check_world``). The manager's old keyword-only
arguments map onto these fields (``from_keywords``), with a DeprecationWarning.
"""

from __future__ import annotations

import dataclasses
import time
import warnings
from typing import TYPE_CHECKING, Any, Callable

from ..device.budgets import check_budget, check_device_budget

if TYPE_CHECKING:
    from ..workers.comm import Communicator

__all__ = ["AsyncOptions", "CheckpointManagerOptions", "IncrementalOptions",
           "LocalTierOptions", "KEYWORDS"]


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _check_count(field: str, value: Any, minimum: int, none_ok: bool = True) -> None:
    if value is None and none_ok:
        return
    if type(value) is not int or value < minimum:
        none = "None or " if none_ok else ""
        raise ValueError(f"{field} must be {none}an integer >= {minimum}, not {value!r}")


def _check_seconds(field: str, value: Any, minimum: float, strict: bool,
                   none_ok: bool = True) -> None:
    if value is None and none_ok:
        return
    if not _is_number(value) or value < minimum or (strict and value == minimum):
        bound = f"> {minimum}" if strict else f">= {minimum}"
        none = "None or " if none_ok else ""
        raise ValueError(f"{field} must be {none}a number of seconds {bound}, not {value!r}")


@dataclasses.dataclass(frozen=True)
class AsyncOptions:
    """Background saves (``save(blocking=False)``) and device staging.

    - ``max_async_bytes``: a background save of more bytes than this is made
      blocking (no staging copy of the state); 0: every save blocks; None: no limit.
    - ``max_pinned_bytes``: device values are staged through a ring of at most this
      much pinned memory per device instead of a pinned copy of the whole state
      (docs/API.md section 10); None: no budget.
    - ``max_device_snapshot_bytes``: a background save of values in device memory
      first copies them into device buffers kept between saves (a device-to-device
      copy: the call returns after it) and drains that snapshot to storage in the
      background, when the state's device bytes fit this per device; None
      (automatic): when they fit the device's free memory less max(2 GiB, 10% of
      the device's memory); 0: never (the values are copied to pinned host memory
      in the call). The snapshot's device memory stays held until ``close()``.
    """

    max_async_bytes: int | None = None
    max_pinned_bytes: int | None = None
    max_device_snapshot_bytes: int | None = None

    def __post_init__(self) -> None:
        if self.max_async_bytes is not None and (not _is_number(self.max_async_bytes)
                                                 or self.max_async_bytes < 0):
            raise ValueError(f"max_async_bytes must be None or a number of bytes >= 0, not "
                             f"{self.max_async_bytes!r}")
        check_budget(self.max_pinned_bytes)
        check_device_budget(self.max_device_snapshot_bytes)


@dataclasses.dataclass(frozen=True)
class LocalTierOptions:
    """A fast local tier in front of the manager's ``directory`` (docs/API.md
    section 13): every save goes to ``directory`` here, some are persisted to the
    durable one in the background.

    - ``directory``: the local tier (a local path or URL).
    - ``max_to_keep``: checkpoints kept in the local tier (None: all).
    - ``persist_every``: persist every N-th save; ``persist_interval_seconds``: a
      save is persisted when at least that long passed since the last persist
      started; neither: every save is persisted; both: when either says so.
    - ``replicate``: several workers only: each worker's files are also written
      to the local tiers of the next ``replicate`` workers.
    """

    directory: Any
    max_to_keep: int | None = 2
    persist_every: int | None = None
    persist_interval_seconds: float | None = None
    replicate: int = 0

    def __post_init__(self) -> None:
        if self.directory is None:
            raise ValueError("LocalTierOptions.directory is required (the local tier's path)")
        _check_count("local_tier.max_to_keep", self.max_to_keep, 1)
        _check_count("local_tier.persist_every", self.persist_every, 1)
        _check_seconds("local_tier.persist_interval_seconds", self.persist_interval_seconds,
                       0, strict=False)
        _check_count("local_tier.replicate", self.replicate, 0, none_ok=False)


@dataclasses.dataclass(frozen=True)
class IncrementalOptions:
    """Incremental saves (docs/API.md section 18): each save writes only the
    tensors that changed since the checkpoint saved last.

    - ``full_save_every``: one save in this many is full (saves 1, 11, 21... with
      10); None: only when most of the data changed.
    """

    full_save_every: int | None = 10

    def __post_init__(self) -> None:
        _check_count("full_save_every", self.full_save_every, 1)


@dataclasses.dataclass(frozen=True)
class CheckpointManagerOptions:
    """The options of a ``CheckpointManager`` (``options=``) beyond its positional
    signature (docs/API.md section 3).

    - ``async_options``: background saves and device staging (``AsyncOptions``).
    - ``local_tier``: a fast local tier in front of the directory
      (``LocalTierOptions``); None: none.
    - ``incremental``: incremental saves (``IncrementalOptions``); None: every
      save is full.
    - ``lease_seconds``: how long another host's writer lease counts as live
      without a heartbeat.
    - ``clock``: the time source (tests of ``keep_checkpoint_every_n_hours``).
    - ``comm``: the communicator of a multi-worker run (``pyckpt.dist``); None: an
      initialized torch.distributed group, else one process.
    """

    async_options: AsyncOptions = dataclasses.field(default_factory=AsyncOptions)
    local_tier: LocalTierOptions | None = None
    incremental: IncrementalOptions | None = None
    lease_seconds: float = 600.0
    clock: Callable[[], float] = time.time
    comm: Communicator | None = None

    def __post_init__(self) -> None:
        for field, cls in (("async_options", AsyncOptions), ("local_tier", LocalTierOptions),
                           ("incremental", IncrementalOptions)):
            value = getattr(self, field)
            if not (isinstance(value, cls) or (value is None and field != "async_options")):
                raise TypeError(f"CheckpointManagerOptions.{field} must be a {cls.__name__}"
                                f"{'' if field == 'async_options' else ' or None'}, not "
                                f"{value!r}")
        _check_seconds("lease_seconds", self.lease_seconds, 0, strict=True, none_ok=False)
        if not callable(self.clock):
            raise ValueError(f"clock must be a callable returning seconds, not {self.clock!r}")

    def check_world(self, world_size: int) -> None:
        """The checks that need the job's size (the manager's resolved communicator)."""
        tier = self.local_tier
        if tier is None:
            return
        if world_size > 1 and self.incremental is not None:
            raise NotImplementedError(
                "incremental saves are not supported yet with a local tier (local_dir) in a "
                "multi-worker job (node-local tiers): use one or the other (docs/API.md "
                "section 18)")
        if world_size > 1 and tier.replicate >= world_size:
            raise ValueError(f"replicate must be between 0 and {world_size - 1} "
                             f"(the other workers), not {tier.replicate}")
        if tier.replicate and world_size == 1:
            raise ValueError("replicate needs a multi-worker job (comm)")


# The manager's old keyword-only arguments and the options field each one became.
KEYWORDS: dict[str, str] = {
    "max_async_bytes": "async_options.max_async_bytes",
    "max_pinned_bytes": "async_options.max_pinned_bytes",
    "lease_seconds": "lease_seconds",
    "clock": "clock",
    "comm": "comm",
    "local_dir": "local_tier.directory",
    "local_max_to_keep": "local_tier.max_to_keep",
    "persist_every": "local_tier.persist_every",
    "persist_interval_seconds": "local_tier.persist_interval_seconds",
    "replicate": "local_tier.replicate",
    "incremental": "incremental",
    "full_save_every": "incremental.full_save_every",
}
_DEFAULTS = CheckpointManagerOptions()
_ASYNC = ("max_async_bytes", "max_pinned_bytes")
_TIER = ("local_max_to_keep", "persist_every", "persist_interval_seconds", "replicate")
_GROUPS = {"async_options": "AsyncOptions", "local_tier": "LocalTierOptions",
           "incremental": "IncrementalOptions"}


def _warn(name: str, stacklevel: int) -> None:
    field = KEYWORDS[name]
    group, _, sub = field.partition(".")
    if name == "incremental":
        spelled = "incremental=IncrementalOptions()"
    elif sub:
        spelled = f"{group}={_GROUPS[group]}({sub}=...)"
    else:
        spelled = f"{field}=..."
    warnings.warn(f"CheckpointManager keyword {name}= is deprecated: use options.{field}, "
                  f"options=CheckpointManagerOptions({spelled}) (docs/API.md section 3)",
                  DeprecationWarning, stacklevel=stacklevel + 1)


def _conflict(name: str, field: str) -> ValueError:
    return ValueError(f"CheckpointManager got both {name}= and options.{field}: pass one "
                      f"(the keyword {name}= is deprecated)")


def from_keywords(options: CheckpointManagerOptions | None, old: dict[str, Any],
                  stacklevel: int = 2) -> CheckpointManagerOptions:
    """``options`` (None: the defaults) with the old keyword arguments ``old`` folded
    in: one DeprecationWarning per keyword (``stacklevel`` counted from the caller of
    this function); ValueError when ``options`` sets the same field; TypeError for a
    name that never was a keyword of the manager."""
    unknown = sorted(set(old) - set(KEYWORDS))
    if unknown:
        raise TypeError(f"CheckpointManager() got an unexpected keyword argument {unknown[0]!r}")
    for name in old:
        _warn(name, stacklevel + 1)
    try:
        return _fold(options, old)
    except ValueError as e:  # a field's error names the keyword it came from too
        head = str(e).split(" must ")[0]
        names = [n for n in old if KEYWORDS[n].split(".")[-1] in head and n not in head]
        if not names:
            raise
        raise ValueError(f"{e} (given as the keyword {names[0]}=)") from None


def _fold(options: CheckpointManagerOptions | None,
          old: dict[str, Any]) -> CheckpointManagerOptions:
    given = options is not None
    base = options if options is not None else _DEFAULTS
    top: dict[str, Any] = {}
    for name in ("lease_seconds", "clock", "comm"):
        if name in old:
            if given and getattr(base, name) != getattr(_DEFAULTS, name):
                raise _conflict(name, name)
            top[name] = old[name]
    if any(name in old for name in _ASYNC):
        staging = base.async_options
        fields = {}
        for name in _ASYNC:
            if name in old:
                if getattr(staging, name) is not None:
                    raise _conflict(name, KEYWORDS[name])
                fields[name] = old[name]
        top["async_options"] = dataclasses.replace(staging, **fields)
    if any(name in old for name in ("local_dir",) + _TIER):
        top["local_tier"] = _local_tier(base.local_tier, old)
    if "incremental" in old or "full_save_every" in old:
        every = old.get("full_save_every", 10)
        checked = IncrementalOptions(every)  # checked even when not incremental, as before
        if base.incremental is not None:
            name = "incremental" if "incremental" in old else "full_save_every"
            raise _conflict(name, KEYWORDS[name])
        top["incremental"] = checked if old.get("incremental") else None
    return dataclasses.replace(base, **top)


def _local_tier(tier: LocalTierOptions | None, old: dict[str, Any]) -> LocalTierOptions | None:
    if tier is not None:
        name = next(n for n in ("local_dir",) + _TIER if n in old)
        raise _conflict(name, "local_tier")
    fields = {KEYWORDS[n].split(".", 1)[1]: old[n] for n in _TIER if n in old}
    if old.get("local_dir") is not None:
        return LocalTierOptions(old["local_dir"], **fields)
    # without local_dir: the tier's defaults pass (and mean nothing), as before
    if fields.get("persist_every") is not None or fields.get("persist_interval_seconds") \
            is not None or fields.get("replicate"):
        raise ValueError("persist_every, persist_interval_seconds and replicate need a "
                         "local_dir (options.local_tier)")
    return None
