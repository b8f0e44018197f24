"""The revision registry: one immutable JSON record per corpus revision key.

Registering reads and validates the whole corpus first (so a bad corpus is refused before any
partition exists) and pins the digest of the raw source. Re-registering a key with the same source
is a no-op; with different bytes, options or format it is refused, because a revision key names
one immutable revision.
"""

from __future__ import annotations

import json
from pathlib import Path

from pydantic import BaseModel, ConfigDict

from ragpipe.corpus.connectors import CorpusFormat, SourceRecord, read_corpus, source_digest
from ragpipe.corpus.models import REVISION_PATTERN, SCOPE_PATTERN
from ragpipe.kernel.publish import write_file_atomic


class RevisionError(ValueError):
    pass


class RevisionRecord(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    revision: str
    source_path: str
    format: CorpusFormat
    default_scope: str
    source_digest: str


def _record_path(registry: Path, revision: str) -> Path:
    return registry / f"{revision}.json"


def register_revision(
    registry: Path, revision: str, source: Path, fmt: CorpusFormat, default_scope: str = "public"
) -> tuple[RevisionRecord, bool]:
    """Validate and register a revision. Returns (record, newly_registered)."""
    if not REVISION_PATTERN.match(revision):
        raise RevisionError(f"invalid revision key {revision!r}: use letters, digits, '.', '_' or '-' (max 128)")
    if not SCOPE_PATTERN.match(default_scope):
        raise RevisionError(f"invalid default scope {default_scope!r}")
    source = source.resolve()
    if not source.exists():
        raise RevisionError(f"{source}: corpus path does not exist")
    read_corpus(source, fmt)  # raises CorpusError naming file/line/ID
    record = RevisionRecord(
        revision=revision,
        source_path=str(source),
        format=fmt,
        default_scope=default_scope,
        source_digest=source_digest(source, fmt),
    )
    path = _record_path(registry, revision)
    data = (record.model_dump_json(indent=2) + "\n").encode()
    if write_file_atomic(path, data, replace=False):
        return record, True
    existing = load_revision(registry, revision)
    if existing != record:
        raise RevisionError(
            f"revision {revision!r} is already registered with different content "
            f"(source {existing.source_path}, digest {existing.source_digest}, scope {existing.default_scope}); "
            "revision keys name immutable revisions: register the new content under a new key"
        )
    return record, False


def load_revision(registry: Path, revision: str) -> RevisionRecord:
    path = _record_path(registry, revision)
    if not path.exists():
        raise RevisionError(f"revision {revision!r} is not registered (no {path})")
    return RevisionRecord.model_validate(json.loads(path.read_text(encoding="utf-8")))


def list_revisions(registry: Path) -> list[str]:
    return sorted(p.stem for p in registry.glob("*.json")) if registry.is_dir() else []


def read_registered_corpus(record: RevisionRecord) -> list[SourceRecord]:
    """Read a registered revision's source, refusing it if its bytes changed since registration."""
    source = Path(record.source_path)
    if not source.exists():
        raise RevisionError(f"revision {record.revision!r}: source {source} no longer exists")
    digest = source_digest(source, record.format)
    if digest != record.source_digest:
        raise RevisionError(
            f"revision {record.revision!r}: source {source} changed since registration "
            f"({record.source_digest} -> {digest}); register the new content under a new revision key"
        )
    return read_corpus(source, record.format)
