"""The save/load engine: turns lists of arrays into committed checkpoints and back."""
