"""pyckpt.lightning.load_from_checkpoint: ``Model.load_from_checkpoint`` for pyckpt
checkpoints, which Lightning's own cannot open (issue 38 item 7)."""

from __future__ import annotations

import pytest

from .conftest import EXTRA, L, Tiny, assert_identical, loader, torch, trainer

import pyckpt  # noqa: E402
from pyckpt.lightning import CheckpointIO, load_from_checkpoint  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore:::lightning")  # advice for real runs


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """A checkpoint a Trainer with the plugin wrote after one epoch, and its model."""
    path = tmp_path_factory.mktemp("lfc") / "done.ckpt"
    t = trainer(max_epochs=1, plugins=[CheckpointIO()])
    torch.manual_seed(0)
    m = Tiny(lr=0.01, dims=(4, 6), name="saved")
    t.fit(m, loader())
    t.save_checkpoint(path)
    return path, m


def test_lightnings_own_cannot_open_it(saved):
    """Why the function exists: Lightning reads one file with torch.load."""
    with pytest.raises(IsADirectoryError):
        Tiny.load_from_checkpoint(saved[0])


def test_model_with_its_hyperparameters_and_weights(saved):
    path, trained = saved
    got = load_from_checkpoint(Tiny, path, name="override")
    assert type(got) is Tiny
    assert got.hparams.lr == 0.01 and got.hparams.dims == (4, 6)  # a tuple again
    assert got.hparams.name == "override"  # kwargs win over the checkpoint's
    assert_identical(dict(got.state_dict()), dict(trained.state_dict()), "state_dict")
    assert_identical(got.loaded_extra, EXTRA, "extra")  # on_load_checkpoint was called


def test_hparams_file_replaces_the_checkpoints(saved, tmp_path):
    (tmp_path / "h.yaml").write_text("lr: 0.5\nname: from-yaml\n")
    got = load_from_checkpoint(Tiny, saved[0], hparams_file=tmp_path / "h.yaml")
    assert got.hparams.lr == 0.5 and got.hparams.name == "from-yaml"
    with pytest.raises(ValueError, match="yaml"):
        load_from_checkpoint(Tiny, saved[0], hparams_file=tmp_path / "h.json")


def test_strict_false_loads_what_matches(saved):
    class Wider(Tiny):
        def __init__(self, **kw):
            super().__init__(**kw)
            self.head = torch.nn.Linear(1, 1)

    with pytest.raises(RuntimeError, match="head"):
        load_from_checkpoint(Wider, saved[0])
    got = load_from_checkpoint(Wider, saved[0], strict=False)
    assert torch.equal(got.net[0].weight, saved[1].net[0].weight)


def test_datamodule(tmp_path):
    class Data(L.LightningDataModule):
        def __init__(self, batch: int = 2):
            super().__init__()
            self.save_hyperparameters()
            self.seen = 0

        def state_dict(self):
            return {"seen": self.seen}

        def load_state_dict(self, state):
            self.seen = state["seen"]

    CheckpointIO().save_checkpoint({"datamodule_hyper_parameters": {"batch": 5},
                                    Data.__qualname__: {"seen": 3},  # where Lightning keeps it
                                    "pytorch-lightning_version": L.__version__},
                                   tmp_path / "d.ckpt")
    got = load_from_checkpoint(Data, tmp_path / "d.ckpt")
    assert type(got) is Data and got.hparams.batch == 5 and got.seen == 3


def test_errors(saved, tmp_path):
    with pytest.raises(TypeError, match="Linear.*not a LightningModule"):
        load_from_checkpoint(torch.nn.Linear, saved[0])
    with pytest.raises(pyckpt.CheckpointNotFoundError):
        load_from_checkpoint(Tiny, tmp_path / "missing.ckpt")
    with pytest.raises(TypeError, match="map_location"):
        load_from_checkpoint(Tiny, saved[0], map_location={"cuda:0": "cpu"})
