"""Issue 14: no silent drops. Objects with state_dict()/load_state_dict() are nodes of
the object graph, Python values in tracked lists and dicts are saved with their
types, and what pyckpt cannot save raises TypeError (docs/API.md section 11)."""

import json
import warnings

import numpy as np
import pytest

import pyckpt
from pyckpt import _reference_reader, saving
from pyckpt.graph import stateful
from pyckpt.graph.object_graph import traverse

torch = pytest.importorskip("torch")


def keys_of(path):
    return sorted(k for k, _ in pyckpt.list_variables(path))


def graph_of(path):
    return _reference_reader.read_manifest(path)["graph"]


class Counter:
    """A user object with state_dict / load_state_dict holding every kind of typed value."""

    def __init__(self, seed=0):
        self.state = {
            "step": seed, "lr": 0.5 + seed, "done": bool(seed), "z": complex(seed, 1),
            "huge": 2 ** 100 + seed, "neg": -(2 ** 70), "name": f"run-{seed}", "none": None,
            "raw": bytes([seed, 0, 1]), "pair": (seed, "x"), "items": [1.5, seed, [True]],
            "by_id": {0: "zero", 7: seed}, "arr": np.arange(3.0) + seed,
            "t": torch.arange(4, dtype=torch.int16) + seed, "np": np.float32(seed),
            "bf": torch.full((2,), float(seed), dtype=torch.bfloat16), "empty": {}, "nil": [],
        }

    def state_dict(self):
        return self.state

    def load_state_dict(self, sd):
        self.loaded = sd
        self.state = sd


def same(a, b):
    """Equal, and of the same types all the way down."""
    if type(a) is not type(b):
        return False
    if isinstance(a, dict):
        return list(a) == list(b) and all(same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    if isinstance(a, np.ndarray):
        return a.dtype == b.dtype and np.array_equal(a, b)
    if isinstance(a, torch.Tensor):
        return a.dtype == b.dtype and torch.equal(a, b)
    if isinstance(a, np.generic):
        return a.dtype == b.dtype and a == b
    return a == b


# -- each silent drop of the issue now round-trips or raises -------------------------------

def test_scheduler_round_trips(tmp_path):
    m = torch.nn.Linear(2, 2)
    opt = torch.optim.SGD(m.parameters(), lr=1.0)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=2, gamma=0.5)
    for _ in range(5):
        opt.step()
        sched.step()
    path = pyckpt.Checkpoint(sched=sched).save(tmp_path / "c")
    assert "sched/last_epoch/.ATTRIBUTES/VARIABLE_VALUE" in keys_of(path)
    opt2 = torch.optim.SGD(torch.nn.Linear(2, 2).parameters(), lr=1.0)
    sched2 = torch.optim.lr_scheduler.StepLR(opt2, step_size=9, gamma=0.1)
    pyckpt.Checkpoint(sched=sched2).restore(path).assert_consumed()
    assert same(sched2.state_dict(), sched.state_dict())
    assert type(sched2.last_epoch) is int and type(sched2.gamma) is float


def test_user_state_dict_round_trips_with_types(tmp_path):
    path = pyckpt.Checkpoint(c=Counter(3)).save(tmp_path / "c")
    c = Counter(0)
    pyckpt.Checkpoint(c=c).restore(path).assert_consumed()
    assert same(c.loaded, Counter(3).state)
    assert isinstance(c.loaded["t"], torch.Tensor)  # tensors come back as tensors
    graph = graph_of(path)
    state = graph["state"][graph["kind"].index("Counter")]
    entries = dict(state["d"])
    assert entries["huge"]["as"] == "int"  # beyond int64: a 0-d tensor of its decimal text
    assert pyckpt.load_variable(path, entries["huge"]["s"]) == str(2 ** 100 + 3)
    assert entries["name"] == {"v": "run-3"}
    assert entries["step"]["as"] == "int" and entries["done"]["as"] == "bool"
    assert entries["pair"]["u"][1] == {"v": "x"}


def test_numpy_generator_round_trips(tmp_path):
    g = np.random.default_rng(5)
    g.random(7)
    path = pyckpt.Checkpoint(g=g).save(tmp_path / "c")
    g2 = np.random.default_rng(99)
    pyckpt.Checkpoint(g=g2).restore(path).assert_consumed()
    assert np.array_equal(g2.random(10), g.random(10))


