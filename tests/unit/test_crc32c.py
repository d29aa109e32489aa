import os
import zlib

import pytest
from hypothesis import given, settings, strategies as st

from pyckpt import _core, _reference_reader as ref


RFC3720 = [
    (bytes(32), 0x8A9136AA),
    (b"\xff" * 32, 0x62A8AB43),
    (bytes(range(32)), 0x46DD794E),
    (bytes(range(31, -1, -1)), 0x113FDB5C),
    (b"123456789", 0xE3069283),
]


@pytest.mark.parametrize("data,want", RFC3720)
def test_rfc3720_vectors(data, want):
    assert _core.crc32c(data) == want
    assert _core.crc32c_portable(data) == want
    hw = _core.crc32c_hardware(data)
    assert hw is None or hw == want
    assert ref.crc32c(data) == want


def test_implementation_is_dispatched():
    assert _core.crc32c_implementation() in ("avx512-vpclmulqdq", "sse4.2", "portable")


def test_each_x86_path_agrees_when_forced_off(tmp_path):
    """The dispatcher's fallbacks (SSE4.2 when AVX-512 is switched off) give the same CRCs."""
    import subprocess
    import sys

    code = ("import os; from pyckpt import _core; b = bytes(range(256)) * 4099; "
            "print(_core.crc32c_implementation(), _core.crc32c(b), _core.crc32c_portable(b))")
    env = dict(os.environ, PYCKPT_CRC32C_NO_AVX512="1")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                         check=True, cwd=tmp_path).stdout.split()
    assert out[0] in ("sse4.2", "portable") and out[1] == out[2]


@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=5000), st.integers(0, 2**32 - 1))
def test_agrees_with_pure_python_reference(data, seed):
    assert _core.crc32c(data, seed) == ref.crc32c(data, seed)
    assert _core.crc32c_portable(data, seed) == ref.crc32c(data, seed)


@pytest.mark.parametrize("n", [0, 1, 7, 8, 767, 768, 24575, 24576, 24577, 100_003, 1 << 20])
def test_hardware_matches_portable_at_every_alignment(n):
    buf = os.urandom(n + 16)
    for off in range(8):
        view = memoryview(buf)[off:off + n]
        p = _core.crc32c_portable(view)
        assert _core.crc32c(view) == p
        hw = _core.crc32c_hardware(view)
        assert hw is None or hw == p


def test_combine_and_mask():
    a, b = os.urandom(12345), os.urandom(777)
    assert _core.crc32c_combine(_core.crc32c(a), _core.crc32c(b), len(b)) == _core.crc32c(a + b)
    c = _core.crc32c(a)
    assert _core.crc32c_unmask(_core.crc32c_mask(c)) == c
    assert _core.crc32c_mask(c) == ref.mask(c)


def test_differs_from_zlib_crc32():  # Castagnoli, not the zlib polynomial
    assert _core.crc32c(b"123456789") != zlib.crc32(b"123456789")
