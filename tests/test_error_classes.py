"""Issue 10 B: every failure about a checkpoint is a ``CheckpointError``.

I/O failures of the local store (full disk, read-only filesystem, permission
denied) become ``CheckpointIOError`` with the OS errno, a message naming the
file and the ``OSError`` as ``__cause__``; invalid manifest contents become
``CorruptCheckpointError`` naming the key and the index file, from every entry
point, before anything is allocated.

The tests run as root, where ``chmod`` blocks nothing, so most failures are
injected by monkeypatching the lowest OS call the local store makes (each test
says which one). ``test_real_full_and_read_only_tmpfs`` uses a real 1 MiB tmpfs
in a private mount namespace where the sandbox allows it.
"""

from __future__ import annotations

import errno
import json
import os
import shutil
import struct
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import pyckpt
from pyckpt._reference_reader import crc32c, mask
from pyckpt.errors import (CheckpointError, CheckpointIOError, CheckpointNotFoundError,
                           CorruptCheckpointError)


# ---------------------------------------------------------------------------
# helpers
# ---------------------------------------------------------------------------

def _fd_path(fd: int) -> str:
    try:
        return os.readlink(f"/proc/self/fd/{fd}")
    except OSError:
        return ""


needs_proc_fd = pytest.mark.skipif(not os.path.isdir("/proc/self/fd"),
                                   reason="names a file descriptor's file through /proc")


def _assert_io_error(exc: BaseException, code: int, *names: str) -> None:
    assert isinstance(exc, CheckpointIOError), repr(exc)
    assert isinstance(exc, CheckpointError) and isinstance(exc, OSError)
    assert exc.errno == code, (exc.errno, str(exc))
    for name in names:
        assert name in str(exc), (name, str(exc))
    assert isinstance(exc.__cause__, OSError), repr(exc.__cause__)
    assert not isinstance(exc.__cause__, CheckpointError)
    assert exc.__cause__.errno == code


def _no_temp_files(directory) -> None:
    leftovers = [n for n in os.listdir(directory) if ".tmp-" in n]
    assert not leftovers, leftovers


def _previous(ckpt):
    pyckpt.save({"x": np.arange(5)}, ckpt)
    return sorted(os.listdir(ckpt))


def _assert_previous_intact(ckpt, before):
    np.testing.assert_array_equal(pyckpt.load(ckpt)["x"], np.arange(5))
    assert sorted(n for n in os.listdir(ckpt) if not n.startswith("pyckpt-attempt-")) == \
        [n for n in before if not n.startswith("pyckpt-attempt-")]


# ---------------------------------------------------------------------------
# I/O failures of the local store
# ---------------------------------------------------------------------------

@needs_proc_fd
def _index_write_fails(monkeypatch, ckpt, before):
    """A save over ``ckpt`` whose index write fails (the patch in place): one
    CheckpointIOError naming the index, no temp file left, the previous intact."""
    with pytest.raises(CheckpointIOError) as info:
        pyckpt.save({"x": np.arange(6)}, ckpt)
    monkeypatch.undo()
    _assert_io_error(info.value, errno.EIO, "pyckpt.index")
    _no_temp_files(ckpt)
    _assert_previous_intact(ckpt, before)


def test_full_disk_at_index_write(tmp_path, monkeypatch):
    """ENOSPC injected in ``os.write`` while the index's temporary file is written."""
    ckpt = tmp_path / "ckpt"
    before = _previous(ckpt)
    real_write = os.write

    def write(fd, data):
        if os.path.basename(_fd_path(fd)).startswith(".pyckpt.index.tmp"):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return real_write(fd, data)

    monkeypatch.setattr(os, "write", write)
    with pytest.raises(CheckpointIOError) as info:
        pyckpt.save({"x": np.arange(6)}, ckpt)
    monkeypatch.undo()
    _assert_io_error(info.value, errno.ENOSPC, os.path.join(str(ckpt), "pyckpt.index"))
    _no_temp_files(ckpt)
    _assert_previous_intact(ckpt, before)


