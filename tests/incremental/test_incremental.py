"""CheckpointManager(..., incremental=True): what each save writes, that every kept
checkpoint reads whole through every reader, retention and references, tampering."""

import json
import os
import pathlib
import sys
import warnings

import numpy as np
import pytest

import pyckpt
from pyckpt.engine import incremental
from pyckpt.engine.reader import open_checkpoint
from pyckpt.format import index as index_format

sys.path.insert(0, str(pathlib.Path(__file__).parent))
from inc_helpers import (FROZEN_SHAPE, HEAD_SHAPE, data_bytes, model, restored, same,
                         train_step, values)


def _run(tmp_path, steps, **kw):
    ck = model()
    kw.setdefault("max_to_keep", 3)
    m = pyckpt.CheckpointManager(ck, tmp_path / "run", incremental=True, **kw)
    saved = {}
    for s in range(1, steps + 1):
        train_step(ck, s)
        saved[m.save()] = values(ck)
    return m, ck, saved


def _index(path):
    return open_checkpoint(path).manifest


def test_frozen_base_saves_write_only_what_changed(tmp_path):
    m, _, saved = _run(tmp_path, 6, max_to_keep=None)
    paths = list(saved)
    frozen = np.prod(FROZEN_SHAPE) * 4
    first = data_bytes(paths[0])
    assert first >= frozen  # the first save is full
    for p in paths[1:]:
        # the head, the step counter and sometimes the ema: far less than the frozen part
        assert data_bytes(p) < 16_000, (p, data_bytes(p))
        man = _index(p)
        own, referenced = man.own_and_referenced_bytes()
        assert referenced >= frozen and own < 16_000
        assert man.version == 2 and man.info["incremental"]["base"] is not None
        run = pathlib.Path(p).parent
        for f in man.files:  # direct references, never chained: the file is its holder's own
            if f.at is not None:
                assert int(f.at.split("-")[1]) < int(pathlib.Path(p).name.split("-")[1])
                assert any(g.name == f.name and g.at is None for g in _index(run / f.at).files)
    for p, want in saved.items():
        same(restored(p), want)


def test_every_reader_sees_whole_checkpoints(tmp_path):
    m, ck, saved = _run(tmp_path, 4)
    latest = m.latest_checkpoint
    want = saved[latest]
    flat = pyckpt.load(latest)
    r = pyckpt.load_checkpoint(latest)
    r.verify()
    np.testing.assert_array_equal(r.get_tensor(_key(r, "frozen")), want["frozen"])
    assert any(_key(r, "frozen") == k for k in dict(pyckpt.list_variables(latest)))
    assert flat is not None
    mm = pyckpt.load_checkpoint(latest)
    np.testing.assert_array_equal(mm.get_tensor(_key(mm, "head")), want["head"])
    from pyckpt import _reference_reader  # the independent reader follows references too
    ref = _reference_reader.read_all(latest)
    np.testing.assert_array_equal(ref[_key(r, "frozen")], want["frozen"])


def _key(reader, name):
    return next(k for k in reader.keys() if k.startswith(name + "/"))


def test_cli_verify_inspect_and_self_contained_cp(tmp_path, capsys):
    m, ck, saved = _run(tmp_path, 3)
    latest = m.latest_checkpoint
    from pyckpt.cli import main
    assert main(["verify", latest]) == 0
    assert main(["inspect", latest]) == 0
    out = capsys.readouterr().out
    assert "referenced in ckpt-1" in out, out
    assert main(["inspect", latest, "--json"]) == 0
    facts = json.loads(capsys.readouterr().out)
    assert facts["referenced_bytes"] >= np.prod(FROZEN_SHAPE) * 4
    copy = tmp_path / "copy"
    assert main(["cp", latest, str(copy)]) == 0
    man = _index(copy)
    assert not man.has_references and man.version == 1
    assert man.info["incremental"]["base"] is None  # a full checkpoint, a base for the next
    # the copy stands alone: the run directory can go
    import shutil
    shutil.rmtree(tmp_path / "run")
    same(restored(str(copy)), saved[latest])


