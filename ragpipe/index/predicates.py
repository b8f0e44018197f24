"""The SQL prefilters of lancedb searches, and the name rules both vector engines enforce.

Kept apart from ``ragpipe.index.vector`` so that the in-memory engine validates scopes and roles
exactly as the lancedb prefilter does without importing lancedb (seconds of imports).
"""

from __future__ import annotations

from collections.abc import Collection

from ragpipe.corpus.models import SCOPE_PATTERN
from ragpipe.index.selection import Selection


def scope_predicate(scopes: tuple[str, ...]) -> str:
    """SQL prefilter for lancedb. Scope names are validated identifiers, never free text."""
    for s in scopes:
        if not SCOPE_PATTERN.match(s):
            raise ValueError(f"invalid scope name {s!r}")
    return "array_has_any(access_scopes, [" + ", ".join(f"'{s}'" for s in scopes) + "])"


def sql_string(value: str) -> str:
    """``value`` as a SQL string literal: quotes doubled, so any document ID stays one literal."""
    return "'" + value.replace("'", "''") + "'"


def role_predicate(roles: tuple[str, ...]) -> str:
    """``source_role IN (...)``; role names are validated identifiers (the scope rule), never free text."""
    for r in roles:
        if not SCOPE_PATTERN.match(r):
            raise ValueError(f"invalid source role {r!r}")
    return "source_role IN (" + ", ".join(f"'{r}'" for r in sorted(set(roles))) + ")"


def exclusion_predicate(documents: Collection[str]) -> str:
    """``document_id NOT IN (...)`` over ``documents`` in sorted order (deterministic SQL)."""
    return "document_id NOT IN (" + ", ".join(sql_string(d) for d in sorted(documents)) + ")"


def selection_predicate(selection: Selection) -> str:
    """``document_id IN (...)`` over the admitted documents, or ``NOT IN`` over the others when
    they are fewer (sorted: deterministic SQL)."""
    if selection.by_exclusion:
        return exclusion_predicate(selection.others)
    return "document_id IN (" + ", ".join(sql_string(d) for d in sorted(selection.documents)) + ")"
