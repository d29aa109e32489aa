"""The package version; pyproject.toml reads it from here (one home)."""

__version__ = "0.1.0"
