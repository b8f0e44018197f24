"""Which lexical index answers a subject: exact BM25 statistics for every audience.

An *audience* is the set of documents one subject may see. Documents that share a scope set
form a *scope group*; a policy admits or hides whole groups, so an audience is named by the scope
groups it admits. A subject who may see every group is served by the bundle's own index. Anyone
else is served by an index of exactly their rows (``audience_searcher``), built on first use and
kept for the next queries: its BM25 IDF and average length cover the authorized rows only, so
its results equal those of an index built from the authorized documents alone, and scores
reveal nothing about the statistics of hidden documents.
"""

from __future__ import annotations

import time
from collections import Counter, OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cached_property

from ragpipe.index.lexical import LexicalSearcher, audience_searcher
from ragpipe.index.rows import IndexRow
from ragpipe.pipeline_spec import LexicalIndexSpec
from ragpipe.retrieval.authz import ScopePolicy, Subject


@dataclass(frozen=True)
class Audience:
    groups: tuple[tuple[str, ...], ...]  # the scope groups the subject may see, sorted
    documents: int  # documents in those groups
    total_documents: int  # documents in the bundle

    @cached_property
    def admitted(self) -> frozenset[tuple[str, ...]]:
        return frozenset(self.groups)

    @property
    def whole_bundle(self) -> bool:
        return self.documents == self.total_documents


@dataclass(frozen=True)
class LexicalStatistics:
    """Trace record: which index served the lexical channel, and what building it cost."""

    index: str  # "bundle" or "audience"
    documents: int
    total_documents: int
    rows: int
    build_ms: float | None  # set when this query built the audience index, else None

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
    """The bundle's lexical searcher plus, per partial audience, a searcher of its rows only.

    At most ``max_cached`` audience indexes are kept (least recently used is dropped); each costs
    roughly what the bundle's lexical index costs, held in memory."""

    def __init__(
        self,
        bundle_searcher: LexicalSearcher,
        rows: Sequence[IndexRow],
        spec: LexicalIndexSpec,
        policy: ScopePolicy,
        document_scopes: dict[str, tuple[str, ...]],
        max_cached: int = 8,
    ):
        if max_cached < 1:
            raise ValueError("max_cached must be >= 1")
        self.bundle_searcher = bundle_searcher
        self.rows = rows
        self.spec = spec
        self.policy = policy
        self.max_cached = max_cached
        self.group_of = {doc: tuple(sorted(scopes)) for doc, scopes in document_scopes.items()}
        self.group_sizes = Counter(self.group_of.values())
        self.total_documents = len(document_scopes)
        self._audiences: dict[tuple[str, ...], Audience] = {}
        self._searchers: OrderedDict[tuple[tuple[str, ...], ...], LexicalSearcher] = OrderedDict()
        self.builds = 0  # audience indexes built so far (evicted ones included)

    @property
    def cached_audiences(self) -> int:
        return len(self._searchers)

    def audience(self, subject: Subject) -> Audience:
        found = self._audiences.get(subject.scopes)
        if found is None:
            groups = tuple(sorted(g for g in self.group_sizes if self.policy.allows(subject, g)))
            found = Audience(groups, sum(self.group_sizes[g] for g in groups), self.total_documents)
            self._audiences[subject.scopes] = found
        return found

    def searcher_for(self, subject: Subject) -> tuple[LexicalSearcher, LexicalStatistics]:
        audience = self.audience(subject)
        if audience.whole_bundle:
            searcher = self.bundle_searcher
            return searcher, LexicalStatistics("bundle", audience.documents, audience.total_documents, searcher.num_docs, None)
        build_ms = None
        searcher = self._searchers.get(audience.groups)
        if searcher is None:
            started = time.perf_counter()
            admitted = audience.admitted
            positions = [i for i, row in enumerate(self.rows) if self.group_of[row.document_id] in admitted]
            searcher = audience_searcher([self.rows[i] for i in positions], positions, self.spec, self.bundle_searcher.rows)
            build_ms = round((time.perf_counter() - started) * 1000, 3)
            self.builds += 1
            self._searchers[audience.groups] = searcher
            while len(self._searchers) > self.max_cached:
                self._searchers.popitem(last=False)
        self._searchers.move_to_end(audience.groups)
        return searcher, LexicalStatistics("audience", audience.documents, audience.total_documents, searcher.num_docs, build_ms)