def test_async_incremental_saves(tmp_path):
    ck = model()
    m = pyckpt.CheckpointManager(ck, tmp_path / "run", max_to_keep=2, incremental=True)
    saved = {}
    for s in range(1, 6):
        train_step(ck, s)
        want = values(ck)
        p = m.save(blocking=False)
        ck.head.assign(np.full(HEAD_SHAPE, -1, np.float32))  # must not reach the checkpoint
        m.wait_until_finished()
        saved[p] = want
    for p in m.checkpoints:
        same(restored(p), saved[p])
    assert _index(m.latest_checkpoint).has_references


def test_retention_keeps_referenced_files_and_collects_them_later(tmp_path):
    m, ck, saved = _run(tmp_path, 5, max_to_keep=2, full_save_every=4)
    run = tmp_path / "run"
    # ckpt-1 (full) left the kept set but ckpt-2/3 referenced it: its data stayed, not its index
    for p in m.checkpoints:
        same(restored(p), saved[p])
    # save 5 is full (full_save_every=4), after which ckpt-1's data is unreferenced...
    assert not _index(m.latest_checkpoint).has_references
    for s in range(6, 8):
        train_step(ck, s)
        saved[m.save()] = values(ck)
    # ...and collected by a later retention
    # (ckpt-5, full, left the kept set too: ckpt-6 and 7 reference it, so it is held)
    assert sorted(n for n in os.listdir(run) if n.startswith("ckpt")) == ["ckpt-5", "ckpt-6",
                                                                          "ckpt-7"]
    state = json.loads((run / "pyckpt-manager.json").read_text())
    assert state["deleting"] == ["ckpt-5"]
    for p in m.checkpoints:
        same(restored(p), saved[p])


def test_held_directory_is_no_checkpoint(tmp_path):
    m, ck, saved = _run(tmp_path, 3, max_to_keep=1)
    run = tmp_path / "run"
    assert not (run / "ckpt-1" / "pyckpt.index").exists()
    assert [n for n in os.listdir(run / "ckpt-1") if n.startswith("data-")]
    assert m.checkpoints == [str(run / "ckpt-3")]
    assert pyckpt.latest_checkpoint(run) == str(run / "ckpt-3")
    same(restored(str(run / "ckpt-3")), saved[str(run / "ckpt-3")])
    state = json.loads((run / "pyckpt-manager.json").read_text())
    assert state["deleting"] == ["ckpt-1"]  # held data, collected when unreferenced
    from pyckpt.runs import list_checkpoints
    rows = {r["name"]: r for r in list_checkpoints(str(run))[1]}
    assert rows["ckpt-1"]["status"] == "held" and rows["ckpt-3"]["status"] == "committed"
    assert rows["ckpt-3"]["references"] == ["ckpt-1"]
    # a new manager (a restart) keeps the held data too
    m.close()
    m2 = pyckpt.CheckpointManager(model(), run, max_to_keep=1, incremental=True)
    m2.restore_or_initialize()
    ck2 = m2.checkpoint
    train_step(ck2, 4)
    p = m2.save()
    same(restored(p), values(ck2))


def test_reader_open_during_retention_keeps_working(tmp_path):
    m, ck, saved = _run(tmp_path, 2, max_to_keep=1)
    latest = m.latest_checkpoint
    r = pyckpt.load_checkpoint(latest)  # open: index read, files not yet
    for s in range(3, 6):  # ckpt-2 is retired; its references to ckpt-1 are dropped
        train_step(ck, s)
        m.save()
    key = _key(r, "frozen")
    np.testing.assert_array_equal(r.get_tensor(key), saved[latest]["frozen"])  # still there


def test_changed_dtype_shape_and_new_keys_are_written(tmp_path):
    ck = model()
    m = pyckpt.CheckpointManager(ck, tmp_path / "run", incremental=True)
    m.save()
    ck.frozen = pyckpt.Variable(np.array(ck.frozen.numpy(), dtype=np.float64))  # same values
    ck.extra = pyckpt.Variable(np.arange(5))
    p = m.save()
    man = _index(p)
    frozen = man.index[_key(pyckpt.load_checkpoint(p), "frozen")]
    assert man.files[int(man.blocks.file[man.blocks.tensor_begin[frozen]])].at is None
    same(restored_any(p, ck), values_any(ck))


