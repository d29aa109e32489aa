"""pyckpt.lightning.CheckpointIO called directly: every value a Lightning checkpoint
holds comes back as itself (types, int keys, bf16 bits, state-dict versions), what
pyckpt cannot store raises before anything is written, saves replace atomically,
background saves keep their promises, and removal."""

from __future__ import annotations

import collections
import dataclasses
import enum
import os
import pickle

import fsspec
import numpy as np
import pytest

from .conftest import EXTRA, assert_identical, torch

import pyckpt  # noqa: E402
from pyckpt.lightning import CheckpointIO  # noqa: E402
from pyckpt.testing import Faults  # noqa: E402
from lightning.fabric.utilities.data import AttributeDict  # noqa: E402

FAST = {"retries": 1, "backoff": 0.01, "backoff_max": 0.02}


def lightning_like():
    """A checkpoint dict as Lightning makes one, with the values that are hard to keep."""
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(3, 2), torch.nn.BatchNorm1d(2))
    opt = torch.optim.Adam(net.parameters(), lr=0.1)
    net(torch.randn(4, 3)).sum().backward()
    opt.step()
    sched = torch.optim.lr_scheduler.ReduceLROnPlateau(opt)
    g = torch.Generator().manual_seed(1)
    return {
        "epoch": 3, "global_step": 40, "pytorch-lightning_version": "2.6.6",
        "state_dict": net.state_dict(),
        "optimizer_states": [opt.state_dict()], "lr_schedulers": [sched.state_dict()],
        "callbacks": {"ModelCheckpoint{'monitor': 'val/loss', 'mode': 'min'}": {
            "best_k_models": {"/abs/run/epoch=1.ckpt": torch.tensor(0.5),
                              "memory://run/epoch=2.ckpt": torch.tensor(0.25)},
            "best_model_path": "/abs/run/epoch=1.ckpt", "kth_value": torch.tensor(float("inf"))}},
        "hparams_name": "kwargs",
        "hyper_parameters": AttributeDict(lr=0.1, dims=(4, 2), opt=None, sub=AttributeDict(k=1)),
        "extra": EXTRA,
        "keys": {"": 1, ".": 2, "..": 3, "a/b": 4, "a%2Fb": 5, "100%": 6, "x\x00y": 7},
        "floats": [float("nan"), -0.0, float("-inf"), 1e-310],
        "raw": [b"\x00\x01", bytearray(b"ab"), torch.Size([2, 3])],
        "tensors": {"bf16": torch.randn(5, 3, generator=g).bfloat16(),
                    "f16": torch.randn(4, generator=g).half(),
                    "i8": torch.arange(-4, 4, dtype=torch.int8),
                    "bool": torch.tensor([True, False]),
                    "c64": torch.randn(3, dtype=torch.complex64, generator=g),
                    "empty": torch.zeros(0, 3), "scalar": torch.tensor(2.5),
                    "strided": torch.randn(4, 6, generator=g)[:, 2],
                    "numpy": np.arange(6, dtype=np.uint16).reshape(2, 3), "np_scalar": np.int64(3),
                    "param": torch.nn.Parameter(torch.ones(2)),
                    "frozen": torch.nn.Parameter(torch.ones(2), requires_grad=False),
                    "grad": torch.ones(2, requires_grad=True)},
    }


def test_every_value_comes_back_as_itself(tmp_path):
    ck = lightning_like()
    CheckpointIO().save_checkpoint(ck, tmp_path / "a.ckpt")
    got = CheckpointIO().load_checkpoint(tmp_path / "a.ckpt")
    assert_identical(got, ck, "checkpoint")
    assert got["state_dict"]._metadata == ck["state_dict"]._metadata  # module versions
    t = got["tensors"]
    assert t["param"].requires_grad and not t["frozen"].requires_grad and t["grad"].requires_grad
    assert got["hyper_parameters"].sub.k == 1  # an AttributeDict again
    # an ordinary pyckpt checkpoint: pyckpt.load reads the same tree (as plain containers)
    plain = pyckpt.load(tmp_path / "a.ckpt")
    assert plain["extra"] == EXTRA and list(plain["keys"]) == list(ck["keys"])


def test_state_dict_root_and_weights_only(tmp_path):
    """A bare state dict (Lightning's spawn launcher saves one) round trips as an
    OrderedDict with its versions; weights_only changes nothing (nothing is unpickled)."""
    sd = torch.nn.Linear(2, 2).state_dict()
    io = CheckpointIO()
    io.save_checkpoint(sd, tmp_path / "w")
    for weights_only in (None, True, False):
        got = io.load_checkpoint(tmp_path / "w", weights_only=weights_only)
        assert_identical(got, sd)
        assert got._metadata == sd._metadata


