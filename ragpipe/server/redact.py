"""What a response may say about the server's files: nothing absolute.

Refusal reasons and retriever errors are written for the operator and often name files
(``<home>/bundles/<id>/chunks.parquet: digest mismatch``). The operator reads them whole in the
server's log (logger ``ragpipe.server``); over HTTP — ``/readyz``, ``/v1/release`` and error bodies,
which answer without a key — ``PathRedactor`` rewrites them: the served home becomes
``$RAGPIPE_HOME`` (the layout below it is ragpipe's, the same on every host), and any other
absolute path becomes ``<path>``. Caller input echoed back (the path of a 404) is not touched.
"""

from __future__ import annotations

import re
from pathlib import Path

HOME = "$RAGPIPE_HOME"
# An absolute POSIX path: a "/" not preceded by a word character, ".", ":", "/", "~" or "$" (so not
# "a/b", "s3://bucket/key", "http://host/x", "$RAGPIPE_HOME/bundles" or a date), then no whitespace,
# quote or bracket, and not ending in the ":" or "." of the sentence around it.
ABSOLUTE = re.compile(r"(?<![\w.:/~$-])/[^\s'\"`,;()\[\]{}<>]*[^\s'\"`,;()\[\]{}<>:.]")


class PathRedactor:
    """``redactor(text)``: ``text`` with ``home`` as ``$RAGPIPE_HOME`` and other absolute paths as ``<path>``."""

    def __init__(self, home: Path):
        roots = {str(home), str(home.resolve())}
        # the longest first, and only whole components: "/srv/home" must not eat "/srv/home2"
        self.home = re.compile(
            "|".join(re.escape(root) for root in sorted(roots, key=len, reverse=True)) + r"(?![^/\s'\"`,;)\]}>])"
        )

    def __call__(self, text: str) -> str:
        return ABSOLUTE.sub("<path>", self.home.sub(lambda _: HOME, text))

    def tree(self, value: object) -> object:
        """``value`` (JSON-like) with every string redacted."""
        if isinstance(value, str):
            return self(value)
        if isinstance(value, dict):
            return {k: self.tree(v) for k, v in value.items()}
        if isinstance(value, list | tuple):
            return [self.tree(v) for v in value]
        return value
