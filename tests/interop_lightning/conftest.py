"""What the Lightning tests share: a tiny model whose checkpoints carry every kind of
value Lightning writes (BatchNorm buffers, Adam state, a StepLR scheduler, callback
states, hyperparameters, Python values of the model's own), its data, a Trainer on
the CPU, and exact comparisons of training states."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")
L = pytest.importorskip("lightning")

#: Python values a model puts in its checkpoints (on_save_checkpoint): every type
#: must come back as itself
EXTRA = {"i": 7, "f": 7.0, "b": True, "s": "7", "n": None, "c": 1 + 2j, "big": 2 ** 70,
         "np_f32": np.float32(1.5), "ints": {0: "zero", 1: [1, 2.5], -3: (None, False)},
         "nested": [[1, [2.0, ["three", [None, b"\x00\xff"]]]], (4, (5,))], "empty": {}}


class Tiny(L.LightningModule):
    """4 -> 8 -> 1 with a BatchNorm; Adam and StepLR; logs ``score`` (the epoch: each
    validation is better than the last) and ``val_loss``."""

    def __init__(self, lr: float = 0.05, dims: tuple = (4, 8), name: str = "tiny",
                 note: object = None) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.net = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.BatchNorm1d(8),
                                       torch.nn.ReLU(), torch.nn.Linear(8, 1))
        self.loaded_extra = None

    def training_step(self, batch, i):
        x, y = batch
        return torch.nn.functional.mse_loss(self.net(x), y)

    def validation_step(self, batch, i):
        x, y = batch
        self.log("val_loss", torch.nn.functional.mse_loss(self.net(x), y))
        self.log("score", float(self.current_epoch))

    def configure_optimizers(self):
        opt = torch.optim.Adam(self.parameters(), lr=self.hparams.lr)
        return {"optimizer": opt, "lr_scheduler": torch.optim.lr_scheduler.StepLR(opt, 1, 0.5)}

    def on_save_checkpoint(self, checkpoint):
        checkpoint["extra"] = EXTRA

    def on_load_checkpoint(self, checkpoint):
        self.loaded_extra = checkpoint["extra"]


def data(n: int = 32):
    g = torch.Generator().manual_seed(0)
    return torch.utils.data.TensorDataset(torch.randn(n, 4, generator=g),
                                          torch.randn(n, 1, generator=g))


def loader(stateful: bool = False):
    """8 batches of 4, in order; ``stateful``: torchdata's StatefulDataLoader, whose
    position Lightning checkpoints (a resume mid-epoch goes on where it stopped)."""
    if stateful:
        tdata = pytest.importorskip("torchdata.stateful_dataloader")
        return tdata.StatefulDataLoader(data(), batch_size=4)
    return torch.utils.data.DataLoader(data(), batch_size=4)


def model(seed: int = 0) -> Tiny:
    torch.manual_seed(seed)
    return Tiny()


def trainer(**kw):
    kw.setdefault("max_epochs", 2)
    kw.setdefault("enable_checkpointing", "callbacks" in kw)
    return L.Trainer(accelerator="cpu", devices=1, logger=False, enable_progress_bar=False,
                     enable_model_summary=False, num_sanity_val_steps=0, **kw)


def training_state(t) -> dict:
    """Everything a resumed run must reproduce: parameters and buffers, the optimizer's
    and the scheduler's state dicts, and the step."""
    m = t.lightning_module
    return {"model": {k: v.clone() for k, v in m.state_dict().items()},
            "optim": t.optimizers[0].state_dict(),
            "sched": t.lr_scheduler_configs[0].scheduler.state_dict(),
            "step": t.global_step}


def assert_identical(got, want, where="value"):
    """got is want: the same types all the way down (a bool is no int, a tuple no list),
    tensors with equal dtype, shape and bits, dict keys in the same order."""
    assert type(got) is type(want), f"{where}: {type(got).__name__} != {type(want).__name__}"
    if isinstance(want, torch.Tensor):
        assert got.dtype == want.dtype and got.shape == want.shape, where
        assert got.device == want.device, where
        a, b = got.detach().contiguous(), want.detach().contiguous()
        if a.numel() and a.dtype.is_floating_point:  # bitwise: NaNs and -0.0 too
            bits = {2: torch.int16, 4: torch.int32, 8: torch.int64}[a.element_size()]
            a, b = a.view(bits), b.view(bits)
        assert torch.equal(a, b), where
    elif isinstance(want, np.ndarray):
        assert got.dtype == want.dtype and np.array_equal(got, want), where
    elif isinstance(want, dict):
        assert list(got) == list(want), f"{where}: keys {list(got)} != {list(want)}"
        for k in want:
            assert_identical(got[k], want[k], f"{where}[{k!r}]")
    elif isinstance(want, (list, tuple)):
        assert len(got) == len(want), where
        for i, (a, b) in enumerate(zip(got, want)):
            assert_identical(a, b, f"{where}[{i}]")
    elif isinstance(want, float) and want != want:
        assert got != got, where
    else:
        assert got == want, f"{where}: {got!r} != {want!r}"