def test_torch_generator_round_trips(tmp_path):
    g = torch.Generator().manual_seed(5)
    torch.rand(3, generator=g)
    path = pyckpt.Checkpoint(g=g).save(tmp_path / "c")
    g2 = torch.Generator().manual_seed(1)
    pyckpt.Checkpoint(g=g2).restore(path).assert_consumed()
    assert torch.equal(torch.rand(5, generator=g2), torch.rand(5, generator=g))


@pytest.mark.parametrize("value, hint", [
    (5, "pyckpt.Variable(5)"),
    (0.5, "pyckpt.Variable(0.5)"),
    ("text", "put it in a dict"),
    (object(), "state_dict() and load_state_dict()"),
    (None, "leave the argument out"),
    (lambda: 0, "state_dict() and load_state_dict()"),
])
def test_unsavable_checkpoint_values_raise(value, hint):
    with pytest.raises(TypeError, match="Checkpoint attribute 'x'") as e:
        pyckpt.Checkpoint(x=value)
    assert hint in str(e.value)
    ckpt = pyckpt.Checkpoint()
    with pytest.raises(TypeError, match="Checkpoint attribute 'later'"):
        ckpt.later = value  # a tracked attribute assigned later raises the same way
    ckpt._private = value  # names starting with _ are not tracked


def test_dict_keeps_numbers_strings_and_arrays(tmp_path):
    cfg = {"lr": 0.1, "w": np.arange(3.0), "steps": 10, "on": True, "name": "adam",
           "nothing": None, 3: "int key", "big": 2 ** 80}
    path = pyckpt.Checkpoint(cfg=cfg).save(tmp_path / "c")
    assert "cfg/lr/.ATTRIBUTES/VARIABLE_VALUE" in keys_of(path)
    fresh = {"lr": 0.0, "w": np.zeros(3), "steps": 0, "on": False, "name": "", "nothing": 1,
             3: "", "big": 0}
    ckpt = pyckpt.Checkpoint(cfg=fresh)
    ckpt.restore(path).assert_consumed()
    assert same(dict(ckpt.cfg), cfg)


def test_list_values_restore_in_place_and_tuples_are_left_out(tmp_path, monkeypatch):
    monkeypatch.setattr(stateful, "_WARNED", set())  # the warning is shown once per process
    m = pyckpt.Module()
    m.sizes = [64, 32.0, "relu", None]
    m.shape = (3, 4)  # a restore could not change a tuple: left out, with a warning once
    with pytest.warns(UserWarning, match="inside tuples"):
        path = pyckpt.Checkpoint(m=m).save(tmp_path / "c")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        pyckpt.Checkpoint(m=m).save(tmp_path / "c")
    assert not any(k.startswith("m/shape") for k in keys_of(path))
    m2 = pyckpt.Module()
    m2.sizes = [0, 0.0, "", 5]
    m2.shape = (1, 1)
    pyckpt.Checkpoint(m=m2).restore(path).assert_consumed()
    assert list(m2.sizes) == [64, 32.0, "relu", None] and type(m2.sizes[1]) is float
    assert m2.shape == (1, 1)


def test_unsavable_list_elements_warn_once(tmp_path):
    class Opaque:
        pass

    ckpt = pyckpt.Checkpoint(things=[Opaque(), np.ones(2)], more={"o": Opaque()})
    with pytest.warns(UserWarning, match="leaves a .*Opaque out of checkpoints"):
        ckpt.write(tmp_path / "a")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        ckpt.write(tmp_path / "b")  # once per type
    assert keys_of(tmp_path / "b") == ["things/1/.ATTRIBUTES/VARIABLE_VALUE"]


def test_unsavable_state_raises_naming_the_path(tmp_path):
    class Bad:
        def state_dict(self):
            return {"ok": 1, "nested": {"fn": print}}

        def load_state_dict(self, sd):
            pass

    with pytest.raises(TypeError, match=r"cannot save holder\.bad .*\['nested'\]\['fn'\]"):
        pyckpt.Checkpoint(holder={"bad": Bad()}).write(tmp_path / "c")


# -- status assertions and restore-on-create ----------------------------------------------

def test_stateful_objects_count_in_status_assertions(tmp_path):
    path = pyckpt.Checkpoint(c=Counter(1)).save(tmp_path / "c")
    status = pyckpt.Checkpoint(other=Counter(2)).restore(path)
    with pytest.raises(AssertionError, match="other"):
        status.assert_existing_objects_matched()
    assert "c/step/.ATTRIBUTES/VARIABLE_VALUE" in status.unmatched_checkpoint_keys()
    status = pyckpt.Checkpoint(c=Counter(2), d=Counter(3)).restore(path)
    assert status.unmatched_objects() == ["d"]


