"""One read plan behind every load door (issue 39 item 2): each load door lands its
bytes through ``ReadPlan.execute`` and asks its source for no read of its own, and
the executor picks the read from the destinations (new arrays, host targets, device
targets, blocks of a stored tensor)."""

from __future__ import annotations

import ast
import pathlib
import types

import numpy as np
import pytest

import pyckpt
from pyckpt.format.read_plan import ReadPlan
from pyckpt.format.source import CheckpointSource
from pyckpt.sharded import ShardedArray
from pyckpt.sources import open_source

torch = pytest.importorskip("torch")

ROOT = pathlib.Path(pyckpt.__file__).parent
#: the modules of the load doors (lightning.py loads through flat.py's code)
DOORS = ["load_into.py", "flat.py", "graph/sources.py", "graph/restore.py", "dcp/reader.py",
         "lightning.py", "checkpoint_reader.py", "transfer.py", "interop/safetensors.py",
         "interop/tensorflow/convert.py"]


def _subclasses(cls):
    for sub in cls.__subclasses__():
        yield sub
        yield from _subclasses(sub)


@pytest.fixture
def plans(monkeypatch):
    """Every ReadPlan executed, in order; ``plans.outside``: each ``read_new`` or
    ``fill`` a source was asked for while no plan was executing (a door's own read)."""
    executed: list = []
    outside: list = []
    running = [0]
    real = ReadPlan.execute

    def execute(self):
        executed.append(self)
        running[0] += 1
        try:
            return real(self)
        finally:
            running[0] -= 1

    monkeypatch.setattr(ReadPlan, "execute", execute)

    def spy(cls, name):
        orig = cls.__dict__[name]

        def method(self, *args, **kwargs):
            if not running[0]:
                outside.append((cls.__name__, name))
            return orig(self, *args, **kwargs)
        monkeypatch.setattr(cls, name, method)

    for cls in [CheckpointSource, *_subclasses(CheckpointSource)]:
        for name in ("read_new", "fill"):
            if name in cls.__dict__:
                spy(cls, name)

    return types.SimpleNamespace(executed=executed, outside=outside)


def _state():
    g = torch.Generator().manual_seed(3)
    return {"w": torch.randn(6, 5, generator=g), "ids": torch.arange(7),
            "np": np.arange(12, dtype=np.float32).reshape(3, 4), "step": 9}


# -- every door lands its bytes through the executor ---------------------------------

def test_load_new_arrays(tmp_path, plans):
    path = pyckpt.save(_state(), str(tmp_path / "c"))
    got = pyckpt.load(path)
    assert torch.equal(got["w"], _state()["w"]) and got["step"] == 9
    assert plans.executed and plans.outside == []
    assert all(p.dsts is None and not p.mmap for p in plans.executed)


def test_load_mmap(tmp_path, plans):
    path = pyckpt.save(_state(), str(tmp_path / "c"))
    got = pyckpt.load(path, mmap=True)
    np.testing.assert_array_equal(got["np"], _state()["np"])
    assert [p.mmap for p in plans.executed] == [True] and plans.outside == []


def test_load_into(tmp_path, plans):
    path = pyckpt.save(_state(), str(tmp_path / "c"))
    into = {"w": torch.zeros(6, 5), "ids": torch.zeros(7, dtype=torch.int64),
            "np": np.zeros((3, 4), np.float32), "step": 0}
    pyckpt.load(path, into=into)
    assert torch.equal(into["w"], _state()["w"]) and into["step"] == 9
    assert plans.outside == []
    scalars, targets = plans.executed  # the scalars' new arrays first, then the targets
    assert scalars.dsts is None and len(scalars.indices) == 1
    assert len(targets.dsts) == 3 and targets.boxes is None


def test_load_device_cpu(tmp_path, plans):
    path = pyckpt.save(_state(), str(tmp_path / "c"))
    got = pyckpt.load(path, device="cpu")
    assert isinstance(got["np"], torch.Tensor) and torch.equal(got["w"], _state()["w"])
    assert plans.outside == []
    assert [p.dsts is None for p in plans.executed] == [True, False]  # the scalar, then 3


def test_checkpoint_restore(tmp_path, plans):
    net = torch.nn.Linear(4, 3)
    path = pyckpt.Checkpoint(net=net).save(tmp_path / "g")
    fresh = torch.nn.Linear(4, 3)
    pyckpt.Checkpoint(net=fresh).restore(path)
    assert torch.equal(fresh.weight, net.weight) and torch.equal(fresh.bias, net.bias)
    assert plans.executed and plans.outside == []
    assert all(p.dsts is not None for p in plans.executed)


@pytest.mark.filterwarnings("ignore:torch.distributed is disabled")
def test_dcp_load(tmp_path, plans):
    dcp = pytest.importorskip("torch.distributed.checkpoint")
    import pyckpt.dcp
    path = pyckpt.save({k: v for k, v in _state().items() if k in ("w", "ids")},
                       str(tmp_path / "c"))
    into = {"w": torch.zeros(6, 5), "ids": torch.zeros(7, dtype=torch.int64)}
    dcp.load(into, storage_reader=pyckpt.dcp.StorageReader(path))
    assert torch.equal(into["w"], _state()["w"]) and torch.equal(into["ids"], torch.arange(7))
    assert len(plans.executed) == 1 and plans.outside == []
    assert len(plans.executed[0].dsts) == 2


