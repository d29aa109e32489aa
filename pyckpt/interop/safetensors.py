"""safetensors files to and from pyckpt checkpoints (``pyckpt cp``), and Hugging Face
safetensors folders from any checkpoint (``export_hf``): the reading and
writing of the format is the codec's (``pyckpt.codecs.safetensors``), checkpoints
are opened through ``sources.open_source`` and written through ``saving``."""

from __future__ import annotations

import concurrent.futures
import json
import math
import os
import re
import threading
from typing import Any, Callable, Sequence

from .. import saving
from ..codecs.safetensors import (SafetensorsFile, check_writable, detect, dtype_name,
                                  is_safetensors_path, write_file)
from ..codecs.hf_folder import INDEX_FILE, SINGLE_FILE, is_shard_name, shard_name
from ..errors import CheckpointError, add_note
from ..format.read_plan import ReadPlan
from ..format.source import CheckpointSource
from ..selection import map_keys, select_keys
from ..sources import open_source
from ..storage import resolve
from ..tree import validate_keys
from ..workers.comm import Communicator, SingleComm
from .hf_files import config_files

__all__ = ["is_safetensors_path", "detect", "SafetensorsFile", "to_checkpoint",
           "from_checkpoint", "export_hf", "parse_size", "dtype_name"]


def to_checkpoint(src: Any, dst: Any, *, src_options: dict | None = None,
                  dst_options: dict | None = None,
                  progress: Callable[[int, int], Any] | None = None) -> None:
    """A safetensors file (a path, or an opened SafetensorsFile) -> a pyckpt
    checkpoint (dtypes and metadata kept)."""
    if not isinstance(src, CheckpointSource):
        src = SafetensorsFile(*resolve(src, src_options))
    validate_keys(list(src.keys))  # a foreign file's names become stored keys
    values = ReadPlan(src, range(len(src.keys))).execute()
    saving.write(saving.SavePlan.build(
        [saving.Item(k, v) for k, v in zip(src.keys, values)], dst, storage_options=dst_options,
        comm=SingleComm(), progress=progress,
        metadata={"safetensors": src.metadata} if src.metadata else None))


def from_checkpoint(src: Any, dst: Any, *, src_options: dict | None = None,
                    dst_options: dict | None = None,
                    progress: Callable[[int, int], Any] | None = None) -> None:
    """A checkpoint (a path of any format, or any opened source) -> a safetensors
    file, tensor by tensor (verified reads)."""
    source = open_source(src, src_options)
    check_writable(source, range(len(source.keys)), "safetensors file")
    write_file(source, *resolve(dst, dst_options), progress=progress)


_UNITS = {"": 1, "B": 1, "KB": 10**3, "MB": 10**6, "GB": 10**9, "TB": 10**12,
          "KIB": 2**10, "MIB": 2**20, "GIB": 2**30, "TIB": 2**40}


def parse_size(size: Any) -> int:
    """Bytes of ``size``: an int, or a string such as ``"5GB"`` (decimal, as in
    transformers: ``200KB`` = 200,000 bytes) or ``"2GiB"`` (binary)."""
    if isinstance(size, int) and not isinstance(size, bool):
        n = size
    else:
        m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([KMGT]I?B|B)?\s*", str(size), re.IGNORECASE)
        if m is None:
            raise ValueError(f"max_shard_size {size!r} is not a size such as '5GB' or 10**9")
        n = int(float(m.group(1)) * _UNITS[(m.group(2) or "").upper()])
    if n <= 0:
        raise ValueError(f"max_shard_size must be positive, not {size!r}")
    return n


def plan_shards(sizes: Sequence[int], limit: int) -> list[list[int]]:
    """Positions grouped into files in order, as transformers splits a state dict: a
    file takes tensors while they fit in ``limit`` bytes; a tensor larger than the
    limit gets a file of its own."""
    shards: list[list[int]] = []
    total = 0
    for pos, n in enumerate(sizes):
        if not shards or (shards[-1] and total + n > limit):
            shards.append([])
            total = 0
        shards[-1].append(pos)
        total += n
    return shards or [[]]


#: files one worker writes at once (each with its own read-ahead, READ_AHEAD_BYTES)
FILES_IN_FLIGHT = max(1, min(4, os.cpu_count() or 1))


def _write_files(source: CheckpointSource, store: Any, folder: str, files: list[str],
                 shards: list[list[int]], indices: list[int], names: list[str],
                 sizes: list[int], mine: Sequence[int],
                 progress: Callable[[int, int], Any] | None) -> None:
    """Writes this worker's files ``mine``, up to ``FILES_IN_FLIGHT`` at once; progress
    counts the bytes of all of them. After a failure no further file starts; raises
    the first failure once the files under way ended."""
    total = sum(sizes[p] for j in mine for p in shards[j])
    done, lock = [0] * len(files), threading.Lock()

    def one(j: int) -> None:
        def report(n: int, _: int) -> None:
            with lock:
                done[j] = n
                if progress is not None:
                    progress(sum(done), total)
        write_file(source, store, store.join(folder, files[j]), report,
                   indices=[indices[p] for p in shards[j]],
                   names=[names[p] for p in shards[j]], metadata={"format": "pt"})

    with concurrent.futures.ThreadPoolExecutor(FILES_IN_FLIGHT,
                                               thread_name_prefix="pyckpt-export") as pool:
        futures = [pool.submit(one, j) for j in mine]
        concurrent.futures.wait(futures, return_when=concurrent.futures.FIRST_EXCEPTION)
        for f in futures:
            f.cancel()  # those not started yet
    for f in futures:
        if not f.cancelled():
            f.result()