def test_map_location(tmp_path):
    io = CheckpointIO()
    io.save_checkpoint({"w": torch.ones(2).bfloat16(), "n": 1}, tmp_path / "c")
    for where in ("cpu", torch.device("cpu")):
        assert io.load_checkpoint(tmp_path / "c", map_location=where)["w"].device.type == "cpu"
    meta = io.load_checkpoint(tmp_path / "c", map_location="meta")
    assert meta["w"].device.type == "meta" and meta["w"].dtype == torch.bfloat16 and meta["n"] == 1
    for bad in ({"cuda:0": "cpu"}, lambda storage, loc: storage):
        with pytest.raises(TypeError, match="map_location"):
            io.load_checkpoint(tmp_path / "c", map_location=bad)


class Color(enum.Enum):
    RED = 1


class Mode(str, enum.Enum):
    FAST = "fast"


@dataclasses.dataclass
class Config:
    depth: int = 2


class Tagged(list):
    pass


class WithAttrs(collections.OrderedDict):
    pass


def _with_attribute():
    d = collections.OrderedDict(a=1)
    d.note = "kept nowhere"
    return d


@pytest.mark.parametrize("value, match", [
    (Color.RED, "Color"), (Mode.FAST, "Mode"), ({1, 2}, "set"), (frozenset(), "frozenset"),
    (Config(), "Config"), (Config, "type"), (collections.namedtuple("P", "x")(1), "P"),
    (collections.defaultdict(int), "defaultdict"), (Tagged([1]), "Tagged"),
    (WithAttrs(a=1), "WithAttrs"), (_with_attribute(), "attributes"), (object(), "object"),
    ({(1, 2): 3}, "key"), ({1.5: 3}, "key"), ({True: 3}, "key"),
])
def test_what_pyckpt_cannot_store_raises_and_writes_nothing(tmp_path, value, match):
    path = tmp_path / "bad.ckpt"
    with pytest.raises(TypeError, match=match) as err:
        CheckpointIO().save_checkpoint({"epoch": 1, "hyper_parameters": {"x": value}}, path)
    assert "checkpoint['hyper_parameters']['x']" in str(err.value)
    assert not path.exists()


def test_int_and_text_key_of_one_dict_raise(tmp_path):
    with pytest.raises(ValueError, match="'1'"):
        CheckpointIO().save_checkpoint({"d": {1: 0, "1": 0}}, tmp_path / "k")


def test_save_replaces_atomically():
    """A rewrite whose commit fails leaves the old checkpoint whole; one that succeeds
    replaces it and leaves none of the old data behind."""
    faults = Faults(kinds={"write"}, only="pyckpt.index",
                    error=lambda what: PermissionError(13, f"injected: {what}"))
    io = CheckpointIO({"faulty": {"faults": faults}, "pyckpt": FAST})
    url = "faulty::memory://pyckpt-lightning-atomic/last.ckpt"
    fs = fsspec.filesystem("memory")
    try:
        io.save_checkpoint({"step": 1, "w": torch.zeros(3)}, url)
        first = sorted(fs.ls("/pyckpt-lightning-atomic/last.ckpt", detail=False))
        faults.fail_fraction = 1.0
        with pytest.raises(PermissionError, match="injected"):
            io.save_checkpoint({"step": 2, "w": torch.ones(3)}, url)
        faults.fail_fraction = 0.0
        assert_identical(io.load_checkpoint(url), {"step": 1, "w": torch.zeros(3)})
        assert sorted(fs.ls("/pyckpt-lightning-atomic/last.ckpt", detail=False)) == first
        io.save_checkpoint({"step": 3, "w": torch.full((3,), 3.0)}, url)
        assert_identical(io.load_checkpoint(url), {"step": 3, "w": torch.full((3,), 3.0)})
        now = fs.ls("/pyckpt-lightning-atomic/last.ckpt", detail=False)
        old_data = {p for p in first if "/data-" in p}
        assert len(now) == 2 and len(old_data) == 1 and not set(now) & old_data
    finally:
        fs.rm("/pyckpt-lightning-atomic", recursive=True)


def test_background_save_copies_values_first(tmp_path):
    io = CheckpointIO(blocking=False)
    w = torch.zeros(100_000)
    io.save_checkpoint({"w": w}, tmp_path / "c")
    w.fill_(1.0)  # after save_checkpoint returned: never reaches the checkpoint
    io.teardown()
    assert torch.equal(CheckpointIO().load_checkpoint(tmp_path / "c")["w"], torch.zeros(100_000))