def test_state_of_strings_only_is_reported_by_path(tmp_path):
    class Names:
        def __init__(self, name):
            self.name = name

        def state_dict(self):
            return {"name": self.name}

        def load_state_dict(self, sd):
            self.name = sd["name"]

    path = pyckpt.Checkpoint(n=Names("a"), cfg={"s": "x"}).save(tmp_path / "c")
    status = pyckpt.Checkpoint().restore(path)
    assert status.unmatched_checkpoint_keys() == ["cfg/s/.ATTRIBUTES/PYTHON_STATE",
                                                  "n/.ATTRIBUTES/PYTHON_STATE"]
    ckpt = pyckpt.Checkpoint(n=Names("b"), cfg={"s": "y"})
    ckpt.restore(path).assert_consumed()
    assert ckpt.n.name == "a" and ckpt.cfg["s"] == "x"


def test_restore_on_create(tmp_path):
    opt = torch.optim.SGD(torch.nn.Linear(2, 2).parameters(), lr=1.0)
    sched = torch.optim.lr_scheduler.StepLR(opt, 3)
    for _ in range(4):
        opt.step()
        sched.step()
    path = pyckpt.Checkpoint(sched=sched, cfg={"lr": 0.25}, c=Counter(4)).save(tmp_path / "c")
    ckpt = pyckpt.Checkpoint(cfg={})
    status = ckpt.restore(path)
    assert "cfg/lr/.ATTRIBUTES/VARIABLE_VALUE" in status.unmatched_checkpoint_keys()
    ckpt.cfg["lr"] = 1.0  # restored the moment it is created
    assert ckpt.cfg["lr"] == 0.25
    sched2 = torch.optim.lr_scheduler.StepLR(torch.optim.SGD(torch.nn.Linear(2, 2).parameters(),
                                                             lr=1.0), 3)
    ckpt.sched = sched2
    assert sched2.last_epoch == 4
    ckpt.c = Counter(0)
    assert same(ckpt.c.state, Counter(4).state)
    status.assert_consumed()


def test_restore_plan_lists_stateful_values(tmp_path):
    path = pyckpt.Checkpoint(c=Counter(1), cfg={"lr": 0.1, "s": "x"}).write(tmp_path / "c")
    plan = pyckpt.Checkpoint(c=Counter(0), cfg={"lr": 0.2}).restore_plan(path)
    restored = dict(plan.restore)
    assert restored["cfg/lr/.ATTRIBUTES/VARIABLE_VALUE"] == "cfg.lr"
    assert restored["c/step/.ATTRIBUTES/VARIABLE_VALUE"] == "c"
    assert plan.pending == ["cfg/s/.ATTRIBUTES/PYTHON_STATE"]
    assert not plan.unmatched_objects and not plan.conflicts


# -- snapshots, copies, the manager, torch ---------------------------------------------------

def test_snapshot_and_copy_state_carry_state(tmp_path):
    src = pyckpt.Checkpoint(c=Counter(2), cfg={"lr": 0.1, "name": "a"})
    snap = src.snapshot()
    src.c.state["step"] = 100
    src.cfg["name"] = "changed"
    src.read(snap).assert_consumed()
    assert same(src.c.loaded, Counter(2).state) and src.cfg["name"] == "a"
    dst = pyckpt.Checkpoint(c=Counter(0), cfg={"lr": 0.0, "name": ""})
    pyckpt.copy_state(src, dst)
    assert same(dst.c.loaded, Counter(2).state) and dict(dst.cfg) == {"lr": 0.1, "name": "a"}


@pytest.mark.parametrize("blocking", [True, False])
def test_manager_saves_state(tmp_path, blocking):
    ckpt = pyckpt.Checkpoint(c=Counter(5), rng=pyckpt.GlobalRNG())
    with pyckpt.CheckpointManager(ckpt, tmp_path, max_to_keep=2) as manager:
        manager.save(blocking=blocking)
        manager.wait_until_finished()
    fresh = pyckpt.Checkpoint(c=Counter(0), rng=pyckpt.GlobalRNG())
    with pyckpt.CheckpointManager(fresh, tmp_path, max_to_keep=2) as manager:
        assert manager.restore_or_initialize() is not None
    assert same(fresh.c.loaded, Counter(5).state)


