"""Random edits of a file's bytes, for the fuzz and differential tests of DCP's
readers (tests/interop_dcp/test_fuzz.py, test_unpickler_differential.py)."""

from __future__ import annotations

import random


def mutate(data: bytes, rng: random.Random) -> bytes:
    """One to four random edits: flips, interesting bytes, cuts, insertions, copies."""
    out = bytearray(data)
    for _ in range(rng.randint(1, 4)):
        if not out:
            out += bytes([rng.randrange(256)])
        pos = rng.randrange(len(out))
        kind = rng.randrange(6)
        if kind == 0:
            out[pos] ^= 1 << rng.randrange(8)
        elif kind == 1:
            out[pos] = rng.choice([0, 1, 0x7F, 0x80, 0xFF, 0xED, ord("."), ord("R"), ord("b"),
                                   ord("u"), ord("s"), ord("("), 0x94, 0x81, 0x93])
        elif kind == 2:
            del out[pos:pos + rng.randint(1, 64)]
        elif kind == 3:
            out[pos:pos] = bytes(rng.randrange(256) for _ in range(rng.randint(1, 8)))
        elif kind == 4:
            n = rng.choice([1, 4, 8])
            out[pos:pos + n] = rng.choice([b"\xff" * n, b"\x00" * n, b"\x7f" + b"\xff" * (n - 1)])
        else:
            span = out[pos:pos + rng.randint(1, 32)]
            out[rng.randrange(len(out) + 1):0] = span
    return bytes(out)
