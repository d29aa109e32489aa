"""``python -m pyckpt``: the same as the ``pyckpt`` command."""

import sys

from .cli import main

sys.exit(main())
