"""benchmarks/bench_revs.py and what it relies on: ``harness.tree_env`` makes every process
(workers included) run the other tree's pyckpt or refuse to start; bench_dist's probes
find their points in this tree; the before/after figures are read and compared as said."""

import os
import pathlib
import shutil
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
BENCHMARKS = ROOT / "benchmarks"


@pytest.fixture
def bench(monkeypatch):
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    import bench_revs
    import harness

    return harness, bench_revs


def run(env: dict, code: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code], env=env, cwd=str(BENCHMARKS),
                          capture_output=True, text=True, timeout=300)


def test_tree_env_imports_the_tree_in_every_process(bench, tmp_path):
    harness, _ = bench
    import pyckpt._native as native

    tree = tmp_path / "tree"
    shutil.copytree(ROOT / "pyckpt", tree / "pyckpt",
                    ignore=shutil.ignore_patterns("__pycache__", "*.so"))
    shutil.copy(native.core.__file__, tree / "pyckpt")
    env = harness.tree_env(tree)
    # a process and a process it starts (as torchrun / mpiexec start workers)
    r = run(env, "import subprocess, sys, pyckpt; print(pyckpt.__file__); sys.stdout.flush(); "
                 "subprocess.run([sys.executable, '-c', 'import pyckpt; print(pyckpt.__file__)'])")
    assert r.returncode == 0, r.stderr
    files = r.stdout.split()
    assert len(files) == 2
    assert all(f == str(tree / "pyckpt" / "__init__.py") for f in files), files


def test_tree_env_refuses_to_start_without_the_tree_code(bench, tmp_path):
    harness, _ = bench
    (tmp_path / "empty").mkdir()
    r = run(harness.tree_env(tmp_path / "empty"), "print('ran')")
    assert r.returncode == 3
    assert "PYCKPT_BENCH_TREE" in r.stderr
    assert "ran" not in r.stdout


def test_dist_probes_find_every_step_in_this_tree():
    env = {k: v for k, v in os.environ.items() if k != "PYCKPT_BENCH_TREE"}
    r = run(env, "import bench_dist; print(bench_dist.install_probes([]))")
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "[]"


def test_compare_runs_medians_ratio_and_pairs(bench):
    _, revs = bench
    runs = {"before": [{"save: pyckpt.save": (1.0, True), "save: torch.save": (2.0, False)},
                       {"save: pyckpt.save": (3.0, True), "save: torch.save": (2.0, False)},
                       {}],
            "after": [{"save: pyckpt.save": (1.5, True), "save: torch.save": (2.0, False)},
                      {},
                      {"save: pyckpt.save": (2.5, True)}]}
    rows = revs.compare_runs(runs)
    py = rows["save: pyckpt.save"]
    assert (py["kind"], py["before_s"], py["after_s"], py["ratio"]) == ("pyckpt", 2.0, 2.0, 1.0)
    assert py["pair_ratios"] == [1.5]  # only round 1 has both sides
    peer = rows["save: torch.save"]
    assert (peer["kind"], peer["ratio"], peer["pair_ratios"]) == ("peer", 1.0, [1.0])


def test_dcp_figures_use_the_unrounded_rounds(bench):
    _, revs = bench
    rows = [{"storage": "local", "workers": 2, "contender": "pyckpt", "save_s": 0.001,
             "load_s": 0.002, "save_rounds_s": [0.0011, 0.0013, 0.0012],
             "load_rounds_s": [0.002, 0.0024]},
            {"storage": "s3", "workers": 1, "contender": "dcp Fsspec", "save_s": 0.5,
             "load_s": 0.25}]
    figs = revs._dcp_figures(rows)
    assert figs["local 2w save: pyckpt"] == (0.0012, True)
    assert figs["local 2w load: pyckpt"] == (pytest.approx(0.0022), True)
    assert figs["s3 1w save: dcp Fsspec"] == (0.5, False)