def test_optimizer_param_groups_keep_their_types(tmp_path):
    m = torch.nn.Linear(3, 2)
    opt = torch.optim.AdamW(m.parameters(), lr=1e-3, betas=(0.8, 0.9))
    m(torch.randn(4, 3)).sum().backward()
    opt.step()
    path = pyckpt.Checkpoint(opt=opt).save(tmp_path / "c")
    opt2 = torch.optim.AdamW(torch.nn.Linear(3, 2).parameters(), lr=0.5)
    pyckpt.Checkpoint(opt=opt2).restore(path).assert_consumed()
    g1, g2 = opt.state_dict()["param_groups"][0], opt2.state_dict()["param_groups"][0]
    assert same(g2, g1) and type(g2["betas"]) is tuple and g2["foreach"] is None


def test_checkpoints_without_state_still_restore(tmp_path):
    """A graph without the ``state`` column (pyckpt before issue 14) restores optimizers
    and state-dict objects through their current state dict."""
    m = torch.nn.Linear(3, 2)
    opt = torch.optim.Adam(m.parameters(), lr=0.01)
    sched = torch.optim.lr_scheduler.StepLR(opt, 2)
    m(torch.randn(4, 3)).sum().backward()
    opt.step()
    sched.step()
    ckpt = pyckpt.Checkpoint(model=m, opt=opt, sched=sched)
    live = traverse(ckpt)
    doc = live.to_json()
    doc.pop("state")
    items = [saving.Item(k, live.array_of(n), live.objects[n])
             for k, n in zip(live.value_keys(), live.values)]
    saving.write(saving.SavePlan.build(items, str(tmp_path / "old"), graph=doc))
    assert "state" not in graph_of(tmp_path / "old")
    m2 = torch.nn.Linear(3, 2)
    opt2 = torch.optim.Adam(m2.parameters(), lr=0.5)
    sched2 = torch.optim.lr_scheduler.StepLR(opt2, 2)
    pyckpt.Checkpoint(model=m2, opt=opt2, sched=sched2).read(tmp_path / "old").assert_consumed()
    assert opt2.param_groups[0]["lr"] == 0.01 and sched2.last_epoch == 1
    assert torch.equal(opt2.state_dict()["state"][0]["exp_avg"],
                       opt.state_dict()["state"][0]["exp_avg"])


def test_graph_without_stateful_values_is_unchanged(tmp_path):
    pyckpt.Checkpoint(v=pyckpt.Variable(np.ones(2))).write(tmp_path / "c")
    assert set(graph_of(tmp_path / "c")) == {"children", "value", "kind"}


def test_flat_save_keeps_python_types(tmp_path):
    tree = {"big": 2 ** 64, "neg": -(2 ** 90), "max": 2 ** 63 - 1, "i": 3, "f": 3.0, "b": True,
            "s": "x", "n": None, "raw": b"\x00\x01", "u": (1, [2.5])}
    pyckpt.save(tree, tmp_path / "c")
    back = pyckpt.load(tmp_path / "c")
    assert same(back, tree)
    skeleton = json.dumps(_reference_reader.read_manifest(tmp_path / "c")["tree"])
    assert '["big", {"s": "big", "as": "int"}]' in skeleton
    assert dict(pyckpt.list_variables(tmp_path / "c"))["big"] == ()
    assert pyckpt.load_checkpoint(tmp_path / "c").get_tensor("big").dtype == np.dtype("<U20")


@pytest.mark.filterwarnings("ignore:'set_vital' is deprecated")
def test_stateful_dataloader(tmp_path):
    tdata = pytest.importorskip("torchdata.stateful_dataloader")
    loader = tdata.StatefulDataLoader(list(range(20)), batch_size=3, shuffle=True,
                                      generator=torch.Generator().manual_seed(0))
    it = iter(loader)
    for _ in range(2):
        next(it)
    path = pyckpt.Checkpoint(loader=loader).save(tmp_path / "c")
    expected = [b.tolist() for b in it]
    loader2 = tdata.StatefulDataLoader(list(range(20)), batch_size=3, shuffle=True,
                                       generator=torch.Generator().manual_seed(1))
    pyckpt.Checkpoint(loader=loader2).restore(path).assert_consumed()
    assert [b.tolist() for b in loader2] == expected
