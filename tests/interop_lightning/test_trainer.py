"""pyckpt.lightning.CheckpointIO under a real ``Trainer.fit`` on the CPU (issue 24 item 4):
interrupted runs resume bit for bit, ModelCheckpoint's retention and ``last.ckpt``,
Lightning's AsyncCheckpointIO, pyckpt's background saves, memory:// and S3."""

from __future__ import annotations

import os

import fsspec
import pytest

from .conftest import EXTRA, L, assert_identical, loader, model, torch, trainer, training_state

import pyckpt  # noqa: E402
from pyckpt.lightning import CheckpointIO  # noqa: E402
from lightning.pytorch.callbacks import Callback, ModelCheckpoint  # noqa: E402
from lightning.pytorch.plugins.io import AsyncCheckpointIO  # noqa: E402

pytestmark = [pytest.mark.filterwarnings("ignore:::lightning"),  # advice for real runs
              pytest.mark.filterwarnings("ignore:::torchdata")]


class Interrupted(Exception):
    pass


class InterruptAt(Callback):
    """Stops the run (as a crash would) when it is about to take step ``step``."""

    def __init__(self, step: int) -> None:
        self.step = step

    def on_train_batch_start(self, trainer, *args):
        if trainer.global_step == self.step:
            raise Interrupted


def test_interrupted_run_resumes_bit_for_bit(tmp_path):
    """A run killed at step 6 (mid-epoch: epochs of 8 steps) and resumed from the
    pyckpt checkpoint of step 6 ends exactly as the run that was never interrupted:
    parameters, buffers, Adam's state, the scheduler, the data loader's position."""
    whole = trainer(max_epochs=2)
    whole.fit(model(), loader(stateful=True))
    want = training_state(whole)

    first = trainer(max_epochs=2, plugins=[CheckpointIO()], callbacks=[
        InterruptAt(6), ModelCheckpoint(tmp_path, every_n_train_steps=3, save_top_k=-1)])
    with pytest.raises(Interrupted):
        first.fit(model(), loader(stateful=True))
    ckpt = tmp_path / "epoch=0-step=6.ckpt"
    assert (ckpt / "pyckpt.index").is_file()  # a pyckpt checkpoint, not a torch.save file
    assert pyckpt.load_checkpoint(ckpt).has_tensor("global_step")

    resumed = trainer(max_epochs=2, plugins=[CheckpointIO()])
    m = model(seed=99)  # other initial weights: they must all be overwritten
    resumed.fit(m, loader(stateful=True), ckpt_path=str(ckpt))
    got = training_state(resumed)
    assert got["step"] == want["step"] == 16
    assert_identical(got, want, "state")
    assert_identical(m.loaded_extra, EXTRA, "extra")  # Python values keep their types


def test_top_k_removes_older_checkpoints_and_rewrites_last(tmp_path):
    """ModelCheckpoint(save_top_k=1) keeps only the best checkpoint (the others go
    through remove_checkpoint), and last.ckpt, rewritten every epoch, holds the last
    epoch's state and no data of the earlier ones."""
    removed = []

    class Recording(CheckpointIO):
        def remove_checkpoint(self, path):
            removed.append(os.path.basename(path))
            super().remove_checkpoint(path)

    t = trainer(max_epochs=3, plugins=[Recording()], callbacks=[
        ModelCheckpoint(tmp_path, monitor="score", mode="max", save_top_k=1, save_last=True)])
    t.fit(model(), loader(), loader())
    assert removed == ["epoch=0-step=8.ckpt", "epoch=1-step=16.ckpt"]
    assert sorted(os.listdir(tmp_path)) == ["epoch=2-step=24.ckpt", "last.ckpt"]
    last = CheckpointIO().load_checkpoint(tmp_path / "last.ckpt")
    assert last["global_step"] == 24 and last["epoch"] == 2
    assert_identical(dict(last["state_dict"]), dict(t.lightning_module.state_dict()))
    files = sorted(n.split("-")[0] for n in os.listdir(tmp_path / "last.ckpt"))
    assert files == ["data", "pyckpt.index"]  # the earlier epochs' data is gone
    best = CheckpointIO().load_checkpoint(tmp_path / "epoch=2-step=24.ckpt")
    callback = next(v for k, v in best["callbacks"].items() if k.startswith("ModelCheckpoint"))
    assert callback["best_model_path"] == str(tmp_path / "epoch=2-step=24.ckpt")
    assert list(callback["best_k_models"]) == [str(tmp_path / "epoch=2-step=24.ckpt")]


