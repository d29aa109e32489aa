"""Stores reached through fsspec: S3 (s3fs), GCS (gcsfs), memory, and any other
fsspec filesystem. Object stores have no rename: a checkpoint is committed by
writing its index with one PUT after every shard upload was acknowledged and
its size confirmed (docs/PROTOCOL.md, "Object stores")."""

from __future__ import annotations

import functools
import threading
from typing import Any, Iterable, Sequence

import numpy as np

from .base import Store
from .options import RemoteOptions
from .remote_io import RemoteIO
from .retry import retry_sync

_CACHE: dict[Any, "FsspecStore"] = {}
_CACHE_LOCK = threading.Lock()


def _freeze(x: Any) -> Any:
    if isinstance(x, dict):
        return tuple(sorted((k, _freeze(v)) for k, v in x.items()))
    if isinstance(x, (list, tuple)):
        return tuple(_freeze(v) for v in x)
    try:
        hash(x)
        return x
    except TypeError:
        return id(x)


class _DiscardOnError:
    def __init__(self, f: Any) -> None:
        self.f = f

    def write(self, data: Any) -> int:
        return self.f.write(data)

    def __enter__(self) -> "_DiscardOnError":
        return self

    def __exit__(self, exc_type: Any, *exc: Any) -> None:
        if exc_type is not None and hasattr(self.f, "discard"):
            self.f.discard()
        else:
            self.f.close()