def _discard(store: Any, folder: str, names: list[str], error: BaseException) -> None:
    """Best effort, after a failed export: deletes the shard files it was writing
    (a folder without its index is no checkpoint); what it could not delete is a note
    on ``error``."""
    try:
        store.remove(folder, (store.join(folder, n) for n in names))
    except OSError as e:
        add_note(error, f"the shard files written so far were left in {store.url(folder)}: {e}")


def _reads_from(source: CheckpointSource, store: Any, folder: str) -> bool:
    """Whether ``source`` is a safetensors file or folder in ``folder`` (an export there
    would replace the files it reads)."""
    url = store.url(folder).rstrip("/")
    if source.format == "hf-safetensors":
        return source.url.rstrip("/") == url
    return source.format == "safetensors" and source.url.rpartition("/")[0] == url


def export_hf(src: Any, dst_dir: Any, *, max_shard_size: Any = "5GB", select: Any = None,
              key_map: Any = None, config: Any = None, comm: Communicator | None = None,
              src_options: dict | None = None, dst_options: dict | None = None,
              config_options: dict | None = None,
              progress: Callable[[int, int], Any] | None = None) -> str:
    """Writes the checkpoint ``src`` (any format pyckpt reads; sharded tensors come
    assembled) as a Hugging Face safetensors folder at ``dst_dir``:
    ``model-0000i-of-0000N.safetensors`` files of at most ``max_shard_size`` bytes of
    tensors each, and ``model.safetensors.index.json`` (``metadata.total_size``,
    ``weight_map``), written last. ``select``/``key_map`` pick and rename keys as in
    ``pyckpt.load``. With ``comm`` every worker calls it: each writes its share of the
    files (file i by rank i mod world size), rank 0 the index once all are written.
    ``config`` (``hf_files.config_files``: a dict, a ``PretrainedConfig``, or a folder
    or file path, read with ``config_options``) writes ``config.json`` (and from a
    folder ``generation_config.json`` and tokenizer files) before the weights, so that
    ``from_pretrained(folder)`` works; it is read and checked before anything is
    written. Shard files of an earlier export that the new index does not name are
    removed, and an earlier ``model.safetensors`` (which transformers would read
    before the index) before anything is written. Returns the folder's URL."""
    limit = parse_size(max_shard_size)
    extra = config_files(config, config_options)
    source = open_source(src, src_options)
    keys = list(source.keys) if select is None else select_keys(list(source.keys), select)
    mapping = map_keys(keys, key_map)
    indices = [source.index[k] for k in keys if k in mapping]
    names = [mapping[source.keys[i]] for i in indices]
    check_writable(source, indices, "Hugging Face folder", names)
    sizes = [math.prod(source.shape(i)) * source.dtype(i).itemsize for i in indices]
    shards = plan_shards(sizes, limit)
    files = [shard_name(j + 1, len(shards)) for j in range(len(shards))]
    store, folder = resolve(dst_dir, dst_options)
    if _reads_from(source, store, folder):
        raise CheckpointError(f"export_hf would replace the files it reads: {source.url} is "
                              f"in {store.url(folder)}; export to another folder")
    rank, world = (0, 1) if comm is None else (comm.rank, comm.world_size)
    store.makedirs(folder)
    if rank == 0:  # an earlier export's index must never name a mix of old and new files,
        # nor an earlier single file stand in for the new ones
        store.remove(folder, [store.join(folder, n) for n in (INDEX_FILE, SINGLE_FILE)])
        for name, data in extra.items():
            store.write_atomic(store.join(folder, name), data)
    if comm is not None:
        comm.barrier()
    problem = None
    mine = range(rank, len(shards), world)
    try:
        _write_files(source, store, folder, files, shards, indices, names, sizes, mine,
                     progress)
    except Exception as e:  # noqa: BLE001 - every worker must hear of it
        _discard(store, folder, [files[j] for j in mine], e)
        if comm is None:
            raise
        problem = f"rank {rank}: {type(e).__name__}: {e}"
    if comm is not None:
        problems = [p for p in comm.all_gather(problem) if p is not None]
        if problems:
            raise CheckpointError(f"export of {store.url(folder)} failed; its index was not "
                                  "written:\n" + "\n".join(problems))
    if rank == 0:
        weight_map = {names[p]: files[j] for j, shard in enumerate(shards) for p in shard}
        index = {"metadata": {"total_size": sum(sizes)},
                 "weight_map": dict(sorted(weight_map.items()))}
        store.write_atomic(store.join(folder, INDEX_FILE),
                           (json.dumps(index, indent=2) + "\n").encode())
        stale = [n for n in store.listdir(folder) if is_shard_name(n) and n not in set(files)]
        if stale:
            store.remove(folder, (store.join(folder, n) for n in stale))
    if comm is not None:
        comm.barrier()
    return store.url(folder)