def restored_any(path, like):
    ck = pyckpt.Checkpoint(**{k: pyckpt.Variable(np.zeros_like(getattr(like, k).numpy()))
                              for k in ("frozen", "head", "ema", "extra")})
    ck.restore(path)
    return values_any(ck)


def values_any(ck):
    return {k: np.array(getattr(ck, k).numpy()) for k in ("frozen", "head", "ema", "extra")}


def test_one_changed_byte_is_written(tmp_path):
    ck = model()
    m = pyckpt.CheckpointManager(ck, tmp_path / "run", incremental=True)
    m.save()
    w = ck.frozen.numpy().copy()
    w.reshape(-1).view(np.uint8)[123_457] ^= 1  # one bit, deep inside one chunk
    ck.frozen.assign(w)
    p = m.save()
    assert restored(p)["frozen"].tobytes() == w.tobytes()


def test_most_changed_makes_the_next_save_full(tmp_path):
    ck = model()
    m = pyckpt.CheckpointManager(ck, tmp_path / "run", incremental=True)
    modes = []
    for s in range(1, 5):
        ck.frozen.assign(ck.frozen.numpy() + 1)  # the large part changes every step
        p = m.save()
        modes.append(_index(p).has_references)
    # save 2 compares first (it references the unchanged head), finds most bytes
    # changed, so the saves after it write everything without comparing first
    assert modes == [False, True, False, False]
    st = incremental.stats(_index(p))
    assert st["changed_bytes"] > 0.75 * st["total_bytes"]


def test_removed_referenced_file_raises_naming_it(tmp_path):
    m, ck, saved = _run(tmp_path, 3)
    latest = m.latest_checkpoint
    data = [n for n in os.listdir(tmp_path / "run" / "ckpt-1") if n.startswith("data-")]
    os.remove(tmp_path / "run" / "ckpt-1" / data[0])
    with pytest.raises(pyckpt.CorruptCheckpointError) as e:
        pyckpt.load(latest)
    assert "ckpt-3" in str(e.value) and data[0] in str(e.value) and "ckpt-1" in str(e.value)


def test_corrupt_referenced_file_raises_naming_it(tmp_path):
    m, ck, saved = _run(tmp_path, 3)
    latest = m.latest_checkpoint
    d = tmp_path / "run" / "ckpt-1"
    name = [n for n in os.listdir(d) if n.startswith("data-")][0]
    with open(d / name, "r+b") as f:
        f.seek(1000)
        b = f.read(1)
        f.seek(1000)
        f.write(bytes([b[0] ^ 0xFF]))
    with pytest.raises(pyckpt.CorruptCheckpointError) as e:
        pyckpt.load_checkpoint(latest).verify()
    assert name in str(e.value)
    # the next save sees a base whose data no longer verifies only when read: it still
    # must not reference a file that is gone; a damaged base is caught by every read


def test_missing_base_file_makes_the_save_write_it(tmp_path):
    m, ck, saved = _run(tmp_path, 2)
    d = tmp_path / "run" / "ckpt-1"
    os.remove(d / [n for n in os.listdir(d) if n.startswith("data-")][0])
    train_step(ck, 3)
    with pytest.warns(UserWarning, match="written again"):
        p = m.save()
    same(restored(p), values(ck))


def test_a_reader_before_references_refuses(tmp_path, monkeypatch):
    m, _, _ = _run(tmp_path, 2)
    monkeypatch.setattr(index_format, "SUPPORTED_VERSION", 1)
    with pytest.raises(pyckpt.CorruptCheckpointError, match="format version 2 is newer"):
        pyckpt.load(m.latest_checkpoint)


def test_saving_over_held_data_is_refused(tmp_path):
    m, ck, _ = _run(tmp_path, 3, max_to_keep=1)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with pytest.raises(ValueError, match="reference"):
            m.save(checkpoint_number=1)
    same(restored(m.latest_checkpoint), values(ck))


