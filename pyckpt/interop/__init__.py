"""Conversions between pyckpt checkpoints and other formats."""