@pytest.mark.parametrize("wrap", ["AsyncCheckpointIO", "blocking=False"])
def test_background_saves_in_a_run(tmp_path, wrap):
    """Lightning's AsyncCheckpointIO around the plugin, and the plugin's own background
    saves: every checkpoint is complete once fit returns (teardown waited), and a run
    resumes from it."""
    def plugin():
        if wrap == "AsyncCheckpointIO":
            return AsyncCheckpointIO(CheckpointIO())
        return CheckpointIO(blocking=False)

    t = trainer(max_epochs=2, plugins=[plugin()], callbacks=[
        ModelCheckpoint(tmp_path, monitor="score", mode="max", save_top_k=1, save_last=True)])
    t.fit(model(), loader(), loader())
    assert sorted(os.listdir(tmp_path)) == ["epoch=1-step=16.ckpt", "last.ckpt"]
    last = CheckpointIO().load_checkpoint(tmp_path / "last.ckpt")
    assert_identical(dict(last["state_dict"]), dict(t.lightning_module.state_dict()))
    assert_identical(last["optimizer_states"][0], t.optimizers[0].state_dict())

    resumed = trainer(max_epochs=3, plugins=[plugin()])
    resumed.fit(model(seed=5), loader(), ckpt_path=str(tmp_path / "last.ckpt"))
    assert resumed.global_step == 24


def test_memory_url_run_and_resume():
    """ModelCheckpoint writing to memory:// through the plugin, and a resume from there."""
    root = "memory://pyckpt-lightning-run"
    try:
        t = trainer(max_epochs=2, plugins=[CheckpointIO()], callbacks=[
            ModelCheckpoint(root, monitor="score", mode="max", save_top_k=1, save_last=True)])
        t.fit(model(), loader(), loader())
        fs = fsspec.filesystem("memory")
        names = sorted(p.rsplit("/", 1)[-1] for p in fs.ls(root, detail=False))
        assert names == ["epoch=1-step=16.ckpt", "last.ckpt"]
        want = training_state(t)
        resumed = trainer(max_epochs=2, plugins=[CheckpointIO()])
        resumed.fit(model(seed=3), loader(), ckpt_path=f"{root}/last.ckpt")  # nothing left to train
        assert_identical(training_state(resumed), want, "state")
    finally:
        fsspec.filesystem("memory").rm(root, recursive=True)


@pytest.mark.slow  # a SeaweedFS server of its own: ~5 s to start
def test_s3_save_resume_remove(seaweed_server):
    """trainer.save_checkpoint to s3:// (SeaweedFS on 127.0.0.1, options given to the
    plugin), a resume from it, and its removal."""
    opts = seaweed_server.options
    url = "s3://pyckpt/lightning/run/mid.ckpt"
    t = trainer(max_epochs=1, plugins=[CheckpointIO(storage_options=opts)])
    t.fit(model(), loader())
    t.save_checkpoint(url)
    want = training_state(t)
    assert pyckpt.load_checkpoint(url, storage_options=opts).has_tensor("epoch")

    plugin = CheckpointIO(storage_options=opts)
    resumed = trainer(max_epochs=1, plugins=[plugin])
    resumed.fit(model(seed=4), loader(), ckpt_path=url)
    assert_identical(training_state(resumed), want, "state")
    plugin.remove_checkpoint(url)
    with pytest.raises(FileNotFoundError):
        plugin.load_checkpoint(url)
    fs = fsspec.filesystem("s3", **opts)
    fs.invalidate_cache()
    assert not [p for p in fs.find("pyckpt/lightning/run") if "mid.ckpt" in p]  # nothing left


def test_plugin_is_lightnings_checkpoint_io():
    from lightning.fabric.plugins import CheckpointIO as Base

    assert issubclass(CheckpointIO, Base)
    t = trainer(plugins=[CheckpointIO()])
    assert isinstance(t.strategy.checkpoint_io, CheckpointIO)
    assert L.__name__ == "lightning" and torch.__name__ == "torch"
