"""pyckpt as Lightning's checkpoint storage: ``pyckpt.lightning.CheckpointIO``.

``Trainer(plugins=[pyckpt.lightning.CheckpointIO()])`` (also wrapped in Lightning's
``AsyncCheckpointIO``) writes every checkpoint Lightning makes (``ModelCheckpoint``,
``trainer.save_checkpoint``) as a pyckpt checkpoint at that path or fsspec URL, and
``trainer.fit(model, ckpt_path=...)`` resumes from one (docs/API.md section 16).
The Trainer may be ``lightning``'s or ``pytorch_lightning``'s: the plugin subclasses
the base class of each installed. ``load_from_checkpoint(Model, path, ...)`` is
``Model.load_from_checkpoint(path, ...)`` for a pyckpt checkpoint.

How a checkpoint dict is stored:

- it is a tree of pyckpt's format (``pyckpt.load`` and the CLI read it): tensors
  and numpy arrays are tensors of the checkpoint; Python ``int``/``float``/``bool``
  /``complex`` and numpy scalars are 0-d tensors that come back in their own type;
  ``str``, ``None`` and ``bytes`` are kept in the tree; dicts (``str`` and ``int``
  keys), lists and tuples are the tree's containers;
- a dict key is one component of the ``/``-joined tensor keys, with ``%`` and ``/``
  (and the parts ``""``, ``.``, ``..``) percent-escaped, so that checkpoint paths as
  keys (``ModelCheckpoint``'s ``best_k_models``) stay one component; the tree keeps
  the keys themselves;
- what the tree cannot say is recorded in the checkpoint's metadata under
  ``"pyckpt.lightning"``, by path: ``OrderedDict`` (with a state dict's ``_metadata``,
  the module versions ``load_state_dict`` reads), Lightning's ``AttributeDict``,
  ``torch.Size``, ``bytearray``, ``nn.Parameter`` and tensors that require grad;
- anything else (enums, dataclasses, classes, sets, other subclasses) raises
  ``TypeError`` naming its place in the checkpoint: nothing is dropped or changed
  silently, and nothing stored is ever unpickled.

Saves replace an existing checkpoint at the path atomically (pyckpt's commit: new
data files, then the index, then the old files go). ``CheckpointIO(blocking=False)``
returns from ``save_checkpoint`` once every value is copied to host memory
(``pyckpt.save(..., blocking=False)``) and writes in the background.
"""

from __future__ import annotations

import collections
import contextlib
import importlib
import sys
import threading
import types
import warnings
from typing import TYPE_CHECKING, Any, Iterator

import numpy as np

try:
    import torch  # optional dependency: the Lightning extra brings it
except ImportError as _e:  # pragma: no cover - exercised in a subprocess test
    raise ImportError('pyckpt.lightning needs torch: pip install "pyckpt[torch]" (or '
                      f'"pyckpt[lightning]", which brings Lightning too) ({_e})') from None

from . import saving
from .checkpoint_reader import load_checkpoint as _open
from .errors import CheckpointError, CorruptCheckpointError
from .flat import load as _load
from .flat import load_placed
from .format import INDEX_NAME
from .storage import resolve
from .tree import as_array_leaf, describe_value, static_leaf, validate_keys
from .workers.comm import SingleComm

__all__ = ["CheckpointIO", "load_from_checkpoint"]


#: the modules of Lightning's base classes, one per package: ``lightning`` has its own
#: copy (``lightning.fabric``), ``pytorch_lightning`` uses ``lightning_fabric``
_FABRICS = ("lightning.fabric", "lightning_fabric")