@needs_proc_fd
def test_failed_fsync_at_index_write(tmp_path, monkeypatch):
    """EIO injected in ``os.fsync`` (a lost write reported at sync time)."""
    ckpt = tmp_path / "ckpt"
    before = _previous(ckpt)
    real_fsync = os.fsync

    def fsync(fd):
        if os.path.basename(_fd_path(fd)).startswith(".pyckpt.index.tmp"):
            raise OSError(errno.EIO, os.strerror(errno.EIO))
        return real_fsync(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    _index_write_fails(monkeypatch, ckpt, before)


@pytest.mark.parametrize("code", [errno.EROFS, errno.EACCES])
def test_unwritable_existing_directory(tmp_path, monkeypatch, code):
    """A read-only mount (EROFS) or directory (EACCES): ``os.open`` refuses to create
    any file under the checkpoint."""
    ckpt = tmp_path / "ckpt"
    before = _previous(ckpt)
    real_open = os.open

    def fake_open(path, flags, *args, **kwargs):
        if flags & os.O_CREAT and str(path).startswith(str(ckpt)):
            raise OSError(code, os.strerror(code), str(path))
        return real_open(path, flags, *args, **kwargs)

    monkeypatch.setattr(os, "open", fake_open)
    with pytest.raises(CheckpointIOError) as info:
        pyckpt.save({"x": np.arange(6)}, ckpt)
    monkeypatch.undo()
    _assert_io_error(info.value, code, str(ckpt))
    if code == errno.EACCES:
        assert isinstance(info.value.__cause__, PermissionError)
    _assert_previous_intact(ckpt, before)


@pytest.mark.parametrize("code", [errno.EROFS, errno.EACCES])
def test_unwritable_parent_directory(tmp_path, monkeypatch, code):
    """``os.mkdir`` refuses to create the checkpoint directory."""
    ckpt = tmp_path / "parent" / "ckpt"
    real_mkdir = os.mkdir

    def fake_mkdir(path, *args, **kwargs):
        if str(path).startswith(str(tmp_path / "parent")):
            raise OSError(code, os.strerror(code), str(path))
        return real_mkdir(path, *args, **kwargs)

    monkeypatch.setattr(os, "mkdir", fake_mkdir)
    with pytest.raises(CheckpointIOError) as info:
        pyckpt.save({"x": np.arange(6)}, ckpt)
    monkeypatch.undo()
    _assert_io_error(info.value, code, str(ckpt))
    assert not ckpt.exists()


def test_failed_rename_at_commit(tmp_path, monkeypatch):
    """EXDEV/EIO injected in ``os.replace`` of the index: nothing committed, no temp left."""
    ckpt = tmp_path / "ckpt"
    before = _previous(ckpt)
    real_replace = os.replace

    def replace(src, dst, *args, **kwargs):
        if str(dst).endswith("pyckpt.index"):
            raise OSError(errno.EIO, os.strerror(errno.EIO), str(src), None, str(dst))
        return real_replace(src, dst, *args, **kwargs)

    monkeypatch.setattr(os, "replace", replace)
    _index_write_fails(monkeypatch, ckpt, before)


def test_unreadable_index(tmp_path, monkeypatch):
    """EACCES injected in ``os.open`` of the index (the local store opens every file
    it reads with it, never through a link): every reader entry point."""
    ckpt = tmp_path / "ckpt"
    pyckpt.save({"x": np.arange(5)}, ckpt)
    real_open = os.open

    def fake_open(file, *args, **kwargs):
        if str(file).endswith("pyckpt.index"):
            raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), str(file))
        return real_open(file, *args, **kwargs)

    monkeypatch.setattr(os, "open", fake_open)
    for call in (lambda: pyckpt.load(ckpt), lambda: pyckpt.list_variables(ckpt),
                 lambda: pyckpt.load_checkpoint(ckpt)):
        with pytest.raises(CheckpointIOError) as info:
            call()
        _assert_io_error(info.value, errno.EACCES, os.path.join(str(ckpt), "pyckpt.index"))
    # a checkpoint that is not there is still "not found", not an I/O error
    with pytest.raises(CheckpointNotFoundError):
        pyckpt.load(tmp_path / "nothing")
    with pytest.raises(FileNotFoundError):
        pyckpt.list_variables(tmp_path / "nothing")


def test_mmap_of_unreadable_shard(tmp_path, monkeypatch):
    """EACCES injected in ``os.open`` of a data file opened for ``load(mmap=True)``."""
    ckpt = tmp_path / "ckpt"
    pyckpt.save({"x": np.arange(1000.0)}, ckpt)
    data = [n for n in os.listdir(ckpt) if n.endswith(".bin")]
    real_open = os.open

    def fake_open(path, flags, *args, **kwargs):
        if str(path).endswith(".bin"):
            raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), str(path))
        return real_open(path, flags, *args, **kwargs)

    import builtins

    real_bopen = builtins.open

    def fake_bopen(file, *args, **kwargs):  # whichever open the reader uses
        if str(file).endswith(".bin"):
            raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), str(file))
        return real_bopen(file, *args, **kwargs)

    monkeypatch.setattr(os, "open", fake_open)
    monkeypatch.setattr(builtins, "open", fake_bopen)
    with pytest.raises(CheckpointIOError) as info:
        pyckpt.load(ckpt, mmap=True)
    monkeypatch.undo()
    _assert_io_error(info.value, errno.EACCES, data[0])
    assert isinstance(info.value.__cause__, PermissionError)


