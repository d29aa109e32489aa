"""Run every save/load/restore/copy/manager flow a few rounds with the cyclic collector
off, and print (as JSON) what each leaves reachable only through reference cycles:
objects of pyckpt's types, functions of pyckpt's modules and containers of arrays.

Run in a fresh interpreter by test_cycles.py, so that no thread left over from another
test can add its garbage to the census. Usage: python cycle_census.py WORKDIR"""

import gc
import json
import sys
import threading

import numpy as np

import pyckpt
from pyckpt.engine.copy import copy_checkpoint

TREE = {"a": np.arange(100_000.0), "b": [np.ones(10), {"c": np.zeros(5)}], "s": 3, "t": "x",
        "u": (np.arange(3), 2.5)}


def _label(o):
    mod = getattr(type(o), "__module__", "") or ""
    if mod.startswith("pyckpt"):
        return f"{mod}.{type(o).__qualname__}"
    if callable(o) and (getattr(o, "__module__", "") or "").startswith("pyckpt"):
        return f"function {o.__module__}.{getattr(o, '__qualname__', o)}"
    if isinstance(o, dict) and any(isinstance(v, np.ndarray) for v in o.values()):
        return "a dict of arrays"
    if isinstance(o, (list, tuple)) and any(isinstance(v, np.ndarray) for v in o):
        return "a sequence of arrays"
    return None


def cyclic_garbage(fn, rounds=3):
    gc.collect()
    gc.disable()
    try:
        for _ in range(rounds):
            fn()
        gc.set_debug(gc.DEBUG_SAVEALL)
        gc.collect()
        return sorted({lab for lab in map(_label, gc.garbage) if lab})
    finally:
        gc.set_debug(0)
        gc.garbage.clear()
        gc.enable()


def _manager(directory, **kw):
    def run():
        ck = pyckpt.Checkpoint(w=pyckpt.Variable(np.arange(1000.0)))
        with pyckpt.CheckpointManager(ck, directory, max_to_keep=2, **kw) as m:
            m.restore_or_initialize()
            m.save()
            m.save(blocking=False)
            m.wait_until_finished()
    return run


def main(work):
    saved = f"{work}/c"
    pyckpt.save(TREE, saved)
    into = {"a": np.zeros(100_000), "b": [np.zeros(10), {"c": np.zeros(5)}]}
    counter = iter(range(1000))
    cases = {
        "load": lambda: pyckpt.load(saved),
        "load mmap": lambda: pyckpt.load(saved, mmap=True),
        "load into": lambda: pyckpt.load(saved, into=into, select=["a", "b"]),
        "reader": lambda: pyckpt.load_checkpoint(saved).get_tensor("a"),
        "save": lambda: pyckpt.save(TREE, f"{work}/s{next(counter)}"),
        "save async": lambda: pyckpt.save(TREE, f"{work}/s{next(counter)}",
                                          blocking=False).wait(),
        "copy": lambda: copy_checkpoint(saved, f"{work}/cp{next(counter)}"),
        "manager": _manager(f"{work}/run"),
        "incremental manager": _manager(f"{work}/inc", incremental=True),
        "restore": lambda: pyckpt.Checkpoint(w=pyckpt.Variable(np.zeros(1000))).restore(
            f"{work}/run"),
    }
    leftovers = {name: cyclic_garbage(fn) for name, fn in cases.items()}
    threads = sorted(t.name for t in threading.enumerate() if t is not threading.main_thread())
    print(json.dumps({"leftovers": leftovers, "threads": threads}))


if __name__ == "__main__":
    main(sys.argv[1])