def _lightnings() -> list[tuple[str, Any, Any]]:
    """(module, CheckpointIO base class, AttributeDict) of each Lightning installed.

    The two packages' classes are distinct, and each Trainer checks its plugins with
    its own (``isinstance(plugin, CheckpointIO)``), so the plugin subclasses every one
    installed: ``lightning.Trainer`` and ``pytorch_lightning.Trainer`` both accept it."""
    found = []
    for fabric in _FABRICS:
        try:
            plugins = importlib.import_module(fabric + ".plugins")
        except ImportError:
            continue
        data = importlib.import_module(fabric + ".utilities.data")
        found.append((fabric, plugins.CheckpointIO, data.AttributeDict))
    if not found:
        raise ImportError('pyckpt.lightning needs Lightning: pip install "pyckpt[lightning]" '
                          "(neither lightning nor pytorch_lightning is installed)")
    return found


if TYPE_CHECKING:  # mypy sees no Lightning (its types vary by package and version)
    _Base = object
    _ATTRIBUTE_DICTS: dict[str, type] = {}
else:
    _FOUND = _lightnings()
    _ATTRIBUTE_DICTS = {fabric: attribute_dict for fabric, _, attribute_dict in _FOUND}
    _Base = (_FOUND[0][1] if len(_FOUND) == 1 else  # one class deriving from both
             types.new_class("_LightningCheckpointIO", tuple(base for _, base, _ in _FOUND)))

#: the metadata entry of the types the tree cannot say, and its format
_META = "pyckpt.lightning"
_FORMAT = 1
_MAX_DEPTH = 512
_SCALARS = (bool, int, float, complex)
_DICTS: dict[type, str | None] = {dict: None, collections.OrderedDict: "OrderedDict",
                                  **{t: "AttributeDict" for t in _ATTRIBUTE_DICTS.values()}}
#: an AttributeDict's class -> its module (kept in its type record: it comes back as itself)
_FABRIC_OF = {t: fabric for fabric, t in _ATTRIBUTE_DICTS.items()}
_SEQUENCES: dict[type, str] = {list: "l", tuple: "u", torch.Size: "u"}
_SPECIAL_PARTS = {"": "%", ".": "%2E", "..": "%2E%2E"}


def _part(key: str | int) -> str:
    """A dict key as one component of a tensor key: ``%``, ``/`` and NUL escaped, and
    the components a key may not have (``""``, ``.``, ``..``) spelled otherwise."""
    text = str(key).replace("%", "%25").replace("/", "%2F").replace("\x00", "%00")
    return _SPECIAL_PARTS.get(text, text)


def _where(path: tuple) -> str:
    return "checkpoint" + "".join(f"[{k!r}]" for k in path)


def _plain_json(value: Any, depth: int = 0) -> bool:
    """Whether value is made of JSON's own types (str-keyed dicts, lists, scalars)."""
    if depth > 32:
        return False
    if isinstance(value, dict):
        return all(type(k) is str and _plain_json(v, depth + 1) for k, v in value.items())
    if isinstance(value, list):
        return all(_plain_json(v, depth + 1) for v in value)
    return value is None or type(value) in (str, int, float, bool)


