"""pyckpt.dcp in real torchrun jobs (gloo, CPU): FSDP2 model and optimizer state,
DTensors sharded and replicated, non-tensor entries; saved by 4 workers, loaded by
2, 3 and 4 (DCP reshards, pyckpt reads the boxes), async saves, a failing rank."""

import os
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("torch")

import pyckpt  # noqa: E402
from pyckpt.testing.launch import run_workers  # noqa: E402

WORKERS = Path(__file__).with_name("workers.py")


def run(scenario, path, n):
    results, proc = run_workers(WORKERS, [scenario, path], n=n, timeout=300)
    assert len(results) == n, proc.stdout[-3000:] + proc.stderr[-3000:]
    return results


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    path = str(tmp_path_factory.mktemp("dcp") / "ck")
    results = run("save", path, 4)
    assert all(t.startswith("ok") for t in results.values()), results
    return path, results


def test_save_by_four_workers(saved):
    path, results = saved
    # FSDP2 runs on CPU with torch 2.13: the model's parameters are DTensors
    assert all(t == "ok fsdp2=True" for t in results.values()), results
    names = os.listdir(path)
    ranks = {n.split("-")[2] for n in names if n.startswith("data-")}
    assert len(ranks) == 4  # every worker wrote its own part
    src = pyckpt.load_checkpoint(path)
    shapes = dict(src.get_variable_to_shape_map())
    assert tuple(shapes["model.tok.weight"]) == (11, 6)
    assert tuple(shapes["optim.state.tok.weight.exp_avg"]) == (11, 6)
    import torch

    want = torch.load(path + ".want.pt")
    flat = pyckpt.load(path)
    np.testing.assert_array_equal(flat["extra.sharded"].numpy(), want["extra"]["sharded"].numpy())
    assert torch.equal(flat["model.tok.weight"], want["model"]["tok.weight"])


@pytest.mark.parametrize("n", [2, pytest.param(3, marks=pytest.mark.slow),
                               pytest.param(4, marks=pytest.mark.slow)])
def test_load_resharded(saved, n):
    path, _ = saved
    results = run("load", path, n)
    assert all(t == "ok" for t in results.values()), results


@pytest.mark.slow
def test_async_save(tmp_path):
    results = run("async", str(tmp_path / "ck"), 2)
    assert all(t == "ok" for t in results.values()), results


@pytest.mark.slow
def test_failing_rank_commits_nothing(tmp_path):
    path = str(tmp_path / "ck")
    pyckpt.save({"before": np.arange(3)}, path)
    results = run("fail", path, 2)
    assert all(t.startswith("raised CheckpointException") for t in results.values()), results
    assert any("disk full (injected on rank 1)" in t for t in results.values()), results
    # the previous checkpoint is still the committed one, whole
    np.testing.assert_array_equal(pyckpt.load(path)["before"], np.arange(3))
    pyckpt.load_checkpoint(path)  # opens and validates