def test_background_saves_of_one_path_run_in_order_and_removal_waits():
    faults = Faults(latency=0.005)  # every request slowed: the saves overlap the calls
    io = CheckpointIO({"faulty": {"faults": faults}}, blocking=False)
    root = "faulty::memory://pyckpt-lightning-order"
    try:
        for step in range(4):
            io.save_checkpoint({"step": step, "w": torch.full((64,), float(step))}, f"{root}/last")
        io.save_checkpoint({"step": 9}, f"{root}/gone")
        io.remove_checkpoint(f"{root}/gone")  # waits for that save, then removes it
        io.wait()
        want = {"step": 3, "w": torch.full((64,), 3.0)}
        assert_identical(io.load_checkpoint(f"{root}/last"), want)
        assert not fsspec.filesystem("memory").exists("/pyckpt-lightning-order/gone")
    finally:
        fsspec.filesystem("memory").rm("/pyckpt-lightning-order", recursive=True)


def test_background_errors_reach_the_trainer():
    """A failed background save raises at the next call and at teardown."""
    faults = Faults(kinds={"write"}, only="data-", fail_fraction=1.0,
                    error=lambda what: PermissionError(13, f"injected: {what}"))
    io = CheckpointIO({"faulty": {"faults": faults}, "pyckpt": FAST}, blocking=False)
    root = "faulty::memory://pyckpt-lightning-errors"
    io.save_checkpoint({"step": 1}, f"{root}/a")  # returns: the write fails later
    with pytest.raises(PermissionError, match="injected"):
        io.teardown()
    io.save_checkpoint({"step": 2}, f"{root}/a")
    with pytest.raises(PermissionError, match="injected"):
        io.save_checkpoint({"step": 3}, f"{root}/a")  # waits for the same path's save first
    io.teardown()  # each error is raised once
    assert not fsspec.filesystem("memory").exists("/pyckpt-lightning-errors/a/pyckpt.index")


def test_remove_checkpoint(tmp_path):
    io = CheckpointIO()
    io.save_checkpoint({"a": torch.ones(2)}, tmp_path / "x.ckpt")
    os.symlink(tmp_path / "x.ckpt", tmp_path / "last.ckpt")
    io.remove_checkpoint(tmp_path / "last.ckpt")  # a link: the link only
    assert not os.path.lexists(tmp_path / "last.ckpt") and (tmp_path / "x.ckpt").is_dir()
    io.remove_checkpoint(tmp_path / "x.ckpt")
    assert not (tmp_path / "x.ckpt").exists()
    io.remove_checkpoint(tmp_path / "x.ckpt")  # gone already: no error
    (tmp_path / "old.ckpt").write_bytes(b"a torch.save file")
    io.remove_checkpoint(tmp_path / "old.ckpt")
    assert not (tmp_path / "old.ckpt").exists()
    with pytest.raises(FileNotFoundError):
        io.load_checkpoint(tmp_path / "x.ckpt")


def test_per_save_storage_options_and_pickling():
    """storage_options given to one save join the plugin's; the plugin pickles (spawned
    workers get a copy) without its pending saves."""
    faults = Faults()
    io = CheckpointIO({"pyckpt": FAST}, blocking=False)
    url = "faulty::memory://pyckpt-lightning-options/c"
    io.save_checkpoint({"a": 1}, url, storage_options={"faulty": {"faults": faults}})
    copy = pickle.loads(pickle.dumps(io))
    io.wait()
    assert faults.requests > 0
    assert copy.storage_options == {"pyckpt": FAST} and copy.blocking is False
    copy.wait()  # nothing pending in the copy
    assert CheckpointIO().load_checkpoint("memory://pyckpt-lightning-options/c") == {"a": 1}
    fsspec.filesystem("memory").rm("/pyckpt-lightning-options", recursive=True)


@pytest.mark.parametrize("meta, error", [
    ({"format": 1, "types": [["state_dict", "OrderedDict"]]}, pyckpt.CorruptCheckpointError),
    ({"format": 1, "types": [[["w"], "OrderedDict"]]}, pyckpt.CorruptCheckpointError),
    ({"format": 1, "types": [[["d"], "frozendict"]]}, pyckpt.CheckpointError),
    ({"format": 2, "types": []}, pyckpt.CheckpointError),
    ({"types": "all"}, pyckpt.CorruptCheckpointError),
])
def test_type_records_are_checked_on_load(tmp_path, meta, error):
    """The type records are input like any stored byte: malformed ones, or ones that do
    not fit the tree, raise instead of building something else."""
    pyckpt.save({"w": torch.ones(2), "d": {"a": 1}}, tmp_path / "c",
                metadata={"pyckpt.lightning": meta})
    with pytest.raises(error):
        CheckpointIO().load_checkpoint(tmp_path / "c")
