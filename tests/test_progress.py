"""progress=callback(bytes_done, bytes_total) on saves and loads (issue 7)."""

import numpy as np

import pyckpt


def _record():
    calls = []
    return calls, lambda done, total: calls.append((done, total))


def test_save_and_load_report_progress(ckpt_dir):
    tree = {"a": np.ones(4_000_000), "b": np.zeros(1000)}
    total = sum(v.nbytes for v in tree.values())
    calls, cb = _record()
    pyckpt.save(tree, ckpt_dir, progress=cb)
    assert calls and calls[-1] == (total, total)
    assert all(0 <= d <= t == total for d, t in calls)
    assert [d for d, _ in calls] == sorted(d for d, _ in calls)
    calls, cb = _record()
    pyckpt.load(ckpt_dir, progress=cb)
    assert calls[-1] == (total, total)
    calls, cb = _record()
    pyckpt.load(ckpt_dir, select=["b"], progress=cb)
    assert calls[-1] == (8000, 8000)


def test_checkpoint_write_reports_progress(tmp_path):
    calls, cb = _record()
    ck = pyckpt.Checkpoint(v=pyckpt.Variable(np.ones(1000)))
    ck.save(tmp_path / "c", progress=cb)
    assert calls[-1][0] == calls[-1][1] > 0


def test_remote_upload_reports_progress():
    calls, cb = _record()
    pyckpt.save({"a": np.ones(3_000_000)}, "memory://progress/c", progress=cb,
                storage_options={"pyckpt": {"part_size": 1 << 20}})
    assert calls[-1] == (24_000_000, 24_000_000)