class _Encoder:
    """Walks a checkpoint dict once: the values to write (``saving.Item``), the tree's
    skeleton (docs/FORMAT.md, "Tree") and the type records of what the skeleton cannot
    say (``[path, tag]`` or ``[path, tag, extra]``)."""

    def __init__(self) -> None:
        self.items: list[saving.Item] = []
        self.types: list[list] = []

    def walk(self, node: Any, key: str, path: tuple, depth: int) -> Any:
        if depth > _MAX_DEPTH:
            raise ValueError(f"{_where(path)} is nested deeper than {_MAX_DEPTH} levels")
        t = type(node)
        if t in _DICTS:
            return self._dict(node, key, path, depth)
        if t in _SEQUENCES:
            if t is torch.Size:
                self.types.append([list(path), "torch.Size"])
            parts = [self.walk(v, self._join(key, str(i)), path + (i,), depth + 1)
                     for i, v in enumerate(node)]
            return {_SEQUENCES[t]: parts}
        return self._leaf(node, key, path)

    @staticmethod
    def _join(key: str, part: str) -> str:
        return f"{key}/{part}" if key else part

    def _dict(self, node: dict, key: str, path: tuple, depth: int) -> dict:
        tag = _DICTS[type(node)]
        attrs = dict(vars(node)) if tag is not None else {}
        extra = {}
        if tag == "OrderedDict" and "_metadata" in attrs:  # a state dict's module versions
            extra["_metadata"] = attrs.pop("_metadata")
            if not _plain_json(extra["_metadata"]):
                raise TypeError(f"{_where(path)}._metadata holds values other than str-keyed "
                                "dicts of numbers and strings: pyckpt cannot store it")
        if tag == "AttributeDict":
            extra["lightning"] = _FABRIC_OF[type(node)]
        if attrs:
            raise TypeError(f"{_where(path)} is {describe_value(node)} with attributes "
                            f"{sorted(attrs)}: pyckpt cannot store them")
        if tag is not None:
            self.types.append([list(path), tag, extra] if extra else [list(path), tag])
        entries, seen = [], set()
        for k, v in node.items():
            if type(k) not in (str, int):
                raise TypeError(f"{_where(path)} has the key {k!r} ({describe_value(k)}): "
                                "pyckpt stores dicts whose keys are str or int")
            part = _part(k)
            if part in seen:
                raise ValueError(f"{_where(path)} has the keys {k!r} and {str(k)!r}: pyckpt "
                                 "cannot tell an int key from its text in one dict")
            seen.add(part)
            entries.append([k, self.walk(v, self._join(key, part), path + (k,), depth + 1)])
        return {"d": entries}

    def _leaf(self, node: Any, key: str, path: tuple) -> Any:
        t = type(node)
        if node is None or t is str or t is bytes:
            return static_leaf(node)
        if t is bytearray:
            self.types.append([list(path), "bytearray"])
            return static_leaf(bytes(node))
        if t is torch.nn.Parameter:
            self.types.append([list(path), "Parameter", {"requires_grad": node.requires_grad}])
        elif t is torch.Tensor and node.requires_grad:
            self.types.append([list(path), "requires_grad"])
        elif not (t in _SCALARS or t is torch.Tensor or isinstance(node, (np.ndarray, np.generic))):
            raise TypeError(f"pyckpt.lightning cannot store {describe_value(node)} at "
                            f"{_where(path)}: values must be tensors, numpy arrays, numbers, "
                            "str, bytes or None, in dicts, lists and tuples (store such "
                            "objects in hyperparameters as plain values)")
        found = as_array_leaf(node)
        if found is None:  # a framework's tensor no adapter takes (torch not registered)
            raise TypeError(f"pyckpt cannot store {describe_value(node)} at {_where(path)}")
        array, kind = found
        self.items.append(saving.Item(key, array, node))
        return key if kind == "ndarray" else {"s": key, "as": kind}


def _encode(checkpoint: Any) -> tuple[list[saving.Item], Any, dict]:
    """(values, skeleton, metadata) of a checkpoint dict."""
    if type(checkpoint) not in _DICTS:
        raise TypeError(f"a Lightning checkpoint is a dict, got {describe_value(checkpoint)}")
    enc = _Encoder()
    skeleton = enc.walk(checkpoint, "", (), 0)
    validate_keys([it.key for it in enc.items])
    return enc.items, skeleton, {_META: {"format": _FORMAT, "types": enc.types}}


# -- loading -----------------------------------------------------------------------------

