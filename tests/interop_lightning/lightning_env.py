"""A Lightning environment of one package, simulated, and a tiny run in it (issue 38
item 1): ``lightning`` and ``pytorch_lightning`` have distinct base classes, and each
Trainer must accept pyckpt's plugin whichever packages are installed.

``python lightning_env.py HIDE fit PACKAGE WORK`` hides the top-level packages named
in HIDE (comma-separated; ``-`` for none) from every import (a ``sys.meta_path``
finder raising ``ModuleNotFoundError``, as if they were not installed), then runs
``fit`` with ``PACKAGE`` (``lightning.pytorch`` or ``pytorch_lightning``);
``python lightning_env.py HIDE run FILE`` runs a script (a README block) instead.
Tests in the environment where both are installed call ``fit`` directly."""

from __future__ import annotations

import importlib
import importlib.abc
import os
import runpy
import sys


class _Hide(importlib.abc.MetaPathFinder):
    def __init__(self, tops: list[str]) -> None:
        self.tops = tops

    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in self.tops:
            raise ModuleNotFoundError(f"No module named {name!r} (hidden)", name=name)
        return None


def fit(package: str, work: str) -> list[str]:
    """With ``package``'s Trainer: pyckpt's plugin, alone and inside that package's
    AsyncCheckpointIO, checkpoints a 2-epoch run, a 3-epoch run resumes from
    ``last.ckpt`` and ends as a run that was never interrupted, and
    ``pyckpt.lightning.load_from_checkpoint`` rebuilds the model with its
    hyperparameters and weights. Returns what was run, for the caller to check."""
    import torch

    import pyckpt
    import pyckpt.lightning

    pl = importlib.import_module(package)
    callbacks = importlib.import_module(package + ".callbacks")
    plugins_io = importlib.import_module(package + ".plugins.io")

    class Tiny(pl.LightningModule):
        def __init__(self, lr: float = 0.05, width: int = 3) -> None:
            super().__init__()
            self.save_hyperparameters()
            self.net = torch.nn.Linear(4, width)

        def training_step(self, batch, i):
            x, y = batch
            return torch.nn.functional.mse_loss(self.net(x).sum(1, keepdim=True), y)

        def configure_optimizers(self):
            return torch.optim.Adam(self.parameters(), lr=self.hparams.lr)

    g = torch.Generator().manual_seed(0)
    data = torch.utils.data.TensorDataset(torch.randn(16, 4, generator=g),
                                          torch.randn(16, 1, generator=g))

    def run(epochs, plugin=None, ckpt_dir=None, ckpt_path=None, seed=0):
        torch.manual_seed(seed)
        t = pl.Trainer(max_epochs=epochs, accelerator="cpu", devices=1, logger=False,
                       enable_progress_bar=False, enable_model_summary=False,
                       default_root_dir=work, plugins=[plugin] if plugin else None,
                       enable_checkpointing=ckpt_dir is not None,
                       callbacks=[callbacks.ModelCheckpoint(ckpt_dir, save_last=True)]
                       if ckpt_dir else None)
        t.fit(Tiny(lr=0.02, width=2), torch.utils.data.DataLoader(data, batch_size=4),
              ckpt_path=ckpt_path)
        return t

    want = run(3).lightning_module.state_dict()  # never interrupted
    done = []
    for name, make in [("CheckpointIO", pyckpt.lightning.CheckpointIO),
                       ("AsyncCheckpointIO", lambda: plugins_io.AsyncCheckpointIO(
                           pyckpt.lightning.CheckpointIO()))]:
        ckpts = os.path.join(work, name)
        first = run(2, make(), ckpts)
        last = os.path.join(ckpts, "last.ckpt")
        assert os.path.isfile(os.path.join(last, "pyckpt.index")), "not a pyckpt checkpoint"
        assert pyckpt.load(last)["global_step"] == 8
        resumed = run(3, make(), ckpt_path=last, seed=7)
        assert resumed.global_step == 12
        got = resumed.lightning_module.state_dict()
        assert all(torch.equal(got[k], want[k]) for k in want), f"{name}: resume differs"

        model = pyckpt.lightning.load_from_checkpoint(Tiny, last)
        assert type(model) is Tiny and dict(model.hparams) == {"lr": 0.02, "width": 2}
        trained = first.lightning_module.state_dict()
        assert all(torch.equal(model.state_dict()[k], trained[k]) for k in trained)
        done.append(f"{package}.Trainer + {name}")
    return done


def main(argv: list[str]) -> None:
    hide, what, arg = argv[0], argv[1], argv[2:]
    if hide != "-":
        sys.meta_path.insert(0, _Hide(hide.split(",")))
    if what == "run":
        runpy.run_path(arg[0], run_name="__main__")
        done = ["ran " + os.path.basename(arg[0])]
    else:
        done = fit(*arg)
    import pyckpt.lightning

    bases = [c.__module__ for c in pyckpt.lightning.CheckpointIO.__mro__
             if c.__name__ == "CheckpointIO" and not c.__module__.startswith("pyckpt")]
    loaded = sorted(m for m in sys.modules if m.split(".")[0] in hide.split(","))
    assert not loaded, f"hidden packages were imported: {loaded}"
    print("done:", "; ".join(done), "| bases:", ", ".join(bases))


if __name__ == "__main__":
    main(sys.argv[1:])
