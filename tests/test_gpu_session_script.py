"""benchmarks/gpu_session.sh and bench_gpu_table.py, checked here without a GPU: the dry
run (host tensors, tiny sizes) goes through every section of the table and the
summary, so a broken script shows here and not on a lent GPU machine."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "benchmarks" / "gpu_session.sh"


def _table_module():
    spec = importlib.util.spec_from_file_location("bench_gpu_table",
                                                  ROOT / "benchmarks" / "bench_gpu_table.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules.setdefault(spec.name, mod)  # its dataclasses look their module up
    spec.loader.exec_module(sys.modules[spec.name])
    return sys.modules[spec.name]


def test_the_dry_run_prints_every_row(tmp_path):
    pytest.importorskip("torch")
    out = tmp_path / "out"
    env = dict(os.environ, DRY_RUN="1", OUT=str(out), PYTHON=sys.executable,
               TABLE_DIR=str(tmp_path), BUDGET="120")
    r = subprocess.run(["bash", str(SCRIPT)], cwd=ROOT, env=env, capture_output=True, text=True,
                       timeout=120)
    text = r.stdout + r.stderr
    assert r.returncode == 0, text[-4000:]
    table = text[text.index("== ISSUE 40 TABLE"):]
    mod = _table_module()
    for spec in mod.SPECS:  # every row of the table, with a figure or a reason
        assert spec.label in table, spec.label
    assert "skipped: no CUDA" in table
    assert "table exit 0" in text  # no section failed
    rows = [json.loads(line) for line in (out / "rows.jsonl").read_text().splitlines()]
    measured = {row["id"] for row in rows if row["ratio"] is not None}
    # what runs on host tensors has a figure
    assert {"save", "load_peer", "budget_rss", "copy_state", "snapshot", "restore",
            "seq_copy_state", "seq_snapshot", "seq_restore", "load_cold"} <= measured
    jax = next(line for line in table.splitlines() if line.startswith("JAX restore"))
    assert "skipped (dry run)" in jax  # the script's note for the JAX row


def test_summary_of_a_cut_rows_file(tmp_path):
    """A run killed mid-write leaves a cut last line: the summary still prints every
    row, met / MISSED from the spec's direction, and the JAX row from its JSON."""
    mod = _table_module()
    rows = tmp_path / "rows.jsonl"
    rows.write_text(json.dumps({"id": "save", "measured": "2 s", "ref": "1.9 s", "ratio": 0.95,
                                "note": ""}) + "\n"
                    + json.dumps({"id": "async_later", "measured": "0.1 s", "ref": "0.079 s",
                                  "ratio": 1.29, "note": ""}) + "\n" + '{"id": "load_li')
    jax = tmp_path / "jax.json"
    jax.write_text(json.dumps({"state": {"bytes": 2.15e9, "platform": "gpu"}, "rows": {
        "restore @ this tree": {"first_s": 1.14, "later_s": 0.15, "first_over_later": 7.6},
        "orbax @ this tree": {"first_s": 0.52, "later_s": 0.45, "first_over_later": 1.15}}}))
    got = mod.load_rows(str(rows))
    assert set(got) == {"save", "async_later"}
    got.update(mod.jax_rows(str(jax)))
    lines = mod.summary_lines(got)
    by_label = {s.label: next(line for line in lines if line.startswith(s.label))
                for s in mod.SPECS}
    assert by_label[mod.SPEC["save"].label].rstrip().endswith("met")
    assert "MISSED" in by_label[mod.SPEC["async_later"].label]
    assert "7.60x" in by_label[mod.SPEC["jax_restore"].label]
    assert "Orbax 0.520 / 0.450 s" in by_label[mod.SPEC["jax_restore"].label]
    assert "MISSED" in by_label[mod.SPEC["jax_restore"].label]
    assert "not measured" in by_label[mod.SPEC["load_limit"].label]
    assert len(lines) == len(mod.SPECS) + 2


def test_summarize_takes_notes_and_needs_no_torch(tmp_path):
    rows = tmp_path / "rows.jsonl"
    rows.write_text("")
    code = ("import sys; sys.modules['torch'] = None; sys.argv = ['x', '--summarize', "
            f"{str(rows)!r}, '--note', 'jax_restore=skipped (no jax)']; "
            f"sys.path.insert(0, {str(ROOT / 'benchmarks')!r}); import bench_gpu_table as b; "
            "sys.exit(b.main())")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert "skipped (no jax)" in r.stdout
