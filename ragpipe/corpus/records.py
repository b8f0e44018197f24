"""What connectors produce, and the metadata rules both connectors share.

Metadata keys are either absent (the default applies) or valid. An explicit null, an empty list,
or a value of the wrong type is a problem naming the key and the value: it never silently becomes
the revision's default scope, because the default is usually the *widest* audience.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from ragpipe.corpus.metadata import Metadata
from ragpipe.corpus.models import SCOPE_PATTERN, Exclusion

DEFAULT_SOURCE_ROLE = "primary"


@dataclass(frozen=True)
class SourceRecord:
    document_id: str
    title: str
    text: str
    access_scopes: tuple[str, ...] | None  # None: the revision's default scope applies
    source_role: str
    location: str
    metadata: Metadata = field(default_factory=dict)
    # (key, reason) for each metadata key the source gave that is not kept (``corpus.metadata``)
    not_kept: tuple[tuple[str, str], ...] = field(default=())
    # (UTF-8 byte offset in ``text`` where a page starts, its page number), by offset, the first
    # at 0: formats with pages (PDF) say which page a span is on; () for the others
    pages: tuple[tuple[int, int], ...] = field(default=())


class CorpusRead(list[SourceRecord]):
    """A corpus's valid records (a plain list of them, for every existing caller) plus the entries
    the connector excluded with a reason (symbolic links, special files), for the snapshot."""

    def __init__(self, records: Iterable[SourceRecord] = (), excluded: Iterable[Exclusion] = ()):
        super().__init__(records)
        self.excluded: tuple[Exclusion, ...] = tuple(excluded)


_SHOWN_UNSCOPED = 3


def unscoped_refusal(records: Iterable[SourceRecord], default_scope: str | None, source: str) -> str | None:
    """Why ``records`` cannot be published with ``default_scope``, or None when they can: with no
    default scope, every document must declare its ``access_scopes`` — guessing an audience for
    the rest (``public``, the widest) is what a fail-safe policy must not do. The message names the
    first documents and their locations, and how to give a default."""
    if default_scope is not None:
        return None
    missing = [r for r in records if r.access_scopes is None]
    if not missing:
        return None
    shown = ", ".join(f"{r.document_id!r} ({_within(r.location, source)})" for r in missing[:_SHOWN_UNSCOPED])
    more = f" and {len(missing) - _SHOWN_UNSCOPED} more" if len(missing) > _SHOWN_UNSCOPED else ""
    return (
        f"{source}: {len(missing)} {'documents declare' if len(missing) != 1 else 'document declares'} no access_scopes: "
        f"{shown}{more}; declare them, or give the revision a default scope "
        "(ragpipe build --default-scope SCOPE, default_scope in the sources file)"
    )


def _within(location: str, source: str) -> str:
    """``location`` relative to the source the message already names: a folder's file, a line."""
    if location.startswith(source + "/"):
        return location[len(source) + 1 :]
    if location.startswith(source + ":"):
        return "line " + location[len(source) + 1 :]
    return location


def shown_value(value: Any) -> str:
    """A metadata value as JSON for messages (``null``, ``[]``, ``false`` …), cut at 60 chars; a
    value JSON cannot hold (a YAML date …) is shown as ``<type> <value>``."""
    try:
        text = json.dumps(value, ensure_ascii=False)
    except (TypeError, ValueError):
        text = f"{type(value).__name__} {value}"
    return text if len(text) <= 60 else text[:59] + "…"


def scopes_of(meta: Mapping[Any, Any], where: str, problems: list[str]) -> tuple[str, ...] | None:
    """``access_scopes``: absent → None (default scope); otherwise a non-empty list of scope names."""
    if "access_scopes" not in meta:
        return None
    value = meta["access_scopes"]
    if not isinstance(value, list) or not value or not all(isinstance(s, str) for s in value):
        hint = " (omit the key to use the revision's default scope)" if value is None else ""
        problems.append(f"{where}: access_scopes must be a non-empty list of strings, got {shown_value(value)}{hint}")
        return None
    bad = [s for s in value if not SCOPE_PATTERN.match(s)]
    if bad:
        problems.append(f"{where}: invalid access scope {bad[0]!r} (allowed: letters, digits, . _ : -)")
        return None
    return tuple(sorted(set(value)))


def role_of(meta: Mapping[Any, Any], where: str, problems: list[str]) -> str:
    """``source_role``: absent → ``primary``; otherwise a short identifier string."""
    if "source_role" not in meta:
        return DEFAULT_SOURCE_ROLE
    value = meta["source_role"]
    if not isinstance(value, str) or not SCOPE_PATTERN.match(value):
        problems.append(f"{where}: source_role must be a short identifier string, got {shown_value(value)}")
        return DEFAULT_SOURCE_ROLE
    return value
