"""Framework adapters (torch, JAX), active only when the framework is imported
by the program: pyckpt never imports torch or jax itself."""

from . import jax_support, torch_support

__all__ = ["torch_support", "jax_support"]
