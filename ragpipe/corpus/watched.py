"""Watched sources for the nightly schedule: ``ragpipe/specs/sources.yaml`` (or ``$RAGPIPE_SOURCES``).

A watched source has a ``name``, a ``path`` (relative to the config file), a corpus ``format``
(``beir`` or ``markdown``) and a ``default_scope``. ``snapshot_changed_sources`` registers each
source whose content digest differs from the digest of its last registered revision as a new
revision ``<name>-<YYYYMMDD>-<digest8>`` (``digest8``: the first 8 hex digits of the source digest
that registration pins); an unchanged source registers nothing. The last revision of a source is
its registered revision of that key shape with the greatest date (ties: the newest record file).
Configuration is operational: it never enters an ID.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import date
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from ragpipe.corpus.connectors import CorpusFormat, source_digest
from ragpipe.corpus.registry import list_revisions, load_revision, register_revision
from ragpipe.corpus.wxr import DEFAULT_WXR_STATUSES
from ragpipe.kernel.settings import current_settings
from ragpipe.kernel.strict_load import StrictLoadError, load_yaml
from ragpipe.kernel.workspace import Workspace

DEFAULT_SOURCES_PATH = Path(__file__).resolve().parent.parent / "specs" / "sources.yaml"
NAME = r"[a-z0-9][a-z0-9_.-]{0,63}"


class SourcesError(ValueError):
    """The sources config cannot be read or is invalid; the message names the file."""


class WatchedSource(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(pattern=rf"^{NAME}$")
    path: Path
    format: CorpusFormat
    default_scope: str | None = None  # None: every document must declare its access_scopes
    wxr_statuses: tuple[str, ...] | None = None  # wxr only: the statuses read (default: publish)


class SourcesConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    schema_: Literal["ragpipe.sources/v1"] = Field(alias="schema")
    sources: tuple[WatchedSource, ...] = ()


def load_sources(path: Path | None = None) -> tuple[WatchedSource, ...]:
    """The watched sources, paths resolved against the file's folder; duplicate names refused."""
    path = Path(path or current_settings().sources or DEFAULT_SOURCES_PATH)
    try:
        config = SourcesConfig.model_validate(load_yaml(path.read_text(encoding="utf-8"), str(path)))
    except StrictLoadError as exc:
        raise SourcesError(str(exc)) from None
    except (OSError, UnicodeDecodeError) as exc:
        raise SourcesError(f"{path}: cannot read sources config: {exc}") from None
    except ValidationError as exc:
        problems = "; ".join(f"{'.'.join(map(str, e['loc'])) or '(top)'}: {e['msg']}" for e in exc.errors())
        raise SourcesError(f"{path}: invalid sources config: {problems}") from None
    names = [s.name for s in config.sources]
    dup = next((n for n in names if names.count(n) > 1), None)
    if dup is not None:
        raise SourcesError(f"{path}: source name {dup!r} is declared twice")
    return tuple(s.model_copy(update={"path": (path.parent / s.path).resolve()}) for s in config.sources)


def revision_key(name: str, day: date, digest: str) -> str:
    return f"{name}-{day:%Y%m%d}-{digest.split(':', 1)[1][:8]}"


def last_revision(ws: Workspace, name: str) -> str | None:
    """The source's latest registered revision (module docstring), or None."""
    shape = re.compile(rf"^{re.escape(name)}-(\d{{8}})-[0-9a-f]{{8}}$")
    keys = [
        (m.group(1), (ws.registry / f"{k}.json").stat().st_mtime_ns, k)
        for k in list_revisions(ws.registry)
        if (m := shape.match(k))
    ]
    return max(keys)[2] if keys else None


@dataclass(frozen=True)
class SourceCheck:
    source: str
    revision: str | None  # the new revision; None when unchanged or unreadable
    reason: str
    last: str | None = None  # when unchanged: the source's last revision (the schedule checks it was built)


def snapshot_changed_sources(ws: Workspace, sources: tuple[WatchedSource, ...], day: date) -> list[SourceCheck]:
    """Register a new revision for each changed source (module docstring); one result per source.
    A source that cannot be read or registered is a result naming why — it never stops the
    others, which are registered all the same."""
    results = []
    for s in sources:
        try:
            results.append(_check_source(ws, s, day))
        except (OSError, ValueError, RecursionError) as exc:  # CorpusError, RevisionError, a nesting bomb
            results.append(SourceCheck(s.name, None, f"cannot snapshot: {_one_line(exc)}"))
    return results


def _one_line(exc: Exception) -> str:
    """A corpus error lists its problems on lines of their own; a skip reason is one line."""
    first, *rest = [line.strip() for line in str(exc).splitlines() if line.strip()] or [type(exc).__name__]
    return f"{first} {'; '.join(rest)}" if rest else first


def _check_source(ws: Workspace, s: WatchedSource, day: date) -> SourceCheck:
    statuses = s.wxr_statuses or DEFAULT_WXR_STATUSES
    digest = source_digest(s.path, s.format, statuses)
    last = last_revision(ws, s.name)
    if last is not None and load_revision(ws.registry, last).source_digest == digest:
        return SourceCheck(s.name, None, f"unchanged since revision {last}", last)
    key = revision_key(s.name, day, digest)
    register_revision(ws.registry, key, s.path, s.format, s.default_scope, s.wxr_statuses)
    return SourceCheck(
        s.name, key, f"content digest {digest} differs from {'revision ' + last if last else 'no earlier revision'}"
    )