def test_tiered_manager_persists_incrementally(tmp_path):
    """The local tier saves incrementally; each persist copies the tensors the durable
    tier's newest checkpoint does not hold and references the rest there."""
    ck = model()
    m = pyckpt.CheckpointManager(ck, tmp_path / "durable", max_to_keep=2, incremental=True,
                                 local_dir=tmp_path / "local", local_max_to_keep=2,
                                 persist_every=1)
    saved = {}
    for s in range(1, 6):
        train_step(ck, s)
        saved[pathlib.Path(m.save()).name] = values(ck)
        m.wait_until_finished()  # the persist too
    m.close()
    durable = tmp_path / "durable"
    kept = [pathlib.Path(p).name for p in m._tiers.durable.checkpoints]
    assert kept == ["ckpt-4", "ckpt-5"]
    for name in kept:
        man = _index(durable / name)
        own, referenced = man.own_and_referenced_bytes()
        assert referenced >= np.prod(FROZEN_SHAPE) * 4 and own < 16_000, (name, own)
        assert data_bytes(durable / name) < 16_000
        assert {f.at for f in man.files if f.at} <= {"ckpt-1", "ckpt-3"}
    import shutil
    shutil.rmtree(tmp_path / "local")  # the durable tier stands alone
    for name in kept:
        same(restored(str(durable / name)), saved[name])
        pyckpt.load_checkpoint(str(durable / name)).verify()


def test_unsupported_modes_raise(tmp_path):
    with pytest.raises(ValueError, match="full_save_every"):
        pyckpt.CheckpointManager(model(), tmp_path / "a", incremental=True, full_save_every=0)
    from pyckpt.testing.thread_comm import ThreadGroup

    def two(comm):
        with pytest.raises(NotImplementedError, match="local_dir"):
            pyckpt.CheckpointManager(model(), tmp_path / "a", incremental=True, comm=comm,
                                     local_dir=tmp_path / f"b{comm.rank}")
    assert ThreadGroup(2).run(two) == [None, None]


def test_hash_matches_sha256_of_each_chunk():
    import hashlib
    from pyckpt.engine.fingerprints import block_hashes
    a = np.arange(300_000, dtype=np.float32)
    got = block_hashes([a, np.zeros(0), a[::2]], 1 << 20)
    raw = a.tobytes()
    want = "".join(hashlib.sha256(raw[i:i + (1 << 20)]).digest()[:16].hex()
                   for i in range(0, len(raw), 1 << 20))
    assert got[0] == want and got[1] == ""
    assert got[2] == hashlib.sha256(a[::2].tobytes()).digest()[:16].hex()


def test_no_reuse_across_chunk_sizes(tmp_path):
    """A base checksummed in other chunks cannot lend its CRCs: everything is written."""
    m, _, _ = _run(tmp_path, 1)
    p = m.latest_checkpoint
    base = incremental.Base("ckpt-1", p, _index(p))
    key = next(k for k in base.manifest.keys if k.startswith("frozen/"))
    i = base.manifest.index[key]
    b = base.manifest.blocks
    h = b.hashes[int(b.tensor_begin[i])]
    args = (key, "float32", FROZEN_SHAPE, None, h)
    assert incremental.Matcher(base, None, 1 << 20).block(*args) >= 0
    assert incremental.Matcher(base, None, 1 << 21).block(*args) == -1
    assert incremental.Matcher(base, None, 1 << 20).block(key, "float32", FROZEN_SHAPE, None,
                                                          "0" * len(h)) == -1


def test_a_plain_manager_after_incremental_saves_keeps_referenced_data(tmp_path):
    """Turning incremental off in a run with references: retention still holds what
    the kept checkpoints reference, and collects it once they are gone."""
    m, ck, saved = _run(tmp_path, 3, max_to_keep=3)
    m.close()
    plain = pyckpt.CheckpointManager(ck, tmp_path / "run", max_to_keep=2)
    train_step(ck, 4)
    saved[plain.save()] = values(ck)
    for p in plain.checkpoints:  # ckpt-3 references ckpt-1, retired now: held
        same(restored(p), saved[p])
    for s in (5, 6):
        train_step(ck, s)
        saved[plain.save()] = values(ck)
    assert sorted(n for n in os.listdir(tmp_path / "run") if n.startswith("ckpt")) == \
        ["ckpt-5", "ckpt-6"]
