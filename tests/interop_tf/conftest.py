import os
import shutil

import numpy as np
import pytest

FIXTURES = os.path.join(os.path.dirname(os.path.abspath(__file__)), "fixtures")


def expected(group: str) -> dict[str, dict[str, np.ndarray]]:
    """{checkpoint name: {key: value as TensorFlow read it}} of a fixture group."""
    out: dict[str, dict[str, np.ndarray]] = {}
    with np.load(os.path.join(FIXTURES, group, "expected.npz"), allow_pickle=True) as z:
        for name in z.files:
            ckpt, key = name.split(":", 1)
            out.setdefault(ckpt, {})[key] = z[name]
    return out


def same_value(got: np.ndarray, want: np.ndarray) -> bool:
    """Equal shape and bytes (npz keeps bfloat16 as raw 2-byte values), or equal
    elements for string tensors."""
    if got.shape != want.shape:
        return False
    if got.dtype == object or want.dtype == object:
        return [bytes(x) for x in got.reshape(-1)] == [bytes(x) for x in want.reshape(-1)]
    if want.dtype.kind != "V" and got.dtype != want.dtype:
        return False
    return np.ascontiguousarray(got).tobytes() == np.ascontiguousarray(want).tobytes()


@pytest.fixture
def fixture_copy(tmp_path):
    """A fresh copy of one fixture group, to damage or to write into."""
    def copy(group: str) -> str:
        dst = tmp_path / group
        shutil.copytree(os.path.join(FIXTURES, group), dst,
                        ignore=shutil.ignore_patterns("expected.npz"))
        return str(dst)
    return copy


@pytest.fixture
def tf_expected():
    return expected


@pytest.fixture
def same():
    return same_value


@pytest.fixture
def fixtures():
    return FIXTURES
