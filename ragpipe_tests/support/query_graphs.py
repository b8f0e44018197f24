"""Moving and editing query-graph cache entries in tests (``ragpipe.embedding.query_graph``).

An entry's manifest is sealed with the key of the home that holds the cache, so an entry copied to
another home is not trusted there. ``copy_entry`` copies an entry *and re-seals* its manifest
with the destination home's key — what a holder of that key could do, and what a test that
alters a trusted entry needs; ``edit_manifest`` changes a manifest, re-sealed with the home's key
(``reseal=True``: a key holder's edit) or not (anyone else's).
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path

from ragpipe.embedding.query_graph import MANIFEST, SEAL_DOMAIN, entry_dir, sealing_key
from ragpipe.kernel.seals import SEAL, sealed
from ragpipe.spec import EmbedderSpec


def read_manifest(entry: Path) -> dict:
    """The manifest's content (without its seal)."""
    document = json.loads((entry / MANIFEST).read_text())
    document.pop(SEAL, None)
    return document


def write_manifest(entry: Path, content: dict, reseal: bool) -> None:
    """``content`` as the entry's manifest, sealed with its home's key when ``reseal``."""
    key = sealing_key(entry.parent, create=True)
    document = sealed(content, SEAL_DOMAIN, key) if reseal else content
    (entry / MANIFEST).write_text(json.dumps(document, indent=1))


def edit_manifest(entry: Path, edit: Callable[[dict], object], reseal: bool) -> None:
    content = read_manifest(entry)
    edit(content)
    write_manifest(entry, content, reseal)


def copy_entry(src_root: Path, spec: EmbedderSpec, dst_root: Path, dst_spec: EmbedderSpec | None = None) -> Path:
    """``spec``'s entry under ``src_root`` copied into ``dst_root`` (as ``dst_spec``'s folder when
    given: a renamed entry), its manifest re-sealed unchanged with ``dst_root``'s key."""
    target = entry_dir(dst_root, dst_spec or spec)
    shutil.copytree(entry_dir(src_root, spec), target)
    write_manifest(target, read_manifest(target), reseal=True)
    return target