_CHILD = textwrap.dedent("""
    import errno, json, os, sys
    import numpy as np
    import pyckpt
    from pyckpt.errors import CheckpointIOError

    root = sys.argv[1]
    out = {}

    def attempt(name, tree, path):
        try:
            pyckpt.save(tree, path)
            out[name] = "ok"
        except Exception as e:
            out[name] = {"type": type(e).__name__, "io": isinstance(e, CheckpointIOError),
                         "errno": getattr(e, "errno", None), "msg": str(e),
                         "cause": type(e.__cause__).__name__ if e.__cause__ else None}

    ckpt = os.path.join(root, "ckpt")
    attempt("first", {"x": np.arange(5)}, ckpt)
    fd = os.open(os.path.join(root, "filler"), os.O_WRONLY | os.O_CREAT)
    try:  # fill the filesystem
        while True:
            os.write(fd, b"x" * 4096)
    except OSError:
        pass
    os.close(fd)
    attempt("full", {"x": np.arange(6)}, ckpt)
    attempt("full_new", {"x": np.arange(6)}, os.path.join(root, "other"))
    os.unlink(os.path.join(root, "filler"))
    out["after_full"] = pyckpt.load(ckpt)["x"].tolist()
    sys.stdout.flush()
    print(json.dumps(out))
""")


def _unshare_tmpfs_available() -> bool:
    if shutil.which("unshare") is None or shutil.which("mount") is None:
        return False
    import tempfile

    probe = tempfile.mkdtemp()
    try:
        r = subprocess.run(["unshare", "-m", "sh", "-c", f"mount -t tmpfs -o size=64k tmpfs {probe}"],
                           capture_output=True)
    finally:
        os.rmdir(probe)
    return r.returncode == 0


@pytest.mark.skipif(not sys.platform.startswith("linux") or not _unshare_tmpfs_available(),
                    reason="needs unshare -m and mount (root in a permissive sandbox)")
