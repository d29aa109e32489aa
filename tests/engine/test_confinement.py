"""Every delete stays inside the directory pyckpt manages, never through a link
(issue 37 item 1), every read of a file a checkpoint names refuses a link in its
place (item 3), and a commit's sweep removes the temporary files of writers that
were killed (item 10)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

import numpy as np
import pytest

import pyckpt
from pyckpt.errors import CheckpointIOError, CorruptCheckpointError
from pyckpt.storage import LocalStore

sys.path.insert(0, os.path.join(os.path.dirname(__file__), os.pardir, "incremental"))
import inc_helpers as h  # noqa: E402


def _victims(target: str) -> None:
    os.makedirs(os.path.join(target, "keep-me-dir"))
    for p in ("keep-me.txt", os.path.join("keep-me-dir", "inner.txt")):
        with open(os.path.join(target, p), "w") as f:
            f.write("not pyckpt's")


def _moved_and_linked(run: str, name: str, elsewhere: str) -> str:
    """Moves checkpoint ``name`` of ``run`` to another directory and links it back."""
    target = os.path.join(elsewhere, name)
    shutil.move(os.path.join(run, name), target)
    os.symlink(target, os.path.join(run, name))
    return target


def test_retention_never_deletes_behind_a_linked_checkpoint(tmp_path):
    run, other = str(tmp_path / "run"), str(tmp_path / "other-disk")
    os.makedirs(other)
    ck = h.model()
    m = pyckpt.CheckpointManager(ck, run, max_to_keep=2, incremental=True)
    h.train_step(ck, 1)
    m.save()
    target = _moved_and_linked(run, "ckpt-1", other)
    _victims(target)
    for step in (2, 3, 4):  # ckpt-1 leaves the kept set while later saves reference it
        h.train_step(ck, step)
        m.save()
        expected = h.values(ck)
    m.close()
    assert os.path.exists(os.path.join(target, "keep-me.txt"))
    assert os.path.exists(os.path.join(target, "keep-me-dir", "inner.txt"))
    h.same(h.restored(os.path.join(run, "ckpt-4")), expected)


def test_first_save_cleanup_never_deletes_behind_a_link(tmp_path):
    """A manager's first-save cleanup: a linked, never-committed checkpoint directory
    (or held data) of an earlier run is removed as a link, its target untouched."""
    run, other = str(tmp_path / "run"), str(tmp_path / "other-disk")
    ck = h.model()
    with pyckpt.CheckpointManager(ck, run, max_to_keep=3, incremental=True) as m:
        h.train_step(ck, 1)
        m.save()
        h.train_step(ck, 2)
        m.save()
    target = _moved_and_linked(run, "ckpt-1", other)
    _victims(target)
    os.unlink(os.path.join(target, "pyckpt.index"))  # ckpt-1: held data now, no index
    with pyckpt.CheckpointManager(ck, run, max_to_keep=1, incremental=True) as m:
        h.train_step(ck, 3)
        m.save()
        expected = h.values(ck)
    assert os.path.exists(os.path.join(target, "keep-me.txt"))
    assert os.path.exists(os.path.join(target, "keep-me-dir", "inner.txt"))
    h.same(h.restored(os.path.join(run, "ckpt-3")), expected)


def test_store_refuses_deletes_through_links_and_outside(tmp_path):
    store = LocalStore()
    root, out = str(tmp_path / "root"), str(tmp_path / "out")
    os.makedirs(root)
    os.makedirs(out)
    _victims(out)
    os.symlink(out, os.path.join(root, "linked"))
    for bad in (os.path.join(root, "linked", "keep-me.txt"),
                os.path.join(root, "..", "out", "keep-me.txt"),
                os.path.join(out, "keep-me.txt"), root):
        with pytest.raises(CheckpointIOError, match="refuses to delete"):
            store.remove(root, [bad])
    with pytest.raises(CheckpointIOError, match="symbolic link"):
        store.remove_tree(root, os.path.join(root, "linked", "keep-me-dir"))
    store.remove_tree(root, os.path.join(root, "linked"))  # the link itself only
    assert not os.path.lexists(os.path.join(root, "linked"))
    assert os.path.exists(os.path.join(out, "keep-me.txt"))
    assert os.path.exists(os.path.join(out, "keep-me-dir", "inner.txt"))


def test_no_module_deletes_around_the_confined_methods():
    """One home for the rule: pyckpt's modules delete through Store.remove and
    Store.remove_tree only (the storage backends implement them)."""
    import pathlib
    import re
    root = pathlib.Path(pyckpt.__file__).parent
    bad = []
    for f in root.rglob("*.py"):
        rel = f.relative_to(root).as_posix()
        if rel.startswith(("storage/", "testing/")):
            continue
        for i, line in enumerate(f.read_text().splitlines(), 1):
            if re.search(r"\.(delete|rmtree)\(", line) or re.search(r"\b(os\.(unlink|remove|rmdir)|shutil\.rmtree)\(", line):
                bad.append(f"{rel}:{i}: {line.strip()}")
    assert not bad, "\n".join(bad)


# -- item 3: reads never follow a link in a file's place -------------------------------

def test_reads_refuse_a_link_in_a_file_place(tmp_path):
    secret = tmp_path / "secret"
    secret.write_bytes(b"top secret")
    d = tmp_path / "ck"
    d.mkdir()
    os.symlink(secret, d / "f")
    store = LocalStore()
    for read in (lambda: store.read_bytes(str(d / "f")),
                 lambda: store.read_ranges(str(d / "f"), [(0, 3)])):
        with pytest.raises(CorruptCheckpointError, match="symbolic link"):
            read()


def test_safetensors_file_named_through_a_link_is_read(tmp_path):
    """The file the user names may be a link (the user asked for it)."""
    from safetensors.numpy import save_file
    real = tmp_path / "real.safetensors"
    save_file({"w": np.arange(4, dtype=np.float32)}, str(real))
    link = tmp_path / "model.safetensors"
    os.symlink(real, link)
    np.testing.assert_array_equal(pyckpt.load(str(link))["w"], np.arange(4, dtype=np.float32))


def test_pyckpt_index_link_is_refused(tmp_path):
    a, b = str(tmp_path / "a"), str(tmp_path / "b")
    pyckpt.save({"x": np.ones(3)}, a)
    pyckpt.save({"x": np.zeros(3)}, b)
    os.unlink(os.path.join(b, "pyckpt.index"))
    os.symlink(os.path.join(a, "pyckpt.index"), os.path.join(b, "pyckpt.index"))
    with pytest.raises(CorruptCheckpointError, match="symbolic link"):
        pyckpt.load(b)


# -- item 10: temporary files of killed writers are swept by the next commit ----------

def _dead_pid() -> int:
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()
    return p.pid


def test_commit_sweeps_temporary_files_of_dead_writers(tmp_path):
    from pyckpt.storage import local
    path = str(tmp_path / "ck")
    pyckpt.save({"x": np.ones(3)}, path)
    dead, tag = _dead_pid(), local._HOST_TAG
    dead_names = [f".pyckpt.index.tmp-{tag}-{dead}-0123abcd",
                  f".data-0123456789ab-00000-0000.bin.tmp-{tag}-{dead}-deadbeef"]
    live_names = [f".pyckpt.index.tmp-{tag}-{os.getpid()}-0123abcd",  # this process: may be writing
                  f".pyckpt.index.tmp-00000000-{dead}-0123abcd"]        # another host, recent
    for n in dead_names + live_names:
        with open(os.path.join(path, n), "wb") as f:
            f.write(b"partial")
    pyckpt.save({"x": np.zeros(3)}, path)
    left = set(os.listdir(path))
    assert not left & set(dead_names)
    assert set(live_names) <= left
    np.testing.assert_array_equal(pyckpt.load(path)["x"], np.zeros(3))
