"""The deterministic model-like float32 state the benchmarks checkpoint."""

from __future__ import annotations

import numpy as np


def state_shapes(total_bytes: int) -> dict[str, tuple[int, ...]]:
    """Parameter shapes of a 12-layer transformer whose params are ~1/3 of ``total_bytes``:
    an embedding table, 4 large matrices and 8 small vectors per layer."""
    n_layers = 12
    param_floats = max(total_bytes // 3 // 4, 1 << 16)
    # ~80% of the params in layer matrices: 12 * d^2 floats per layer.
    d = max(64, int((0.8 * param_floats / (12 * n_layers)) ** 0.5) // 64 * 64)
    shapes: dict[str, tuple[int, ...]] = {}
    for i in range(n_layers):
        p = f"layers.{i}"
        shapes[f"{p}.attn.qkv.weight"] = (d, 3 * d)
        shapes[f"{p}.attn.qkv.bias"] = (3 * d,)
        shapes[f"{p}.attn.out.weight"] = (d, d)
        shapes[f"{p}.attn.out.bias"] = (d,)
        shapes[f"{p}.mlp.fc1.weight"] = (d, 4 * d)
        shapes[f"{p}.mlp.fc1.bias"] = (4 * d,)
        shapes[f"{p}.mlp.fc2.weight"] = (4 * d, d)
        shapes[f"{p}.mlp.fc2.bias"] = (d,)
        for ln in ("ln1", "ln2"):
            shapes[f"{p}.{ln}.weight"] = (d,)
            shapes[f"{p}.{ln}.bias"] = (d,)
    shapes["final_ln.weight"] = (d,)
    shapes["final_ln.bias"] = (d,)
    used = sum(int(np.prod(s)) for s in shapes.values())
    vocab = max(256, (param_floats - used) // d)
    return {"embed.weight": (vocab, d), **shapes}


def build_state(total_bytes: int, seed: int = 0) -> dict[str, np.ndarray]:
    """A deterministic transformer-like float32 state: ``params.*``, ``adam.m.*`` and
    ``adam.v.*`` for every shape of :func:`state_shapes` (a few hundred small tensors)."""
    shapes = state_shapes(total_bytes)
    rng = np.random.default_rng(seed)
    state: dict[str, np.ndarray] = {}
    for name, shape in shapes.items():
        state[f"params.{name}"] = rng.standard_normal(shape, dtype=np.float32)
    for name, shape in shapes.items():
        state[f"adam.m.{name}"] = rng.standard_normal(shape, dtype=np.float32) * np.float32(1e-3)
    for name, shape in shapes.items():
        v = rng.standard_normal(shape, dtype=np.float32)
        np.square(v, out=v)
        v *= np.float32(1e-6)
        state[f"adam.v.{name}"] = v
    return state


def describe_state(state: dict[str, np.ndarray]) -> dict:
    sizes = sorted((a.nbytes for a in state.values()), reverse=True)
    return {
        "bytes": sum(sizes),
        "tensors": len(sizes),
        "small_tensors_under_64KiB": sum(s < 64 * 1024 for s in sizes),
        "largest_bytes": sizes[0],
        "param_bytes": sum(a.nbytes for k, a in state.items() if k.startswith("params.")),
    }