def _rebuild(tag: str, value: Any, extra: dict, where: str) -> Any:
    """The value of a type record's ``tag`` from what the tree gave back."""
    want = {"OrderedDict": dict, "AttributeDict": dict, "torch.Size": tuple,
            "bytearray": bytes, "Parameter": torch.Tensor, "requires_grad": torch.Tensor}.get(tag)
    if want is None:
        raise CheckpointError(f"{where} is recorded as {tag!r}, a type this pyckpt does not "
                              "know (written by a newer pyckpt?)")
    if not isinstance(value, want):
        raise CorruptCheckpointError(f"{where} is recorded as {tag!r} but holds "
                                     f"{describe_value(value)}")
    if tag == "OrderedDict":
        out = collections.OrderedDict(value)
        if "_metadata" in extra:
            versions = collections.OrderedDict(extra["_metadata"])
            out._metadata = versions  # type: ignore[attr-defined]
        return out
    if tag == "AttributeDict":  # the package's recorded, else an installed one
        fabric = extra.get("lightning")
        cls = _ATTRIBUTE_DICTS.get(fabric) if isinstance(fabric, str) else None
        return (cls or next(iter(_ATTRIBUTE_DICTS.values())))(value)
    if tag == "torch.Size":
        return torch.Size(value)
    if tag == "bytearray":
        return bytearray(value)
    if tag == "Parameter":
        return torch.nn.Parameter(value, requires_grad=bool(extra.get("requires_grad", True)))
    return value.requires_grad_(True)


def _records(meta: Any) -> dict[tuple, tuple[str, dict]]:
    """path -> (tag, extra) of a checkpoint's type records (validated: they are input)."""
    if meta is None:
        return {}
    if not isinstance(meta, dict) or not isinstance(meta.get("types"), list):
        raise CorruptCheckpointError(f"malformed {_META!r} metadata")
    if meta.get("format") != _FORMAT:
        raise CheckpointError(f"the checkpoint's {_META!r} format {meta.get('format')!r} is "
                              f"not {_FORMAT} (written by a newer pyckpt?)")
    out: dict[tuple, tuple[str, dict]] = {}
    for rec in meta["types"]:
        ok = (isinstance(rec, list) and len(rec) in (2, 3) and isinstance(rec[0], list)
              and all(type(k) in (str, int) for k in rec[0]) and isinstance(rec[1], str)
              and (len(rec) == 2 or isinstance(rec[2], dict)))
        if not ok:
            raise CorruptCheckpointError(f"malformed type record {rec!r} in {_META!r} metadata")
        out[tuple(rec[0])] = (rec[1], rec[2] if len(rec) == 3 else {})
    return out


def _retype(tree: Any, records: dict[tuple, tuple[str, dict]]) -> Any:
    """The tree with the recorded types rebuilt (only the containers on the way to a
    record are made anew)."""
    return _retype_node(tree, (), {p[:n] for p in records for n in range(len(p))}, records)


def _retype_node(node: Any, path: tuple, ahead: set[tuple],
                 records: dict[tuple, tuple[str, dict]]) -> Any:
    """``_retype`` of one node (module-level: a closure calling itself is a cycle)."""
    if path in ahead:
        if type(node) is dict:
            node = {k: _retype_node(v, path + (k,), ahead, records) for k, v in node.items()}
        elif type(node) in (list, tuple):
            node = type(node)(_retype_node(v, path + (i,), ahead, records)
                              for i, v in enumerate(node))
    rec = records.get(path)
    return node if rec is None else _rebuild(rec[0], node, rec[1], _where(path))


def _device(map_location: Any) -> Any:
    """The torch device tensors are loaded to (None: the CPU, as Lightning's own
    ``TorchCheckpointIO`` loads)."""
    if map_location is None:
        return None
    if isinstance(map_location, (str, torch.device)):
        device = torch.device(map_location)
        return None if device.type == "cpu" else device
    raise TypeError(f"pyckpt.lightning.CheckpointIO.load_checkpoint: map_location must be None, "
                    f"a device name or a torch.device, got {describe_value(map_location)} "
                    "(pyckpt does not record where tensors were saved from)")


#: the leaf kinds ``map_location`` places on a device: torch tensors only (numpy arrays
#: and Python values stay on the host, as Lightning's own ``torch.load`` keeps them)
_PLACED = frozenset({"torch"})


def _placeable(device: Any) -> bool:
    """Whether pyckpt's device path lands tensors on ``device`` itself (read through
    pinned bounce buffers into new tensors there: ``flat.load_placed``): CUDA devices,
    the ones torch's ``empty`` hook makes tensors on (adapters/torch_support.py)."""
    return device.type == "cuda"


