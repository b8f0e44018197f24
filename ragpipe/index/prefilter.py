"""Which rows a search may return: every search engine applies it inside its search, before the
top ``k`` (a prefilter, never a cut after it), so a filtered search returns ``k`` rows whenever
``k`` visible rows exist.

A row passes when its document's access scopes intersect ``scopes`` (no scopes: no row), its
document is not one of ``exclude_documents`` (how a document-level ranking deepens without
re-reading the documents it has ranked), its document has one of ``source_roles`` (any role when
empty) and ``selection`` admits its document (any document when ``None``; a metadata filter:
``ragpipe.index.selection``). tantivy applies it as zero-score clauses, lancedb as a ``where``
predicate, the in-memory engine as a row mask.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass, replace

from ragpipe.index.selection import Selection


@dataclass(frozen=True)
class Prefilter:
    scopes: tuple[str, ...]
    exclude_documents: Collection[str] = ()
    source_roles: tuple[str, ...] = ()
    selection: Selection | None = None

    @property
    def admits_nothing(self) -> bool:
        """Whether no row can pass, whatever the index holds (no scopes, or a selection of none)."""
        return not self.scopes or (self.selection is not None and self.selection.empty)

    def excluding(self, documents: Collection[str]) -> Prefilter:
        """This prefilter leaving out ``documents``' rows as well (instead of any excluded before)."""
        return replace(self, exclude_documents=documents)