def test_real_full_and_read_only_tmpfs(tmp_path):
    """A real 1 MiB tmpfs in a private mount namespace: filled up, then remounted read-only."""
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    child = tmp_path / "child.py"
    child.write_text(_CHILD)
    ro_child = tmp_path / "ro_child.py"
    ro_child.write_text(_CHILD.split("ckpt = os.path.join")[0] + textwrap.dedent("""
        attempt("ro", {"x": np.arange(6)}, os.path.join(root, "ckpt"))
        attempt("ro_new", {"x": np.arange(6)}, os.path.join(root, "other2"))
        out["after_ro"] = pyckpt.load(os.path.join(root, "ckpt"))["x"].tolist()
        print(json.dumps(out))
    """))
    script = (f"mount -t tmpfs -o size=1m tmpfs {mnt} && "
              f"{sys.executable} {child} {mnt} && mount -o remount,ro {mnt} && "
              f"{sys.executable} {ro_child} {mnt}")
    r = subprocess.run(["unshare", "-m", "sh", "-c", script], capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0, r.stderr[-3000:]
    full, ro = (json.loads(line) for line in r.stdout.strip().splitlines()[-2:])
    assert full["first"] == "ok"
    for name in ("full", "full_new"):
        got = full[name]
        assert got["io"] and got["errno"] == errno.ENOSPC and got["cause"] is not None, got
        assert str(mnt) in got["msg"], got
    assert full["after_full"] == list(range(5))
    for name in ("ro", "ro_new"):
        got = ro[name]
        assert got["io"] and got["errno"] == errno.EROFS and got["cause"] is not None, got
        assert str(mnt) in got["msg"], got
    assert ro["after_ro"] == list(range(5))


# ---------------------------------------------------------------------------
# Invalid manifests
# ---------------------------------------------------------------------------

def rewrite_manifest(ckpt, edit) -> None:
    """Applies edit(doc) to the manifest and re-encodes the index with valid checksums."""
    path = os.path.join(ckpt, "pyckpt.index")
    with open(path, "rb") as f:
        data = f.read()
    length = struct.unpack_from("<Q", data, 16)[0]
    doc = json.loads(data[32:32 + length])
    edit(doc)
    body = json.dumps(doc).encode()
    head = struct.pack("<8sIIQI", b"PYCKPTIX", 1, 0, len(body), mask(crc32c(body)))
    with open(path, "wb") as f:
        f.write(head + struct.pack("<I", mask(crc32c(head))) + body + b"PYCKEND\n")


def _entry_points(ckpt):
    return {
        "load": lambda: pyckpt.load(ckpt),
        "load_into": lambda: pyckpt.load(ckpt, into={"good": np.zeros(3)}),
        "load_mmap": lambda: pyckpt.load(ckpt, mmap=True),
        "list_variables": lambda: pyckpt.list_variables(ckpt),
        "load_checkpoint": lambda: pyckpt.load_checkpoint(ckpt).get_variable_to_shape_map(),
        "dtype_map": lambda: pyckpt.load_checkpoint(ckpt).get_variable_to_dtype_map(),
        "load_variable": lambda: pyckpt.load_variable(ckpt, "bad"),
        "restore": lambda: pyckpt.Checkpoint().read(ckpt),
    }


def _bad_checkpoint(tmp_path, dtype, shape, nbytes=None):
    ckpt = tmp_path / "ckpt"
    pyckpt.save({"good": np.arange(3.0), "bad": np.zeros(0, np.float32)}, ckpt)

    def edit(doc):
        i = doc["tensors"]["key"].index("bad")
        doc["tensors"]["dtype"][i] = dtype
        doc["tensors"]["shape"][i] = shape
        if nbytes is not None:
            doc["blocks"]["nbytes"][i] = nbytes

    rewrite_manifest(ckpt, edit)
    return ckpt


ENTRY_POINTS = ["load", "load_into", "load_mmap", "list_variables", "load_checkpoint",
                "dtype_map", "load_variable", "restore"]


@pytest.mark.parametrize("entry", ENTRY_POINTS)
@pytest.mark.parametrize("dtype", ["M8[zz]", "m8[999999999999s]"])
def test_bad_datetime_unit(tmp_path, entry, dtype):
    ckpt = _bad_checkpoint(tmp_path, dtype, [0])
    with pytest.raises(CorruptCheckpointError) as info:
        _entry_points(ckpt)[entry]()
    msg = str(info.value)
    assert "'bad'" in msg and "pyckpt.index" in msg and dtype in msg, msg


@pytest.mark.parametrize("entry", ENTRY_POINTS)
@pytest.mark.parametrize("shape", [[0, 2**62], [2**61, 0, 2**61], [0] + [2**31] * 3])
def test_zero_size_shape_too_big_for_numpy(tmp_path, entry, shape):
    """prod(shape) * itemsize is 0, but numpy cannot represent the shape."""
    ckpt = _bad_checkpoint(tmp_path, "float32", shape, nbytes=0)
    with pytest.raises(CorruptCheckpointError) as info:
        _entry_points(ckpt)[entry]()
    msg = str(info.value)
    assert "'bad'" in msg and "pyckpt.index" in msg and "shape" in msg, msg


def test_zero_size_shape_limit_counts_zero_dimensions_as_one(tmp_path):
    """The limit is 2^62 bytes with zero dimensions counted as 1: (0, 2^62) fits for
    1-byte items (numpy can represent it) and not for 2-byte ones."""
    ok = _bad_checkpoint(tmp_path / "ok", "uint8", [0, 2**62], nbytes=0)
    out = pyckpt.load(ok)
    assert out["bad"].shape == (0, 2**62) and out["bad"].dtype == np.uint8
    too_big = _bad_checkpoint(tmp_path / "too_big", "float16", [0, 2**62], nbytes=0)
    with pytest.raises(CorruptCheckpointError, match="'bad'.*too large"):
        pyckpt.list_variables(too_big)


@pytest.mark.parametrize("column", ["file", "offset", "nbytes"])
def test_boolean_in_integer_column(tmp_path, column):
    """JSON booleans are not integers (docs/FORMAT.md), even inside a list of integers."""
    ckpt = tmp_path / "ckpt"
    pyckpt.save({"a": np.zeros(0), "b": np.zeros(0)}, ckpt)

    def edit(doc):
        doc["blocks"][column][1] = False if column == "nbytes" else True

    rewrite_manifest(ckpt, edit)
    with pytest.raises(CorruptCheckpointError, match="pyckpt.index"):
        pyckpt.list_variables(ckpt)


@pytest.mark.parametrize("bad_key", ["", "/a", "a/", "a//b", ".", "..", "./a", "a/.", "a/./b",
                                     "a/../b", "../a", "a\x00b", 7, None])
def test_invalid_or_duplicate_keys_are_named(tmp_path, bad_key):
    """Keys are validated all at once (a fast path for huge manifests); the error still
    names the offending key, a duplicated one included."""
    ckpt = tmp_path / "ckpt"
    pyckpt.save({"a": np.zeros(0), "b": np.zeros(0), "c": np.zeros(0)}, ckpt)
    rewrite_manifest(ckpt, lambda doc: doc["tensors"]["key"].__setitem__(1, bad_key))
    with pytest.raises(CorruptCheckpointError, match=r"pyckpt\.index.*invalid key") as info:
        pyckpt.list_variables(ckpt)
    assert repr(bad_key) in str(info.value) or "empty" in str(info.value)

    rewrite_manifest(ckpt, lambda doc: doc["tensors"]["key"].__setitem__(1, "c"))
    with pytest.raises(CorruptCheckpointError, match="key 'c' is listed twice"):
        pyckpt.list_variables(ckpt)
