"""The subcommands of the ``pyckpt`` command line, one module each."""
