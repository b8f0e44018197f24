"""The ``ragpipe`` command (entry point ``ragpipe.cli:main``; ``python -m ragpipe.cli`` runs it too).

Dagster, torch and the index libraries load only inside the commands that need them, so
``ragpipe --help`` and the release commands start fast.
"""

from ragpipe.cli.app import app, main

__all__ = ["app", "main"]