@pytest.mark.parametrize("where", [None, "cpu"])
def test_lightning_load_checkpoint(tmp_path, plans, where):
    pytest.importorskip("lightning")
    from pyckpt.lightning import CheckpointIO
    ck = {"state_dict": {"w": torch.ones(2, 3)}, "epoch": 4, "np": np.arange(3)}
    CheckpointIO().save_checkpoint(ck, tmp_path / "c.ckpt")
    got = CheckpointIO().load_checkpoint(tmp_path / "c.ckpt", map_location=where)
    assert torch.equal(got["state_dict"]["w"], torch.ones(2, 3)) and got["epoch"] == 4
    assert plans.executed and plans.outside == []


def test_the_reader_and_the_conversions_read_through_plans(tmp_path, plans):
    """Not load doors, but readers all the same: ``CheckpointReader.get_tensor`` and a
    ``pyckpt cp`` to safetensors and back land their bytes through plans too."""
    from pyckpt import transfer

    state = {"a": np.arange(6, dtype=np.float32), "b": np.ones((2, 3), dtype=np.int64)}
    pyckpt.save(state, tmp_path / "c")
    np.testing.assert_array_equal(pyckpt.load_checkpoint(tmp_path / "c").get_tensor("a"),
                                  state["a"])
    assert [list(p.indices) for p in plans.executed] == [[0]]
    transfer.transfer(str(tmp_path / "c"), str(tmp_path / "c.safetensors"), "safetensors")
    transfer.transfer(str(tmp_path / "c.safetensors"), str(tmp_path / "back"), "pyckpt")
    np.testing.assert_array_equal(pyckpt.load(tmp_path / "back")["b"], state["b"])
    assert len(plans.executed) >= 3 and plans.outside == []


def test_no_door_reads_its_source_itself():
    """The door modules call neither ``read_new`` nor ``fill`` (the executor does)."""
    found = []
    for rel in DOORS:
        tree = ast.parse((ROOT / rel).read_text())
        found += [f"{rel}:{n.lineno} .{n.func.attr}" for n in ast.walk(tree)
                  if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute)
                  and n.func.attr in ("read_new", "fill")]
    assert found == []


# -- the executor's choice -----------------------------------------------------------

@pytest.fixture
def stored(tmp_path):
    full = np.arange(40 * 6, dtype=np.float32).reshape(40, 6)
    path = pyckpt.save({"a": full, "b": np.arange(5, dtype=np.int64)}, str(tmp_path / "c"))
    return open_source(path), full


def _calls(monkeypatch, src):
    """Records the source's read_new / fill / read calls (names and arguments)."""
    calls = []
    cls = type(src)
    for name in ("read_new", "fill", "read"):
        orig = getattr(cls, name)

        def method(self, *args, _orig=orig, _name=name):
            calls.append((_name, args))
            return _orig(self, *args)
        monkeypatch.setattr(cls, name, method)
    return calls


def test_no_destinations_read_new_arrays(stored, monkeypatch):
    src, full = stored
    calls = _calls(monkeypatch, src)
    a, b = ReadPlan(src, [0, 1]).execute()
    np.testing.assert_array_equal(a, full)
    np.testing.assert_array_equal(b, np.arange(5))
    assert calls == [("read_new", ([0, 1],))]
    calls.clear()
    (m,) = ReadPlan(src, [0], mmap=True).execute()
    np.testing.assert_array_equal(m, full)
    assert not m.flags.writeable and calls == [("read_new", ([0], True))]


def test_host_destinations_are_read_in_place(stored, monkeypatch, late_engine):
    src, full = stored
    calls = _calls(monkeypatch, src)
    dst, block = np.zeros_like(full), ShardedArray(np.zeros((4, 6), np.float32), (40, 6), (8, 0))
    got = ReadPlan(src, [0, 0], [dst, block]).execute()
    assert got[0] is dst and got[1] is block
    np.testing.assert_array_equal(dst, full)
    np.testing.assert_array_equal(block.local, full[8:12])
    assert [c[0] for c in calls] == ["fill", "read"] and calls[1][1][1][0] is dst
    assert late_engine.log == []


def test_device_destinations_land_on_their_device(stored, late_engine):
    src, full = stored
    dev, host = np.zeros((3, 2), np.float32), np.zeros(5, np.int64)
    ReadPlan(src, [0, 1, 0], [late_engine.array(np.zeros_like(full), "whole"), host,
                              late_engine.array(dev, "box")], boxes=[None, None, (7, 4)]
             ).execute()
    np.testing.assert_array_equal(dev, full[7:10, 4:6])
    np.testing.assert_array_equal(host, np.arange(5))
    landed = {k for what, d, k in late_engine.log if what == "land" and d == "h2d"}
    assert landed == {"whole", "box"}


def test_a_plan_that_does_not_fit_is_refused(stored):
    src, _ = stored
    with pytest.raises(ValueError, match="1 tensor.*2 destination"):
        ReadPlan(src, [0], [np.zeros(1), np.zeros(1)])
    with pytest.raises(ValueError, match="box"):
        ReadPlan(src, [0], boxes=[None])
    with pytest.raises(ValueError, match="mmap"):
        ReadPlan(src, [0], [np.zeros((40, 6), np.float32)], mmap=True)
    with pytest.raises(ValueError, match="2 box"):
        ReadPlan(src, [0], [np.zeros((40, 6), np.float32)], boxes=[None, None])