class FsspecStore(Store):
    local = False
    atomic_rename = False

    def __init__(self, fs: Any, opts: RemoteOptions) -> None:
        self.fs = fs
        self.opts = opts
        proto = fs.protocol
        self.protocol = proto[0] if isinstance(proto, (tuple, list)) else proto
        self.io = RemoteIO(fs, opts, self.url)

    @classmethod
    def for_url(cls, url: str, storage_options: dict | None) -> tuple["FsspecStore", str]:
        import fsspec

        opts, fs_options = RemoteOptions.split(storage_options)
        from .registry import check_protocol

        check_protocol(url)
        fs, path = fsspec.core.url_to_fs(url, **fs_options)
        key = (type(fs), _freeze(fs_options), url.split("://", 1)[0], opts.key(), id(fs))
        with _CACHE_LOCK:
            store = _CACHE.get(key)
            if store is None:
                store = _CACHE[key] = cls(fs, opts)
        return store, path.rstrip("/")

    # -- paths ----------------------------------------------------------------------
    def join(self, *parts: str) -> str:
        return "/".join(p.strip("/") if i else p.rstrip("/") for i, p in enumerate(parts) if p)

    def url(self, path: str) -> str:
        # memory:// paths carry a leading "/" inside fsspec; show them as users write them
        return self.fs.unstrip_protocol(path).replace("memory:///", "memory://", 1)

    def _call(self, name: str, *args: Any, **kwargs: Any) -> Any:
        """fs.<name>(*args): through the async API with a timeout where the filesystem
        has one (so a server that stops answering cannot hang the caller), else direct."""
        if getattr(self.fs, "async_impl", False) and hasattr(self.fs, "_" + name):
            from fsspec.asyn import sync

            return sync(self.fs.loop, getattr(self.fs, "_" + name), *args,
                        timeout=self.opts.timeout, **kwargs)
        return getattr(self.fs, name)(*args, **kwargs)

    def _fresh(self, path: str) -> None:
        """Forgets cached listings: another process may have written since."""
        try:
            self.fs.invalidate_cache(path)
        except Exception:  # noqa: BLE001 - not every filesystem caches
            pass

    # -- reads ----------------------------------------------------------------------
    def exists(self, path: str) -> bool:
        self._fresh(path)
        return retry_sync(f"existence check of {self.url(path)}", self.opts,
                          lambda: self._call("exists", path))

    def isdir(self, path: str) -> bool:
        self._fresh(path)
        return retry_sync(f"listing {self.url(path)}", self.opts, lambda: self._call("isdir", path))

    def listdir(self, path: str) -> list[str]:
        self._fresh(path)
        try:
            entries = retry_sync(f"listing {self.url(path)}", self.opts,
                                 lambda: self._call("ls", path, detail=False))
        except (FileNotFoundError, NotADirectoryError):
            return []
        base = path.rstrip("/")
        out = []
        for e in entries:
            e = e.rstrip("/")
            if e != base and e.startswith(base + "/"):
                out.append(e[len(base) + 1:])
            elif e != base and "/" not in e:
                out.append(e)
        return out

    def size(self, path: str) -> int:
        self._fresh(path)
        info = retry_sync(f"size of {self.url(path)}", self.opts, lambda: self._call("info", path))
        return int(info["size"])

    def mtime(self, path: str) -> float | None:
        try:
            info = self.fs.info(path)
        except (FileNotFoundError, OSError):
            return None
        for k in ("mtime", "LastModified", "updated", "created"):
            v = info.get(k)
            if hasattr(v, "timestamp"):
                return float(v.timestamp())
            if isinstance(v, (int, float)):
                return float(v)
            if isinstance(v, str):
                try:
                    import datetime

                    return datetime.datetime.fromisoformat(v.replace("Z", "+00:00")).timestamp()
                except ValueError:
                    pass
        return None

    def read_bytes(self, path: str) -> bytes:
        return retry_sync(f"read of {self.url(path)}", self.opts,
                          lambda: self._call("cat_file", path))

    def read_ranges(self, path: str, ranges: Sequence[tuple[int, int]]) -> list[bytes]:
        return self.io.fetch([(path, s, e) for s, e in ranges])

    # -- writes ---------------------------------------------------------------------
    def makedirs(self, path: str) -> None:
        try:
            self.fs.makedirs(path, exist_ok=True)
        except (FileExistsError, NotImplementedError):
            pass

    def write_atomic(self, path: str, data: bytes) -> None:
        """One PUT: object stores make a whole object visible at once."""
        retry_sync(f"write of {self.url(path)}", self.opts,
                   lambda: self._call("pipe_file", path, data))
        self._fresh(path)

    def open_write(self, path: str) -> Any:
        """fsspec's streamed write: on object stores the object appears on close; a
        failed write is discarded (``discard()``) so no partial object is left."""
        return _DiscardOnError(self.fs.open(path, "wb", block_size=max(self.opts.part_size,
                                                                      5 << 20)))

    def delete(self, paths: Iterable[str]) -> None:
        for p in list(paths):
            try:
                retry_sync(f"delete of {self.url(p)}", self.opts,
                           functools.partial(self._call, "rm_file", p))
            except FileNotFoundError:
                pass
            self._fresh(p)

    def rmtree(self, path: str) -> None:
        self._fresh(path)
        try:
            retry_sync(f"delete of {self.url(path)}", self.opts,
                       lambda: self._call("rm", path, recursive=True))
        except FileNotFoundError:
            pass
        if hasattr(self.fs, "call_s3") and hasattr(self.fs, "split_path"):
            # S3 gateways over a filesystem (SeaweedFS, MinIO) keep the emptied
            # "directory"; deleting the key with a trailing slash removes it.
            bucket, key, _ = self.fs.split_path(path)
            try:
                self.fs.call_s3("delete_object", Bucket=bucket, Key=key.rstrip("/") + "/")
            except Exception:  # noqa: BLE001 - best effort; plain S3 has nothing to delete
                pass
        self._fresh(path)

    # -- engine hooks -----------------------------------------------------------------
    def write_shards(self, paths: list[str], sizes: Sequence[int], keys: list[str],
                     arrays: list[np.ndarray], file_idx: np.ndarray, offsets: np.ndarray,
                     options: Any) -> np.ndarray:
        """Checksums (C++, parallel) then uploads every shard file in parallel parts;
        confirms sizes."""
        from .. import _core
        from .base import shard_layouts

        crcs, _ = _core.compute_checksums(keys, arrays, options.chunk_size, options.threads)
        layouts = shard_layouts(paths, sizes, arrays, file_idx, offsets)
        self.io.upload(layouts)
        self.confirm_sizes({p: lay.size for p, lay in layouts})
        return crcs

    def fetch(self, ranges: Sequence[tuple[str, int, int]]) -> list[bytes]:
        return self.io.fetch(ranges)
