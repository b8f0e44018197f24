"""Where ragpipe keeps runtime state: one folder, ``$RAGPIPE_HOME`` (default ``./var/ragpipe``).

```
revisions/<key>.json          registered corpus revisions (immutable)
work/<key>/<stage>/           latest output of each stage for a revision, replaced atomically
embedding_cache/<spec hex>/   embedding cache shards, shared by all revisions
bundles/<bundle id hex>/      published, immutable index bundles
```
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

DEFAULT_HOME = Path("var") / "ragpipe"


def default_home() -> Path:
    return Path(os.environ.get("RAGPIPE_HOME") or DEFAULT_HOME).resolve()


@dataclass(frozen=True)
class Workspace:
    home: Path

    @property
    def registry(self) -> Path:
        return self.home / "revisions"

    @property
    def embedding_cache(self) -> Path:
        return self.home / "embedding_cache"

    @property
    def bundles(self) -> Path:
        return self.home / "bundles"

    def stage_dir(self, revision: str, stage: str) -> Path:
        return self.home / "work" / revision / stage
