"""Issue 38 item 6: ``pyckpt inspect`` shows what ``load`` returns, the values that are
no tensors included (str, bytes, None; DCP's non-tensor entries), also by KEY; long
keys do not widen every line; ``ls`` finds the step in Lightning's and DCP's names;
``ls`` and ``inspect`` say which bytes they count."""

from __future__ import annotations

import json
import os
import shutil

import numpy as np

import pyckpt
from pyckpt.cli import main
from pyckpt.commands.common import human

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DCP = os.path.join(ROOT, "tests", "interop_dcp", "fixtures", "ckpt")
LONG = "callbacks/ModelCheckpoint{'monitor': None, 'mode': 'min', 'every_n_epochs': 1}/" * 3


def _cli(capsys, *argv):
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def _state():
    return {"w": np.arange(6, dtype=np.float32).reshape(2, 3), "name": "tiny", "note": None,
            "blob": b"\x00\xff", "opt": {"param_groups": [{"lr": 0.5, "foreach": None}]},
            LONG + "kth_value": np.float32(1.5), LONG + "dirpath": "/tmp/ck"}


def test_inspect_lists_the_values_load_returns(tmp_path, capsys):
    path = str(tmp_path / "ck")
    pyckpt.save(_state(), path)
    loaded = pyckpt.load(path)
    assert loaded["name"] == "tiny" and loaded["opt"]["param_groups"][0]["foreach"] is None
    code, out, _ = _cli(capsys, "inspect", path, "--json")
    assert code == 0
    doc = json.loads(out)
    values = {v["key"]: v for v in doc["values"]}
    assert set(values) == {"name", "note", "blob", "opt/param_groups/0/foreach", LONG + "dirpath"}
    assert values["name"] == {"key": "name", "type": "str", "value": "tiny"}
    assert values["note"]["type"] == "None" and values["blob"]["bytes"] == 2
    assert {t["key"] for t in doc["tensors"]} == {"w", "opt/param_groups/0/lr", LONG + "kth_value"}

    code, out, _ = _cli(capsys, "inspect", path)
    assert code == 0
    assert "values      5 that are no tensors" in out
    assert any(line.startswith("name ") and "'tiny'" in line for line in out.splitlines())
    # one value by its key, as load returns it (before: "key 'name' not in checkpoint")
    code, out, err = _cli(capsys, "inspect", path, "name", "--json")
    assert code == 0, err
    assert json.loads(out) == {"key": "name", "type": "str", "value": "tiny"}
    code, out, _ = _cli(capsys, "inspect", path, "opt/param_groups/0/foreach")
    assert code == 0 and "None" in out
    code, _, err = _cli(capsys, "inspect", path, "nope")
    assert code == 1 and "'nope'" in err


def test_long_keys_are_printed_whole_on_their_own_line(tmp_path, capsys):
    path = str(tmp_path / "ck")
    pyckpt.save(_state(), path)
    code, out, _ = _cli(capsys, "inspect", path)
    assert code == 0
    lines = out.splitlines()
    table = lines[lines.index("") + 1:]
    assert LONG + "kth_value" in table  # whole, alone: it can be copied for inspect KEY
    for line in table:
        assert len(line) <= 120 or line in (LONG + "kth_value", LONG + "dirpath"), line
    under = table[table.index(LONG + "kth_value") + 1]
    assert under.lstrip().startswith("float32") and "()" in under
    w = next(line for line in table if line.startswith("w "))
    assert len(w) < 120


def test_inspect_of_dcp_lists_its_non_tensor_entries(capsys):
    code, out, _ = _cli(capsys, "inspect", DCP)
    assert code == 0
    assert "nested.step" in out and "nested.blob" in out
    code, out, err = _cli(capsys, "inspect", DCP, "nested.step", "--json")
    assert code == 0, err
    got = json.loads(out)
    assert got["type"] == "bytes" and got["bytes"] == len(pyckpt.load(DCP)["nested.step"])


def test_ls_and_inspect_say_which_bytes_they_count(capsys):
    code, out, _ = _cli(capsys, "ls", DCP, "--json")
    (row,) = json.loads(out)
    files = sum(os.path.getsize(os.path.join(DCP, f)) for f in os.listdir(DCP)
                if f.endswith(".distcp"))
    assert row["bytes"] == row["owned_bytes"] == files
    code, out, _ = _cli(capsys, "inspect", DCP)
    lines = {line.split()[0]: line for line in out.splitlines() if line.strip()}
    assert f"{human(files)} in its directory" in lines["files"]  # ls's bytes, labelled
    tensor_bytes = pyckpt.load_checkpoint(DCP).nbytes()
    assert f"{human(tensor_bytes)} of values" in lines["tensors"]  # inspect's own, labelled


def test_ls_finds_steps_in_lightning_and_dcp_names(tmp_path, capsys):
    run = tmp_path / "run"
    for name in ("epoch=1-step=8.ckpt", "epoch=0-step=4-v1.ckpt", "last.ckpt", "ckpt-3"):
        pyckpt.save({"x": np.ones(2)}, str(run / name))
    shutil.copytree(DCP, run / "dcp_step_100")
    shutil.copytree(DCP, run / "llama3")  # a name, not a step
    code, out, _ = _cli(capsys, "ls", str(run), "--json")
    assert code == 0
    steps = {r["name"]: r["step"] for r in json.loads(out)}
    assert steps == {"epoch=1-step=8.ckpt": 8, "epoch=0-step=4-v1.ckpt": 4, "last.ckpt": None,
                     "ckpt-3": 3, "dcp_step_100": 100, "llama3": None}
    code, out, _ = _cli(capsys, "ls", str(run))
    line = next(ln for ln in out.splitlines() if ln.startswith("epoch=1-step=8.ckpt"))
    assert line.split()[1] == "8"