def _to_device(tree: Any, device: Any) -> Any:
    """The tree's torch tensors moved to ``device`` one by one: only for the devices
    pyckpt's device path does not place tensors on (``meta``, ``mps``, ...)."""
    if isinstance(tree, torch.Tensor):
        return tree.to(device)
    if isinstance(tree, dict):
        for k, v in tree.items():
            tree[k] = _to_device(v, device)
        return tree
    if isinstance(tree, list):
        tree[:] = [_to_device(v, device) for v in tree]
        return tree
    if type(tree) is tuple:
        return tuple(_to_device(v, device) for v in tree)
    return tree


# -- the plugin -----------------------------------------------------------------------------

def _raise_first(errors: list[BaseException]) -> None:
    """Raises the first of the errors of failed background saves (each is raised
    once); a warning names each of the others."""
    for e in errors[1:]:
        warnings.warn(f"another background checkpoint save failed too: {e!r}", stacklevel=4)
    if errors:
        raise errors[0]


class CheckpointIO(_Base):
    """Lightning's ``CheckpointIO`` plugin writing and reading pyckpt checkpoints.

    ``Trainer(plugins=[pyckpt.lightning.CheckpointIO()])``: every checkpoint Lightning
    saves is a pyckpt checkpoint (a directory, or an object-store prefix) at the path
    Lightning names, e.g. ``checkpoints/epoch=3-step=400.ckpt``.

    - ``storage_options``: fsspec options for remote paths (``endpoint_url``, ``key``,
      ``secret``, ...), used by every save, load and removal; a ``storage_options``
      dict given to one save (``trainer.save_checkpoint(path, storage_options=...)``)
      is merged over them for that save.
    - ``blocking=False``: ``save_checkpoint`` returns once every value is copied to
      host memory (device tensors through pinned buffers) and the checkpoint is
      written and committed in the background. A later save, load or removal of the
      same path waits for it first; every call raises the error of a background save
      that failed before it; ``teardown()`` (Lightning calls it when ``fit`` ends) and
      ``wait()`` wait for every pending save and raise the first error.

    A save and a removal of one path, from any threads, take turns (Lightning's
    ``AsyncCheckpointIO`` saves in a thread of its own while ``ModelCheckpoint``
    removes older checkpoints from the trainer's thread).
    """

    def __init__(self, storage_options: dict | None = None, *, blocking: bool = True) -> None:
        super().__init__()
        if storage_options is not None and not isinstance(storage_options, dict):
            raise TypeError(f"storage_options must be a dict, got "
                            f"{describe_value(storage_options)}")
        self.storage_options = storage_options
        self.blocking = bool(blocking)
        self._init_pending()

    def _init_pending(self) -> None:
        self._lock = threading.Lock()  # guards the two below
        self._starting = threading.Lock()  # one background save starts at a time
        self._pending: dict[str, saving.PendingSave] = {}
        self._errors: list[BaseException] = []
        self._claims = threading.Condition()  # guards the one below
        self._busy: set[str] = set()  # paths a save or removal is working on

    @contextlib.contextmanager
    def _claim(self, url: str) -> Iterator[None]:
        """Holds ``url`` for one save or removal: another one of the same path, from
        another thread, waits (Lightning's ``AsyncCheckpointIO`` saves in a thread of
        its own, and ``ModelCheckpoint`` removes an older checkpoint from the trainer's
        thread, maybe while it is being written)."""
        with self._claims:
            self._claims.wait_for(lambda: url not in self._busy)
            self._busy.add(url)
        try:
            yield
        finally:
            with self._claims:
                self._busy.discard(url)
                self._claims.notify_all()

    def __getstate__(self) -> dict:  # a plugin travels to spawned workers: no threads
        return {k: v for k, v in self.__dict__.items()
                if k not in ("_lock", "_starting", "_pending", "_errors", "_claims", "_busy")}

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self._init_pending()

    def _options(self, extra: Any = None) -> dict | None:
        if extra is None:
            return self.storage_options
        if not isinstance(extra, dict):
            raise TypeError(f"storage_options must be a dict, got {describe_value(extra)}")
        return {**(self.storage_options or {}), **extra}

    def save_checkpoint(self, checkpoint: dict[str, Any], path: Any,
                        storage_options: Any = None) -> None:
        """Writes ``checkpoint`` as a pyckpt checkpoint at ``path`` (a local path or
        fsspec URL), replacing one that is there atomically (a reader sees the old
        checkpoint or the new one, never a mix; a failed save leaves the old one)."""
        options = self._options(storage_options)
        store, p = resolve(path, options)
        url = store.url(p)
        if self.blocking:
            with self._claim(url):
                self._settle(url)
                items, skeleton, metadata = _encode(checkpoint)
                saving.write(saving.SavePlan.build(items, path, storage_options=options,
                                                   comm=SingleComm(), tree=skeleton,
                                                   metadata=metadata))
            return
        # (saves from several threads: none overtakes another)
        with self._starting, self._claim(url):
            self._settle(url)
            items, skeleton, metadata = _encode(checkpoint)
            handle = saving.start(saving.SavePlan.build(items, path, storage_options=options,
                                                        comm=SingleComm(), tree=skeleton,
                                                        metadata=metadata))
            with self._lock:
                self._pending[url] = handle

    def load_checkpoint(self, path: Any, map_location: Any = None,
                        weights_only: bool | None = None) -> dict[str, Any]:
        """The checkpoint dict saved at ``path``: torch tensors (on the CPU, or on
        ``map_location``: a device name or ``torch.device``; on a CUDA device they are
        read through pinned bounce buffers straight into new device tensors, as
        ``pyckpt.load(device=)`` reads), numpy arrays and Python values in their own
        types, on the host. ``weights_only`` is accepted for Lightning's sake: pyckpt never
        unpickles anything, so every load is as safe as ``weights_only=True``."""
        device = _device(map_location)
        store, p = resolve(path, self.storage_options)
        self._settle(store.url(p))
        src = _open(path, storage_options=self.storage_options).source
        records = _records(src.metadata.get(_META))
        placed = device is not None and _placeable(device)
        tree = load_placed(src, device, _PLACED) if placed else _load(src)
        if not isinstance(tree, dict):
            raise CheckpointError(f"{src.url} holds {describe_value(tree)}, not a Lightning "
                                  "checkpoint dict")
        if device is not None and not placed:
            tree = _to_device(tree, device)
        return _retype(tree, records)

    def remove_checkpoint(self, path: Any) -> None:
        """Deletes the checkpoint at ``path`` (its index first, so that it is no
        checkpoint from then on; a symbolic link: the link only; a plain file, e.g.
        one ``torch.save`` wrote: the file). A path that does not exist is no error."""
        store, p = resolve(path, self.storage_options)
        with self._claim(store.url(p)):  # after a save of it in another thread
            self._settle(store.url(p))
            parent = p.rstrip("/").rpartition("/")[0]
            if store.is_link(p) or (store.exists(p) and not store.isdir(p)):
                store.remove(parent, [p])
            elif store.exists(p):
                store.remove(p, [store.join(p, INDEX_NAME)])  # uncommitted from here on
                store.sync_dir(p)
                store.remove_tree(parent, p)

    def wait(self) -> None:
        """Waits for every background save (``blocking=False``) and raises the first
        error among them (a warning names the others)."""
        with self._lock:
            pending = list(self._pending.values())
            self._pending.clear()
        for handle in pending:
            handle.join()
        with self._lock:
            self._errors.extend(h.error for h in pending if h.error is not None)
            errors, self._errors = self._errors, []
        _raise_first(errors)

    def teardown(self) -> None:
        """Lightning's end of ``fit``/``validate``/...: waits for the background saves
        and raises the first error among them (``wait``)."""
        self.wait()

    def _settle(self, url: str) -> None:
        """Waits for a background save to ``url``, then raises the error of any
        background save that failed."""
        with self._lock:
            handle = self._pending.pop(url, None)
        if handle is not None:
            handle.join()
        with self._lock:
            for key in [k for k, h in self._pending.items() if h.done()]:
                done = self._pending.pop(key)
                if done.error is not None:
                    self._errors.append(done.error)
            if handle is not None and handle.error is not None:
                self._errors.append(handle.error)
            errors, self._errors = self._errors, []
        _raise_first(errors)

    def __repr__(self) -> str:
        return f"pyckpt.lightning.CheckpointIO(blocking={self.blocking})"


