"""Issue 38 item 5: where an incremental run's disk goes. ``pyckpt ls`` shows each
directory's bytes (OWNED) and those other checkpoints read (HELD-FOR-OTHERS), held
directories included; ``inspect`` of a held directory names the checkpoints that
read it; ``describe()`` carries ``info``; ``full_save_every=N`` makes one save in N
full, as the docs say."""

from __future__ import annotations

import json
import os
import pathlib
import re

import pytest

import pyckpt
from pyckpt.cli import main
from pyckpt.commands.common import human

from .inc_helpers import data_bytes, model, train_step

ROOT = pathlib.Path(__file__).resolve().parents[2]


def _run(tmp_path, saves, **kw):
    ck = model()
    with pyckpt.CheckpointManager(ck, tmp_path / "run", incremental=True, **kw) as m:
        paths = []
        for step in range(1, saves + 1):
            train_step(ck, step)
            paths.append(m.save())
    return paths


def _cli(capsys, *argv):
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


@pytest.fixture
def held_run(tmp_path):
    """ckpt-1 (full) retired by max_to_keep=2 but read by ckpt-3 and ckpt-4: held."""
    _run(tmp_path, 4, max_to_keep=2)
    run = tmp_path / "run"
    assert sorted(n for n in os.listdir(run) if n.startswith("ckpt")) == \
        ["ckpt-1", "ckpt-3", "ckpt-4"]
    return run


def test_ls_shows_bytes_owned_and_held_for_others(held_run, capsys):
    run = held_run
    code, out, _ = _cli(capsys, "ls", str(run), "--json")
    assert code == 0
    rows = {r["name"]: r for r in json.loads(out)}
    # what each directory holds on disk, and which of it others read, from the indexes
    read_by: dict[str, dict[str, int]] = {}
    for name in ("ckpt-3", "ckpt-4"):
        for f in pyckpt.load_checkpoint(str(run / name)).source.describe()["files"]:
            if "in" in f:
                read_by.setdefault(f["in"], {})[f["name"]] = f["bytes"]
    assert "ckpt-1" in read_by
    for name, r in rows.items():
        assert r["owned_bytes"] == data_bytes(run / name), name
        assert r["held_for_others_bytes"] == sum(read_by.get(name, {}).values()), name
    held = rows["ckpt-1"]
    assert held["status"] == "held" and held["held_for"] == ["ckpt-3", "ckpt-4"]
    assert held["held_for_others_bytes"] > 0
    assert rows["ckpt-4"]["bytes"] > rows["ckpt-4"]["owned_bytes"]  # it reads ckpt-1's data

    code, out, _ = _cli(capsys, "ls", str(run))
    assert code == 0
    lines = out.splitlines()
    assert "OWNED" in lines[0] and "HELD-FOR-OTHERS" in lines[0]
    held_line = next(line for line in lines if line.startswith("ckpt-1 "))
    assert "held for ckpt-3, ckpt-4" in held_line
    assert held_line.count(human(held["owned_bytes"])) == 2  # OWNED, all HELD-FOR-OTHERS
    total = sum(data_bytes(run / n) for n in rows)
    assert lines[-1].startswith("on disk: ") and "3 directories" in lines[-1]
    assert "held for other checkpoints" in lines[-1]
    assert total == sum(r["owned_bytes"] for r in rows.values())


def test_inspect_of_a_held_directory_names_who_reads_it(held_run, capsys):
    code, _, err = _cli(capsys, "inspect", str(held_run / "ckpt-1"))
    assert code == 1
    assert "retired checkpoint" in err and "ckpt-3, ckpt-4" in err
    assert "interrupted" not in err
    with pytest.raises(pyckpt.CheckpointNotFoundError, match="ckpt-3, ckpt-4"):
        pyckpt.load(str(held_run / "ckpt-1"))


def test_describe_carries_info(held_run):
    facts = pyckpt.load_checkpoint(str(held_run / "ckpt-4")).source.describe()
    inc = facts["info"]["incremental"]
    assert inc["base"] == "ckpt-3" and inc["since_full"] == 3


def _full_saves(tmp_path, every, saves=12):
    paths = _run(tmp_path / str(every), saves, max_to_keep=None, full_save_every=every)
    info = [pyckpt.load_checkpoint(p).source.describe()["info"]["incremental"] for p in paths]
    return [n for n, inc in enumerate(info, 1) if inc["base"] is None]


def test_full_save_every_n_makes_one_save_in_n_full_as_documented(tmp_path):
    assert _full_saves(tmp_path, 10) == [1, 11]
    assert _full_saves(tmp_path, 3) == [1, 4, 7, 10]
    assert _full_saves(tmp_path, 1, saves=3) == [1, 2, 3]
    # the docs say the same (README and docs/API.md section 18)
    for doc in ("README.md", "docs/API.md"):
        text = re.sub(r"\s+", " ", (ROOT / doc).read_text())
        assert "saves 1, 11, 21" in text, doc
        assert "-th save (default 10) is full" not in text, doc
