"""References between the checkpoints of one run directory (incremental saves,
docs/PROTOCOL.md section 9): which data files the kept checkpoints' indexes name in
other checkpoints' directories, and retiring a checkpoint without deleting them.

Retention commits first and collects after: a checkpoint leaving the kept set is
un-committed (its index deleted first), then each of its files is deleted unless
an index of a kept checkpoint names it. Files still named stay where they are: the
directory, without an index, is no checkpoint any more, only the holder of data
that kept checkpoints read ("held data"); each later retention collects what is
no longer named, and removes the directory once it is empty.
"""

from __future__ import annotations

import struct
from typing import Iterable, MutableMapping

from ..format import INDEX_NAME, Manifest, decode_index
from ..format.index import HEADER_SIZE
from ..run_directory import check_checkpoint_name, delete_checkpoint
from ..storage import Store
from . import naming

__all__ = ["Held", "check_not_referenced", "references_of", "referenced_by", "held_files",
           "retire", "uncommit"]

#: {directory name: names of its files that kept checkpoints reference}
Held = dict[str, set[str]]


def references_of(store: Store, path: str) -> frozenset[tuple[str, str]]:
    """(directory, file) of every data file that the committed checkpoint at ``path``
    references in another directory; empty when it has no index (nothing of its is
    committed) or an index of format version 1 (no references, header only)."""
    index = store.join(path, INDEX_NAME)
    try:
        head = store.read_ranges(index, [(0, HEADER_SIZE)])[0]
        if len(head) == HEADER_SIZE and struct.unpack_from("<I", head, 8)[0] < 2:
            return frozenset()
        manifest = decode_index(store.read_bytes(index), store.url(index))
    except FileNotFoundError:
        return frozenset()
    return frozenset((f.at, f.name) for f in manifest.files if f.at is not None)


def referenced_by(store: Store, path: str) -> list[str]:
    """The committed checkpoints beside ``path`` (same parent directory) whose indexes
    reference data files in ``path``'s directory (incremental saves), sorted; an
    entry that is no readable checkpoint references nothing."""
    parent, _, name = path.rstrip("/").rpartition("/")
    out = []
    for entry in store.listdir(parent or "/"):
        if entry == name:
            continue
        try:
            refs = references_of(store, store.join(parent, entry))
        except (OSError, ValueError):
            continue
        if any(at == name for at, _ in refs):
            out.append(entry)
    return sorted(out)


def check_not_referenced(store: Store, path: str, previous: Manifest | None,
                         attempt: str | None) -> None:
    """Refuses (ValueError naming them) to replace what ``path`` holds while other
    checkpoints reference its files: replacing deletes them (a commit deletes the
    replaced files and sweeps the data files its index does not name). Only data that
    can be referenced is looked for: a committed checkpoint with fingerprints, or data
    files without an index (held data) of an attempt other than ``attempt``."""
    if previous is not None:
        if previous.blocks.hashes is None:
            return
    elif not any(naming.is_data_file(n) and naming.attempt_of(n) != attempt
                 for n in store.listdir(path)):
        return
    users = referenced_by(store, path)
    if users:
        raise ValueError(
            f"{store.url(path)} holds data that the checkpoints {', '.join(users)} beside it "
            "reference (incremental saves): replacing it would break them. Save or copy to "
            "a new path, or delete those checkpoints first.")


def held_files(store: Store, directory: str, kept: Iterable[str],
               cache: MutableMapping[str, frozenset[tuple[str, str]]] | None = None) -> Held:
    """The files that the kept checkpoints ``kept`` (names in ``directory``) reference
    in other directories. An index that cannot be read raises: retention must not
    guess (``cache``: references already read, by checkpoint name)."""
    out: Held = {}
    for name in kept:
        refs = None if cache is None else cache.get(name)
        if refs is None:
            refs = references_of(store, store.join(directory, name))
            if cache is not None:
                cache[name] = refs
        for at, file in refs:
            out.setdefault(at, set()).add(file)
    return out


def uncommit(store: Store, directory: str, names: Iterable[str]) -> None:
    """Deletes the index of every checkpoint ``names`` of ``directory`` (a link: left to
    ``retire``, which removes the link only). Retention un-commits every checkpoint it
    retires before it deletes any data: data that only retiring checkpoints reference
    is then collected, and never while a retiring checkpoint still looks committed."""
    indexes = []
    for name in names:
        check_checkpoint_name(name, "checkpoint")
        path = store.join(directory, name)
        if not store.is_link(path):
            indexes.append(store.join(path, INDEX_NAME))
    if indexes:
        store.remove(directory, indexes)
        store.sync_dir(directory)


def retire(store: Store, directory: str, name: str, held: Held) -> bool:
    """Un-commits checkpoint ``name`` of ``directory`` (index first) and deletes its
    files except those in ``held[name]``; True when nothing of it is left, False when
    its directory stays as held data. Can be called again after an interruption.
    A checkpoint directory that is a symbolic link is never entered: it is removed
    (the link only) once no kept checkpoint references its files, and left whole
    (still committed) while one does (docs/PROTOCOL.md 1d)."""
    check_checkpoint_name(name, "checkpoint")
    keep = held.get(name)
    path = store.join(directory, name)
    if not keep:
        delete_checkpoint(store, directory, name)
        return True
    if store.is_link(path):
        return False
    store.remove(directory, [store.join(path, INDEX_NAME)])
    store.sync_dir(path)
    for e in store.listdir(path):
        if e not in keep:
            p = store.join(path, e)
            if store.isdir(p):  # a link to a directory: the link only
                store.remove_tree(directory, p)
            else:
                store.remove(directory, [p])
    return False