# -- LightningModule.load_from_checkpoint for pyckpt checkpoints ----------------------------

def _package_of(cls: Any) -> str:
    """The Lightning package (``lightning.pytorch`` or ``pytorch_lightning``) whose
    ``LightningModule`` or ``LightningDataModule`` ``cls`` subclasses."""
    for top in ("lightning.pytorch", "pytorch_lightning"):
        pl = sys.modules.get(top)  # a class of a package means the package is imported
        if (pl is not None and isinstance(cls, type)
                and issubclass(cls, (pl.LightningModule, pl.LightningDataModule))):
            return top
    what = (f"{cls.__module__}.{cls.__qualname__}" if isinstance(cls, type)
            else describe_value(cls))
    raise TypeError(f"pyckpt.lightning.load_from_checkpoint: {what} is not a LightningModule "
                    "or LightningDataModule class")


def load_from_checkpoint(cls: Any, checkpoint_path: Any, map_location: Any = None,
                         hparams_file: Any = None, strict: bool | None = None,
                         weights_only: bool | None = None, *,
                         storage_options: dict | None = None, **kwargs: Any) -> Any:
    """``cls.load_from_checkpoint(checkpoint_path, ...)`` for a pyckpt checkpoint (which
    Lightning's own reads with ``torch.load``, so it cannot open the directory): the
    ``LightningModule`` (or ``LightningDataModule``) ``cls`` built from the checkpoint's
    hyperparameters (``kwargs`` override them; ``hparams_file``: a ``.yaml`` or ``.csv``
    file replacing them), its ``on_load_checkpoint`` called, the state dict loaded
    (``strict``), as Lightning does. Tensors are loaded to the CPU, or to
    ``map_location`` (a device name or ``torch.device``), and the model is moved there.
    ``weights_only`` is accepted and changes nothing: pyckpt never unpickles anything."""
    top = _package_of(cls)
    loading = importlib.import_module(top + ".core.saving")
    migration = importlib.import_module(top + ".utilities.migration")
    device = _device(map_location)
    checkpoint = CheckpointIO(storage_options).load_checkpoint(checkpoint_path, map_location)
    checkpoint, _ = migration.migrate_checkpoint(checkpoint)  # (one of an older Lightning)
    if hparams_file is not None:
        suffix = str(hparams_file).rpartition(".")[2].lower()
        if suffix not in ("csv", "yml", "yaml"):
            raise ValueError(f"hparams_file must be a .csv, .yml or .yaml file, got {hparams_file!r}")
        read = (loading.load_hparams_from_tags_csv if suffix == "csv"
                else loading.load_hparams_from_yaml)
        checkpoint[cls.CHECKPOINT_HYPER_PARAMS_KEY] = read(hparams_file)
    checkpoint.setdefault(cls.CHECKPOINT_HYPER_PARAMS_KEY, {}).update(kwargs)
    pl = sys.modules[top]
    if issubclass(cls, pl.LightningDataModule):
        return loading._load_state(cls, checkpoint, **kwargs)
    model = loading._load_state(cls, checkpoint, strict=strict, **kwargs)
    return model if device is None else model.to(device)
