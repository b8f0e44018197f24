"""Which lexical searcher answers a subject: exact BM25 statistics for every audience, no index
built on the query path.

An *audience* is the set of documents one subject may see. Documents that share a scope set form a
*scope group*; the policy admits or hides whole groups, so an audience is named by the groups it
admits. The bundle's lexical index holds each group in its own segment(s) (``index.segments``).
A subject who may see every group is served by the bundle's index. Anyone else is served by an
*audience view*: a private temp folder linking exactly the admitted groups' segments, opened in
milliseconds on the audience's first query. tantivy sums BM25 statistics over the segments an index
lists, so a view's scores equal those of an index built from the authorized rows alone and reveal
nothing about hidden documents.

A view costs no copy of the index: its files are links to the bundle's, and the memory mapped for
them is the page cache the bundle's own index uses. What each costs is a tantivy reader, one memory
map per segment file and a folder of links (plus one idle tantivy watcher thread), so views are
bounded by count (``max_views``, least recently used closed first), not by size.
"""

from __future__ import annotations

import threading
import time
from collections import Counter, OrderedDict
from concurrent.futures import Future
from dataclasses import dataclass
from functools import cached_property

from ragpipe.index.lexical import LexicalSearcher
from ragpipe.index.segments import read_meta, read_scope_groups
from ragpipe.retrieval.authz import ScopePolicy, Subject

Group = tuple[str, ...]


@dataclass(frozen=True)
class Audience:
    groups: tuple[Group, ...]  # the scope groups the subject may see, sorted
    documents: int  # documents in those groups
    total_documents: int  # documents in the bundle

    @cached_property
    def admitted(self) -> frozenset[Group]:
        return frozenset(self.groups)

    @property
    def whole_bundle(self) -> bool:
        return self.documents == self.total_documents


@dataclass(frozen=True)
class LexicalStatistics:
    """Trace record: which index served the lexical channel, and what opening it cost."""

    index: str  # "bundle" or "audience"
    documents: int
    total_documents: int
    rows: int
    build_ms: float | None  # set when this query opened the audience view, else None

    def as_dict(self) -> dict[str, object]:
        return {
            "index": self.index,
            "documents": self.documents,
            "total_documents": self.total_documents,
            "rows": self.rows,
            "built": self.build_ms is not None,
            "build_ms": self.build_ms,
        }


class AudienceIndexes:
    """The bundle's lexical searcher plus, per partial audience, a view of its groups' segments.

    Thread-safe: the caches are locked, and a view being opened is opened once — other threads
    asking for the same audience wait for it. At most ``max_views`` views are kept open and at most
    ``max_audiences`` subjects' audiences are remembered (least recently used dropped first).
    ``close()`` removes every view folder."""

    def __init__(
        self,
        bundle_searcher: LexicalSearcher,
        policy: ScopePolicy,
        document_scopes: dict[str, tuple[str, ...]],
        max_views: int = 8,
        max_audiences: int = 4096,
    ):
        if max_views < 1 or max_audiences < 1:
            raise ValueError("max_views and max_audiences must be >= 1")
        self.bundle_searcher = bundle_searcher
        self.policy = policy
        self.max_views = max_views
        self.max_audiences = max_audiences
        directory = bundle_searcher.directory
        self._meta = read_meta(directory)
        self._segments = {g.scopes: g.segment_ids for g in read_scope_groups(directory)}
        self._all_segments = frozenset(s for ids in self._segments.values() for s in ids)
        groups: dict[tuple[str, ...], Group] = {}  # one group tuple per distinct scope tuple, shared
        self.group_of: dict[str, Group] = {}
        for doc, scopes in document_scopes.items():
            group = groups.get(scopes)
            if group is None:
                group = groups[scopes] = tuple(sorted(set(scopes)))
            self.group_of[doc] = group
        self.group_sizes = Counter(self.group_of.values())
        self.total_documents = len(document_scopes)
        self._lock = threading.Lock()
        self._audiences: OrderedDict[tuple[str, ...], Audience] = OrderedDict()
        self._views: OrderedDict[tuple[Group, ...], LexicalSearcher] = OrderedDict()
        self._opening: dict[tuple[Group, ...], Future[LexicalSearcher]] = {}
        self.builds = 0  # audience views opened so far (closed ones included)

    @property
    def cached_audiences(self) -> int:
        """Audience views currently open."""
        return len(self._views)

    def audience(self, subject: Subject) -> Audience:
        with self._lock:
            found = self._audiences.get(subject.scopes)
            if found is None:
                groups = tuple(sorted(g for g in self.group_sizes if self.policy.allows(subject, g)))
                found = Audience(groups, sum(self.group_sizes[g] for g in groups), self.total_documents)
                self._audiences[subject.scopes] = found
                if len(self._audiences) > self.max_audiences:
                    self._audiences.popitem(last=False)
            else:
                self._audiences.move_to_end(subject.scopes)
            return found

    def searcher_for(self, subject: Subject) -> tuple[LexicalSearcher, LexicalStatistics]:
        audience = self.audience(subject)
        segment_ids = [s for g in audience.groups for s in self._segments.get(g, ())]
        if audience.whole_bundle or set(segment_ids) == self._all_segments:
            searcher = self.bundle_searcher
            return searcher, LexicalStatistics(
                "bundle", audience.documents, audience.total_documents, searcher.num_docs, None
            )
        searcher, build_ms = self._view(audience.groups, segment_ids)
        return searcher, LexicalStatistics(
            "audience", audience.documents, audience.total_documents, searcher.num_docs, build_ms
        )

    def _view(self, key: tuple[Group, ...], segment_ids: list[str]) -> tuple[LexicalSearcher, float | None]:
        """The open view for ``key`` and, when this call opened it, the milliseconds it took."""
        with self._lock:
            searcher = self._views.get(key)
            if searcher is not None:
                self._views.move_to_end(key)
                return searcher, None
            pending = self._opening.get(key)
            owner = pending is None
            if owner:
                pending = self._opening[key] = Future()
        if not owner:
            return pending.result(), None  # opened by another thread (its error, if it failed)
        started = time.perf_counter()
        try:
            searcher = LexicalSearcher.open_view(
                self.bundle_searcher.directory, self._meta, segment_ids, self.bundle_searcher.rows
            )
        except BaseException as exc:
            with self._lock:
                del self._opening[key]
            pending.set_exception(exc)
            raise
        build_ms = round((time.perf_counter() - started) * 1000, 3)
        with self._lock:
            del self._opening[key]
            self._views[key] = searcher
            self.builds += 1
            evicted = [self._views.popitem(last=False)[1] for _ in range(len(self._views) - self.max_views)]
        pending.set_result(searcher)
        for old in evicted:  # a thread still searching an evicted view is unaffected (see close)
            old.close()
        return searcher, build_ms

    def close(self) -> None:
        """Close every open view (their folders are removed)."""
        with self._lock:
            views, self._views = list(self._views.values()), OrderedDict()
        for view in views:
            view.close()
