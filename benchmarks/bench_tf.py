#!/usr/bin/env python3
"""TensorFlow checkpoints: pyckpt reading them, against pyckpt's own format and
against TensorFlow itself (issue 15).

A model-like float32 state (~1 GiB by default, model_state.py) is written twice,
untimed: by TensorFlow (``tf.train.Checkpoint(state={name: tf.Variable}).write``,
in a TensorFlow worker process) and by pyckpt (``pyckpt.Checkpoint(state={name:
pyckpt.Variable}).write``). Then interleaved rounds (rotating order, a ballast
touched before every timed operation, warm page cache) time:

READ every tensor into new arrays
  * ``pyckpt.load(tf_prefix)``                      pyckpt reading TensorFlow's checkpoint
  * ``pyckpt.load(pyckpt_path)``                    pyckpt reading its own (the reference)
  * ``tf.train.load_checkpoint`` + ``get_tensor``    TensorFlow reading its own, every key
RESTORE into existing variables
  * ``pyckpt.Checkpoint.restore(tf_prefix)``        into pyckpt.Variables
  * ``pyckpt.Checkpoint.restore(pyckpt_path)``      the reference
  * ``tf.train.Checkpoint.read(tf_prefix)``         into tf.Variables (+ assert_consumed)

Target: pyckpt reading TensorFlow's format takes no longer than pyckpt reading its
own (ratio <= 1.0x; a few percent of noise either way on a shared machine).
TensorFlow runs in its own process (a worker that times its own calls; nothing of
TensorFlow is imported here). Without TensorFlow, the TensorFlow checkpoint is
written by pyckpt.interop.tensorflow.save and TensorFlow's rows are skipped.

    python benchmarks/bench_tf.py                 # 1 GiB, 5 rounds
    python benchmarks/bench_tf.py --quick         # 128 MiB, 2 rounds (smoke test)
    python benchmarks/bench_tf.py --json out.json
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

from model_state import build_state, describe_state  # noqa: E402

READ, RESTORE = "read every tensor", "restore into variables"
PY_TF, PY_OWN, TF_READ = "pyckpt.load(TF ckpt)", "pyckpt.load(pyckpt ckpt)", "TF load_checkpoint+get_tensor"
PY_TF_R, PY_OWN_R, TF_RESTORE = ("pyckpt restore(TF ckpt)", "pyckpt restore(pyckpt ckpt)",
                                 "TF Checkpoint.read")


# -- the TensorFlow worker (a separate process) -----------------------------------------

def tf_worker(prefix: str, total_bytes: int, seed: int) -> None:
    """Writes the state with TensorFlow (unless it exists), then times commands read
    from stdin ("read", "restore", "quit"), one JSON line per command."""
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    import tensorflow as tf

    state = build_state(total_bytes, seed)
    variables = {k: tf.Variable(v) for k, v in state.items()}
    del state
    ckpt = tf.train.Checkpoint(state=variables)
    if not os.path.exists(prefix + ".index"):
        ckpt.write(prefix)
    print(json.dumps({"ready": True, "tensorflow": tf.__version__}), flush=True)
    for line in sys.stdin:
        cmd = line.strip()
        if cmd == "quit":
            break
        try:
            t0 = time.perf_counter()
            if cmd == "read":
                reader = tf.train.load_checkpoint(prefix)
                out = {k: reader.get_tensor(k) for k in reader.get_variable_to_shape_map()}
            else:
                ckpt.read(prefix).assert_consumed()  # read: write() stored no save_counter
                out = None
            seconds = time.perf_counter() - t0
            del out
            print(json.dumps({"seconds": seconds}), flush=True)
        except Exception as e:  # reported, the run goes on
            print(json.dumps({"error": f"{type(e).__name__}: {e}"}), flush=True)


class TFWorker:
    def __init__(self, prefix: str, total_bytes: int, seed: int) -> None:
        env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3", CUDA_VISIBLE_DEVICES="")
        self.proc = subprocess.Popen(
            [sys.executable, os.path.abspath(__file__), "--tf-worker", prefix, str(total_bytes),
             str(seed)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env)
        self.info = self._reply()

    def _reply(self) -> dict:
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError("the TensorFlow worker exited")
        return json.loads(line)

    def time(self, cmd: str) -> float:
        assert self.proc.stdin is not None
        self.proc.stdin.write(cmd + "\n")
        self.proc.stdin.flush()
        reply = self._reply()
        if "error" in reply:
            raise RuntimeError(reply["error"])
        return float(reply["seconds"])

    def close(self) -> None:
        try:
            assert self.proc.stdin is not None
            self.proc.stdin.write("quit\n")
            self.proc.stdin.flush()
            self.proc.wait(timeout=60)
        except Exception:
            self.proc.kill()


def tensorflow_importable() -> bool:
    import importlib.util
    return importlib.util.find_spec("tensorflow") is not None


# -- the run ------------------------------------------------------------------------------

def main(argv=None) -> int:
    from harness import (GiB, Results, import_pyckpt, make_workdir, machine_header, name_column,
                         no_pyckpt, parse, parser, print_errors, print_pairs, print_plan,
                         print_table, print_targets, ratio_column, rotated, summarize,
                         targets_of, throughput_columns, timed, touch_ballast, version_of,
                         write_report, dist_version)

    p = parser(__doc__.split("\n\n")[0])
    p.add_argument("--keep", action="store_true", help="keep the checkpoints written")
    args = parse(p, argv, quick={"size_gb": 0.125, "rounds": 2})
    pyckpt = import_pyckpt()
    if pyckpt is None:
        return no_pyckpt()
    from pyckpt.interop import tensorflow as tfio

    work = make_workdir(args.dir, "pyckpt-bench-tf-")
    have_tf = tensorflow_importable()
    meta = machine_header(str(work), {"pyckpt": version_of(pyckpt),
                                      "tensorflow": dist_version("tensorflow-cpu")
                                      or dist_version("tensorflow")})
    total = int(args.size_gb * GiB)
    state = build_state(total, args.seed)
    info = describe_state(state)
    print(f"state   : {info['bytes'] / GiB:.3f} GiB in {info['tensors']} float32 tensors "
          f"(largest {info['largest_bytes'] / 2 ** 20:.1f} MiB)")
    tf_prefix = str(work / "tf" / "ckpt-1")
    own_path = str(work / "pyckpt" / "ckpt-1")
    worker = None
    try:
        t = time.perf_counter()
        if have_tf:
            os.makedirs(work / "tf", exist_ok=True)
            worker = TFWorker(tf_prefix, total, args.seed)
            print(f"wrote   : TensorFlow {worker.info['tensorflow']} checkpoint "
                  f"({time.perf_counter() - t:.1f} s)")
        variables = {k: pyckpt.Variable(v) for k, v in state.items()}
        del state
        ckpt = pyckpt.Checkpoint(state=variables)
        ckpt.write(own_path)
        if not have_tf:
            tfio.save(own_path, tf_prefix)
            print("wrote   : TensorFlow checkpoint by pyckpt.interop.tensorflow.save "
                  "(tensorflow is not installed: its rows are skipped)")
        tf_bytes = sum(os.path.getsize(work / "tf" / n) for n in os.listdir(work / "tf"))
        print(f"files   : TensorFlow {tf_bytes / GiB:.3f} GiB, pyckpt "
              f"{sum(os.path.getsize(work / 'pyckpt' / 'ckpt-1' / n) for n in os.listdir(work / 'pyckpt' / 'ckpt-1')) / GiB:.3f} GiB")

        # check once, untimed: pyckpt reads TensorFlow's checkpoint as TensorFlow wrote it
        from_tf = pyckpt.load(tf_prefix)["state"]
        for k, v in variables.items():
            got = from_tf[k.replace(".", "..")][".ATTRIBUTES"]["VARIABLE_VALUE"] \
                if k.replace(".", "..") in from_tf else from_tf[k][".ATTRIBUTES"]["VARIABLE_VALUE"]
            if not np.array_equal(got, v.numpy()):
                raise AssertionError(f"{k}: pyckpt read different values from the TF checkpoint")
        del from_tf

        res = Results((READ, RESTORE))
        steps = [
            (READ, PY_TF, lambda: timed(pyckpt.load, tf_prefix)[0]),
            (READ, PY_OWN, lambda: timed(pyckpt.load, own_path)[0]),
            (RESTORE, PY_TF_R, lambda: timed(lambda: ckpt.restore(tf_prefix).assert_consumed())[0]),
            (RESTORE, PY_OWN_R, lambda: timed(lambda: ckpt.restore(own_path).assert_consumed())[0]),
        ]
        if worker is not None:
            steps += [(READ, TF_READ, lambda: worker.time("read")),
                      (RESTORE, TF_RESTORE, lambda: worker.time("restore"))]
        for phase, name, _ in steps:
            res.meta[name] = {"phase": phase}
        res.meta[PY_TF]["compare_to"] = PY_OWN
        res.meta[PY_TF_R]["compare_to"] = PY_OWN_R
        if worker is not None:
            res.meta[TF_READ]["compare_to"] = PY_TF
            res.meta[TF_RESTORE]["compare_to"] = PY_TF_R
        ballast = min(int(info["bytes"]), 1 << 30)
        print_plan(args.rounds, ballast, f"{len(steps)} operations")
        for rnd in range(args.rounds):
            t_round = time.perf_counter()
            for phase, name, fn in rotated(steps, rnd):
                if name in res.errors:
                    continue
                touch_ballast(ballast)
                try:
                    res.add(phase, name, rnd, fn())
                except Exception as e:
                    res.errors[name] = f"{type(e).__name__}: {e}"
                    print(f"    ! {name} failed: {res.errors[name]}")
            print(f"  round {rnd + 1}/{args.rounds} done in {time.perf_counter() - t_round:.1f} s",
                  flush=True)
        summary = summarize(res, int(info["bytes"]))
        cols = [name_column(32), *throughput_columns(), ratio_column("vs ref")]
        for phase in (READ, RESTORE):
            if phase in summary:
                print_table(f"== {phase.upper()}  ({info['bytes'] / GiB:.3f} GiB; vs ref = "
                            "median time / the reference's)", summary[phase]["contenders"], cols,
                            pairs="per-round pairs (time / reference time):", name_width=32,
                            ref_width=30)
        targets = [t for phase in (READ, RESTORE) if phase in summary
                   for t in targets_of({n: s for n, s in summary[phase]["contenders"].items()
                                        if n in (PY_TF, PY_TF_R)}, "<=", 1.0)]
        print_targets(targets)
        print_errors(res.errors)
        write_report(args.json, meta, args, state=info, seconds=res.seconds, summary=summary,
                     targets=[t.doc() for t in targets], errors=res.errors,
                     tensorflow_writer="tensorflow" if worker is not None else "pyckpt")
        return 0
    finally:
        if worker is not None:
            worker.close()
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    if len(sys.argv) == 5 and sys.argv[1] == "--tf-worker":
        tf_worker(sys.argv[2], int(sys.argv[3]), int(sys.argv[4]))
        sys.exit(0)
    sys.exit(main())
