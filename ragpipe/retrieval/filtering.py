"""Metadata filters of one bundle: validated against the fields it declares, turned into a
``Selection`` every channel applies inside its search (``ragpipe.index.selection``).

The fields a filter may name are the metadata keys (plus ``source_role``) of the documents the
subject may see, with the types those documents hold (``corpus.metadata_filter.field_catalog``
over the subject's scope groups); a filter naming another field or comparing a field with a value
of another type is a ``QueryError`` of one line, before any search — and names no field, type or
count that only hidden documents hold.
Selections are cached per filter (its canonical JSON), so a filter a service sees often costs one
dictionary lookup.
"""

from __future__ import annotations

import json
import threading
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from ragpipe.corpus.metadata import Metadata
from ragpipe.corpus.metadata_filter import (
    DocumentMatcher,
    FieldFact,
    Filter,
    FilterError,
    check_filter,
    field_catalog,
    filter_json,
    parse_filter,
)
from ragpipe.corpus.models import Document
from ragpipe.index.rows import IndexRow
from ragpipe.index.selection import Selection
from ragpipe.kernel.canonical import CanonicalEncodingError, canonical_bytes
from ragpipe.retrieval.results import FilterQueryError

_CACHED_SELECTIONS = 256
_CACHED_CATALOGS = 64
Group = tuple[str, ...]  # a scope group (``ragpipe.retrieval.audience``)


@dataclass(frozen=True)
class Resolved:
    """A filter as a query applies it: its canonical JSON (as text: each result gets its own
    copy, ``shown()``, so no caller can change the cached one) and its selection."""

    canonical: str
    selection: Selection

    def shown(self) -> dict[str, Any]:
        return json.loads(self.canonical)


class BundleFilters:
    """The filterable fields of one bundle and the selections of the filters asked so far."""

    def __init__(self, documents: Sequence[Document], rows: Sequence[IndexRow]):
        ordinal = {d.document_id: i for i, d in enumerate(documents)}
        self._setup(
            [d.document_id for d in documents],
            [d.metadata for d in documents],
            [d.source_role for d in documents],
            [tuple(sorted(set(d.access_scopes))) for d in documents],
            np.array([ordinal[r.document_id] for r in rows], dtype=np.int64),
        )

    @classmethod
    def from_columns(
        cls,
        document_ids: Sequence[str],
        metas: Sequence[Metadata],
        roles: Sequence[str],
        groups: Sequence[Group],
        row_documents: np.ndarray,
    ) -> BundleFilters:
        """The same from columns: per document (in the bundle's order) its ID, metadata, source
        role and scope group, and per index row the position of its document."""
        filters = cls.__new__(cls)
        filters._setup(document_ids, metas, roles, groups, np.asarray(row_documents, dtype=np.int64))
        return filters

    def _setup(
        self,
        document_ids: Sequence[str],
        metas: Sequence[Metadata],
        roles: Sequence[str],
        groups: Sequence[Group],
        row_documents: np.ndarray,
    ) -> None:
        self._metas, self._roles = metas, roles
        self._groups = groups
        self.catalog = field_catalog(metas, roles)
        self._catalogs: OrderedDict[tuple[Group, ...], dict[str, FieldFact]] = OrderedDict()
        self._matcher = DocumentMatcher(metas, roles)
        self._ids = np.empty(len(document_ids), dtype=object)
        self._ids[:] = document_ids
        self._row_document = row_documents
        self._indexed = np.zeros(len(document_ids), dtype=bool)
        self._indexed[self._row_document] = True  # documents with at least one index row
        self._cache: OrderedDict[bytes, Selection] = OrderedDict()
        self._resolved: OrderedDict[tuple[str, tuple[Group, ...]], Resolved] = OrderedDict()
        self._lock = threading.Lock()

    def catalog_for(self, groups: Sequence[Group]) -> dict[str, FieldFact]:
        """The fields, types and counts of the documents in ``groups`` (a subject's audience): what
        a filter is checked against, so no refusal names a field, a type or a count that only
        documents hidden from the subject hold."""
        key = tuple(sorted(groups))
        with self._lock:
            found = self._catalogs.get(key)
            if found is not None:
                self._catalogs.move_to_end(key)
                return found
        seen = set(key)
        visible = [i for i, g in enumerate(self._groups) if g in seen]
        catalog = field_catalog([self._metas[i] for i in visible], [self._roles[i] for i in visible])
        with self._lock:
            self._catalogs[key] = catalog
            if len(self._catalogs) > _CACHED_CATALOGS:
                self._catalogs.popitem(last=False)
        return catalog

    def parse(self, value: object, groups: Sequence[Group] | None = None) -> Filter:
        """A filter's JSON form (or an already parsed ``Filter``), checked against the fields of
        the documents in ``groups`` (None: the whole bundle's); ``FilterQueryError`` (one line)
        otherwise."""
        catalog = self.catalog if groups is None else self.catalog_for(groups)
        try:
            parsed = value if isinstance(value, Filter) else parse_filter(value)
            check_filter(parsed, catalog)
        except FilterError as exc:
            raise FilterQueryError(str(exc)) from None
        return parsed

    def resolve(self, value: object, groups: Sequence[Group]) -> Resolved:
        """``parse`` against the audience ``groups`` then ``selection``, with the filter's canonical
        JSON — cached by the filter's JSON text and the audience, so a filter a service sees often
        costs one lookup per query."""
        text = _text_key(value)
        key = None if text is None else (text, tuple(sorted(groups)))
        if key is not None:
            with self._lock:
                found = self._resolved.get(key)
                if found is not None:
                    self._resolved.move_to_end(key)
                    return found
        parsed = self.parse(value, groups)
        try:
            canonical = canonical_bytes(filter_json(parsed)).decode("utf-8")
        except CanonicalEncodingError as exc:  # the literal rules should make this unreachable
            raise FilterQueryError(f"filter: {exc}") from None
        resolved = Resolved(canonical, self.selection(parsed))
        if key is not None:
            with self._lock:
                self._resolved[key] = resolved
                if len(self._resolved) > _CACHED_SELECTIONS:
                    self._resolved.popitem(last=False)
        return resolved

    def selection(self, f: Filter) -> Selection:
        """The documents ``f`` admits (among those with index rows) and the rows they own."""
        key = canonical_bytes(filter_json(f))
        with self._lock:
            found = self._cache.get(key)
            if found is not None:
                self._cache.move_to_end(key)
                return found
        admitted = self._matcher.mask(f)
        selection = Selection(
            documents=frozenset(self._ids[admitted & self._indexed].tolist()),
            others=frozenset(self._ids[~admitted & self._indexed].tolist()),
            rows=admitted[self._row_document],
        )
        selection.rows.setflags(write=False)
        with self._lock:
            self._cache[key] = selection
            if len(self._cache) > _CACHED_SELECTIONS:
                self._cache.popitem(last=False)
        return selection


def _text_key(value: object) -> str | None:
    """A JSON filter's text as a cache key (None for a parsed ``Filter`` or a value JSON cannot
    hold, which are parsed every time). ``sort_keys`` only: ``in`` lists keep their order, so two
    spellings of one filter are two keys of one parse — never one key for two filters."""
    if isinstance(value, Filter):
        return None
    try:
        return json.dumps(value, sort_keys=True, ensure_ascii=False, allow_nan=False)
    except (TypeError, ValueError, RecursionError):  # parse_filter refuses these in one line
        return None
