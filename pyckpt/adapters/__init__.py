"""Framework adapters (torch, JAX), active only when the framework is imported
by the program: pyckpt never imports torch or jax itself, except to give back a
value that was saved from that framework (``load``, restored state dicts), and
then only if it is installed."""

from . import jax_support, torch_support

__all__ = ["torch_support", "jax_support"]
