"""Query one verified bundle: the retriever behind `ragpipe query` (answering sits above it, in
``ragpipe.answer.answering``).

    from ragpipe.retrieval.retriever import Retriever
    from ragpipe.retrieval.authz import Subject
    r = Retriever("var/ragpipe/bundles/<id>")            # verifies the bundle once
    result = r.query("aspirin stroke", Subject("alice", ("public", "staff")), k=5)

A ``Retriever`` may be shared by any number of threads (docs/retrieval.md, Threads).
"""

from __future__ import annotations

import json
import threading
import time
from collections import Counter
from collections.abc import Callable, Collection
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from pathlib import Path
from typing import TypeVar

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from ragpipe.bundle.tables import CHUNKS, DOCUMENTS, REPRESENTATIONS, ChunkTable, release_free_memory
from ragpipe.bundle.verify import VerifiedBundle, check_vector_table, open_bundle
from ragpipe.corpus.metadata import Metadata, metadata_from_json, shown_metadata
from ragpipe.corpus.models import SCOPE_PATTERN, pages_of
from ragpipe.index.lexical import LexicalSearcher
from ragpipe.index.prefilter import Prefilter
from ragpipe.index.rows import SLICE_ROWS, RowScopes, index_columns
from ragpipe.index.selection import Selection
from ragpipe.kernel.workspace import Workspace, default_home
from ragpipe.retrieval.audience import AudienceIndexes, LexicalStatistics
from ragpipe.retrieval.authz import AuthorizationError, ScopePolicy, Subject
from ragpipe.retrieval.channels import ChannelRanking, LexicalBackend, VectorBackend, rank_channel, recheck
from ragpipe.retrieval.context import Evidence
from ragpipe.retrieval.filtering import BundleFilters
from ragpipe.retrieval.fusion import fuse
from ragpipe.retrieval.fusion.order import FusedHit
from ragpipe.retrieval.plan import PlanError, QueryPlan, load_plan
from ragpipe.retrieval.rerank import Reranker, rerank_fused
from ragpipe.retrieval.results import AnnComparison, QueryError, QueryResult, Rankings
from ragpipe.retrieval.trace import AuditFacts, fused_shown, query_trace
from ragpipe.retrieval.vector_engine import VectorEngine, engine_of, open_bundle_vectors, vector_search_refusal
from ragpipe.spec import EmbedderSpec, own_spec_id

T = TypeVar("T")
MODES = {"hybrid": ("lexical", "vector"), "lexical": ("lexical",), "vector": ("vector",)}
EMPTY_QUERY = "query text is empty (or only whitespace)"


def _pages(pages: tuple[tuple[int, int], ...], evidence: Evidence) -> list[int] | None:
    """[first, last] page of a hit's span, for documents with pages (PDF); None for the others."""
    found = pages_of(pages, evidence.byte_start, evidence.byte_end)
    return None if found is None else list(found)


class Retriever:
    """Opens (and verifies) a bundle once, or takes one already verified; ``query`` many times, from any thread.

    Thread safety: the bundle's tables are read-only after opening; lazily built state (plans,
    the query embedder, the channel worker pool) is created once under a lock; the lexical
    searchers and audience views are thread-safe (``AudienceIndexes``), the vector searcher is
    lock-free over a read-only matrix, and an embedder or reranker that does not declare itself
    safe for concurrent calls (``thread_safe = True``) is called under a lock."""

    def __init__(
        self,
        bundle: VerifiedBundle | Path | str,
        plan: QueryPlan | None = None,
        embedder=None,
        reranker: Reranker | None = None,
        threads: int = 2,
        channel_workers: int = 4,
        max_views: int = 8,
        max_audiences: int = 4096,
        query_graph_dir: Path | None = None,
    ):
        """``threads``: CPU threads for query embedding; ``channel_workers``: threads that run the
        lexical channel of hybrid queries while the query is embedded; ``max_views`` / ``max_audiences``:
        audience views and audience verdicts kept, least recently used dropped (docs/retrieval.md);
        ``query_graph_dir``: the query-graph cache the ``onnxruntime`` query runtime loads from
        (default ``$RAGPIPE_HOME/query_graphs``; ``ragpipe.embedding.query_graph``). All
        operational, never part of an ID."""
        if channel_workers < 1:
            raise ValueError("channel_workers must be >= 1")
        home = Workspace(default_home())
        self.query_graph_dir = Path(query_graph_dir) if query_graph_dir is not None else home.query_graphs
        # an opened bundle was verified by whoever opened it: never verify it twice (its lance
        # table's checks, if deferred, run before that table is read: see the vector searcher below)
        self.bundle = (
            bundle if isinstance(bundle, VerifiedBundle) else open_bundle(Path(bundle), defer_vector_table=True)
        )
        self.threads = threads
        self.channel_workers = channel_workers
        self.plan = plan or load_plan()
        self.policy = ScopePolicy()
        if reranker is None and self.plan.reranker is not None:
            from ragpipe.retrieval.rerank import CrossEncoderReranker

            reranker = CrossEncoderReranker(self.plan.reranker.model_path, self.plan.reranker.model_digest)
        self.reranker = reranker
        # An approximate plan on a bundle without an ANN index: its vector channel cannot be served,
        # so every query of a mode that searches vectors is refused with this line (``_resolve_plan``);
        # a lexical query does not need the vector index and is served.
        self._vector_refusal = (
            vector_search_refusal(self.bundle, self.plan.vector_search) if self.plan.approximate else None
        )
        root = self.bundle.path
        sem = self.bundle.manifest.semantic
        # The tables as verified (parsed from the digested bytes, never re-read from the store), held
        # as what a query reads: the chunks' columns, the IDs, and per document its title, scopes,
        # role, metadata and pages — never a document's text, nor a Python object per row beyond
        # the IDs and the dictionaries that look them up (a million rows: docs/benchmarks.md).
        tables = self.bundle.tables
        docs = tables.table(DOCUMENTS, ["document_id", "title", "access_scopes", "source_role", "metadata", "pages"])
        columns = index_columns(
            docs, tables.table(REPRESENTATIONS, ["representation_id", "chunk_id", "document_id", "kind"])
        )
        self.chunks = ChunkTable(tables.batches(CHUNKS))
        document_ids: list[str] = docs.column("document_id").to_pylist()
        document_scopes = RowScopes.of_arrow(docs.column("access_scopes"))
        self.scopes: dict[str, tuple[str, ...]] = dict(zip(document_ids, document_scopes))
        self.titles: dict[str, str] = {}
        self._metadata: dict[str, Metadata] = {}
        self._pages: dict[str, tuple[tuple[int, int], ...]] = {}  # documents with pages only
        role_names: dict[str, str] = {}  # one string per role, shared by every document and row
        roles: list[str] = []
        no_metadata: Metadata = {}  # shared by every document without metadata; read, never changed
        for start in range(0, len(document_ids), SLICE_ROWS):  # Python objects a slice at a time
            part, ids = docs.slice(start, SLICE_ROWS), document_ids[start : start + SLICE_ROWS]
            self.titles.update(zip(ids, part.column("title").to_pylist()))
            roles += [role_names.setdefault(r, r) for r in part.column("source_role").to_pylist()]
            for d, text in zip(ids, part.column("metadata").to_pylist()):
                self._metadata[d] = no_metadata if text == "{}" else metadata_from_json(json.loads(text))
            for d, pages in zip(ids, part.column("pages").to_pylist()):
                if pages:
                    self._pages[d] = tuple((offset, page) for offset, page in pages)
        self.roles: dict[str, str] = dict(zip(document_ids, roles))
        metas = [self._metadata[d] for d in document_ids]
        del docs
        rows = columns.id_tuples(document_ids)
        # Rows per scope group: a channel's request cap is the rows the subject may see, so no
        # trace figure ever depends on how many rows are hidden. A row's group: its document's
        # scopes, sorted and distinct (one computation per distinct scope tuple).
        row_scopes = columns.scopes
        groups = [tuple(sorted(set(g))) for g in row_scopes.groups]
        self._group_ids = {g: i for i, g in enumerate(sorted(set(groups)))}
        group_at = np.array([self._group_ids[g] for g in groups], dtype=np.int64)
        self._row_groups = group_at[row_scopes.index] if len(groups) else np.empty(0, dtype=np.int64)
        ordered = sorted(self._group_ids)
        self._group_rows = Counter(
            {ordered[g]: int(n) for g, n in enumerate(np.bincount(self._row_groups, minlength=len(ordered))) if n}
        )
        self.lexical = AudienceIndexes(
            LexicalSearcher.open(root / "lexical", rows),
            self.policy,
            self.scopes,
            max_views=max_views,
            max_audiences=max_audiences,
        )
        role_list = sorted(role_names)
        role_codes = pc.index_in(columns.source_role, value_set=pa.array(role_list, type=pa.string()))
        row_role_codes = role_codes.to_numpy(zero_copy_only=False).astype(np.int64)
        # Rows per (scope group, source role): what a query filtered on roles may see.
        pairs = np.bincount(self._row_groups * len(role_list) + row_role_codes, minlength=len(ordered) * len(role_list))
        self._group_role_rows = Counter(
            {(ordered[i // len(role_list)], role_list[i % len(role_list)]): int(n) for i, n in enumerate(pairs) if n}
        )
        # Per row, its scope group and role: what a query with a metadata filter may see.
        self._row_roles = np.array(role_list, dtype=object)[row_role_codes] if role_list else np.empty(0, dtype=object)
        document_groups = [tuple(sorted(set(g))) for g in document_scopes.groups]
        self.filters = BundleFilters.from_columns(
            document_ids,
            metas,
            roles,
            [document_groups[g] for g in document_scopes.index.tolist()],
            columns.document_at if columns.document_at is not None else np.empty(0, dtype=np.int64),
        )
        self.vector = (
            None  # nothing a query may use: the vectors are not even loaded
            if self._vector_refusal is not None
            else open_bundle_vectors(
                self.bundle,
                rows,
                row_scopes,
                self._row_roles,
                # a bundle opened with its lance table's checks deferred gets them before it is read
                before_lance=partial(check_vector_table, self.bundle),
                # an approximate plan is served from the bundle's ANN index; an exact one never reads it
                vector_search=self.plan.vector_search if self.plan.approximate else None,
            )
        )
        self.embedder_spec = EmbedderSpec.model_validate(sem.specs["embeddings"].spec) if sem.has_vector_index else None
        self._lock = threading.Lock()  # guards the lazily built state below
        self._closed = False
        self._embed_lock = threading.Lock()  # serialises embedders not safe for concurrent calls
        self._rerank_lock = threading.Lock()  # likewise for rerankers
        self._embedder = embedder
        self._plans: dict[str | None, tuple[QueryPlan, str, str]] = {}
        self._hydrated: dict[str, Evidence] = {}  # chunk ID -> its Evidence (see _evidence)
        self._worker: ThreadPoolExecutor | None = None
        self.release_id: str | None = None  # the release served (ragpipe.api.retriever_for_release)
        if embedder is not None:
            self._check_embedder(embedder.spec)
        release_free_memory()  # the tables' parses and the columns built from them: not kept

    @property
    def bundle_id(self) -> str:
        return self.bundle.bundle_id

    @property
    def approximate(self) -> bool:
        """Whether the vector channel is served approximately (the plan asks, the bundle has an ANN index)."""
        return bool(getattr(self.vector, "approximate", False))

    @property
    def vector_engine(self) -> VectorEngine | None:
        """Which engine serves the vectors and why (None: the bundle has no vector index)."""
        return engine_of(self.vector)

    def _check_embedder(self, spec: EmbedderSpec) -> None:
        expected = self.bundle.manifest.semantic.specs["embeddings"].spec_id
        if own_spec_id("embeddings", spec) != expected:
            raise QueryError(
                f"embedder spec {own_spec_id('embeddings', spec)} does not match the bundle's embedder {expected}"
            )

    def embedder(self):
        """The query embedder, loaded (once, whichever thread asks first) on first use: for the
        ``onnxruntime`` runtime the cached query graph of the bundle's embedder, created on first
        use and verified on every load (``QueryGraphError``, an ``EmbedderError``, when refused);
        for a remote (litellm) embedder, the same provider, model and endpoint the bundle was
        embedded with, whatever the runtime (``ragpipe.embedding.remote``: query vectors kept in memory)."""
        if self._embedder is not None:
            return self._embedder
        with self._lock:
            if self._embedder is None:
                self._check_embedder(self.embedder_spec)
                if self.embedder_spec.remote:
                    from ragpipe.embedding.remote import RemoteEmbedder

                    embedder = RemoteEmbedder(self.embedder_spec)
                elif self.plan.query_embedding.runtime == "onnxruntime":
                    # the verified cached graph: no torch on this path once the entry exists
                    from ragpipe.embedding.query_graph import query_encoder

                    embedder = query_encoder(self.query_graph_dir, self.embedder_spec, threads=self.threads)
                elif self.embedder_spec.quantization != "none":
                    # torch would embed the queries with the fp32 model: another model than the
                    # int8 graph the documents were embedded with
                    raise QueryError(
                        "the bundle's embedder runs int8 weights on onnxruntime: its queries are embedded by "
                        "the same graph (query_embedding.runtime: onnxruntime), not by sentence_transformers"
                    )
                else:
                    from ragpipe.embedding.embedder import SentenceTransformerEmbedder

                    embedder = SentenceTransformerEmbedder(self.embedder_spec, threads=self.threads)
                self._embedder = embedder
        return self._embedder

    def _embed_query(self, embedder, text: str):
        if getattr(embedder, "thread_safe", False):
            return embedder.embed_query(text)
        with self._embed_lock:
            return embedder.embed_query(text)

    def _plan_for(self, mode: str | None) -> tuple[QueryPlan, str, str]:
        """(plan, mode name, plan ID) for ``mode``, memoised: hashing a plan costs ~0.2 ms."""
        found = self._plans.get(mode)
        if found is None:
            plan, name = self._resolve_plan(mode)
            with self._lock:
                found = self._plans.setdefault(mode, (plan, name, plan.plan_id))
        return found

    def check_mode(self, mode: str | None) -> str:
        """The name of the mode queries in ``mode`` (None: the plan's channels) run in, or the
        ``QueryError`` each such query would raise — for a caller that knows its mode before any
        query runs (an evaluation, before it creates its run)."""
        return self._plan_for(mode)[1]

    def _resolve_plan(self, mode: str | None) -> tuple[QueryPlan, str]:
        if mode is None and self.vector is None and self._vector_refusal is None and "lexical" in self.plan.channels:
            mode = "lexical"  # a lexical-only bundle answers the plan's lexical channel by default
        if mode is None:
            names = tuple(self.plan.channels)
            mode = next((m for m, chans in MODES.items() if set(chans) == set(names)), "+".join(names))
            plan = self.plan
        else:
            if mode not in MODES:
                raise QueryError(f"unknown mode {mode!r} (hybrid, lexical, vector)")
            try:
                plan = self.plan.with_channels(MODES[mode])
            except PlanError as exc:
                raise QueryError(str(exc)) from None
        if "vector" in plan.channels and self.vector is None:
            raise QueryError(
                self._vector_refusal or f"bundle {self.bundle_id} is lexical-only: mode {mode!r} needs a vector index"
            )
        return plan, mode

    def query(
        self,
        text: str,
        subject: Subject | None = None,
        k: int = 10,
        mode: str | None = None,
        trace: bool = False,
        audit: bool = False,
        rankings: bool = False,
        source_roles: tuple[str, ...] | None = None,
        filter: object | None = None,
    ) -> QueryResult:
        """The top ``k`` chunks (or documents, per the plan's ``collapse``) visible to ``subject``:
        exactly ``min(k, matching units)`` hits. ``trace`` adds the subject view of the trace.
        ``audit`` (operator-only, implies ``trace``) adds figures about documents the subject may
        not see; never set it for a query run on a subject's behalf. ``rankings`` keeps the
        channel rankings and the fused list as objects (``QueryResult.rankings``): what the
        trace's ``channels`` and ``fusion.items`` show, at no cost. ``source_roles``: only chunks
        of documents with one of these roles, filtered inside both channels (before their top
        rows, like the scopes); the result names them. ``filter``: a metadata filter (JSON form,
        ``ragpipe.corpus.metadata_filter``) checked against the bundle's fields and applied
        inside both channels likewise; the result names it in canonical form."""
        self._check_request(text, k)
        subject = subject or Subject.default()
        roles = self._check_roles(source_roles)
        plan, mode, plan_id = self._plan_for(mode)
        audience = self.lexical.audience(subject)  # the policy's verdict per scope group
        # checked against the fields of what the subject may see: no refusal names a hidden field
        resolved = None if filter is None else self.filters.resolve(filter, audience.groups)
        selection = None if resolved is None else resolved.selection
        if selection is not None:
            visible_rows = self._selected_rows(audience.groups, roles, selection)
        elif roles:
            visible_rows = sum(self._group_role_rows[(g, r)] for g in audience.groups for r in roles)
        else:
            visible_rows = sum(self._group_rows[g] for g in audience.groups)
        ranked, timings, statistics = self._search_channels(text, plan, subject, k, visible_rows, roles, selection)
        ranked, dropped = recheck(
            ranked,
            lambda document_id: (
                self.lexical.group_of.get(document_id) in audience.admitted
                and (not roles or self.roles.get(document_id) in roles)
                and (selection is None or document_id in selection.documents)
            ),
        )
        fused = fuse(plan, {n: r.ranked for n, r in ranked.items()})
        rerank_trace, ordered = self._rerank(text, plan, fused)
        top = ordered[:k]
        verdicts: dict[tuple[str, ...], bool] = {}  # the policy's verdict per scope set, this query
        evidence = [self._evidence(f, subject, verdicts) for f in top]
        hits = [
            {
                "rank": i,
                "chunk_id": f.chunk_id,
                "document_id": f.document_id,
                "title": ev.title,
                "score": f.score,
                "text": ev.text,
                "byte_start": ev.byte_start,
                "byte_end": ev.byte_end,
                "metadata": shown_metadata(self._metadata[f.document_id]),  # a fresh dict per hit
                "pages": _pages(self._pages.get(f.document_id, ()), ev),
            }
            for i, (f, ev) in enumerate(zip(top, evidence), start=1)
        ]
        result = QueryResult(
            plan_id,
            self.bundle_id,
            mode,
            subject,
            hits,
            evidence=evidence,
            source_roles=roles or None,
            release_id=self.release_id,
            filter=None if resolved is None else resolved.shown(),
            approximate="vector" in plan.channels and self.approximate,
        )
        if rankings:
            result.rankings = Rankings({n: r.ranked for n, r in ranked.items()}, fused[: fused_shown(k)])
        if trace or audit:
            facts = None
            if audit:
                hidden = audience.total_documents - audience.documents
                facts = AuditFacts(hidden, dropped, statistics.as_dict() if statistics else None)
            result.trace = {
                "release_id": self.release_id,  # what was served, bound into the trace (None: a bundle)
                **query_trace(plan, self.policy.policy_id, subject, k, ranked, fused, rerank_trace, timings, facts),
            }
        return result

    def ann_comparison(
        self,
        text: str,
        subject: Subject | None = None,
        k: int = 10,
        source_roles: tuple[str, ...] | None = None,
        filter: object | None = None,
    ) -> AnnComparison:
        """The approximate vector search's top ``k`` rows and exact search's top ``k`` for one query
        (``AnnComparison``): the query embedded once, both searches over the rows ``subject`` may
        see under ``source_roles`` and ``filter``, exactly as ``query``'s vector channel restricts
        them. What ``ann_recall@10`` compares in every evaluation of an approximate plan
        (``ragpipe.evaluation.ann``). ``QueryError`` when this retriever searches exactly."""
        self._check_request(text, k)
        if self._vector_refusal is not None:
            raise QueryError(self._vector_refusal)
        if not self.approximate:
            raise QueryError(f"this Retriever of bundle {self.bundle_id} searches vectors exactly: nothing to compare")
        subject = subject or Subject.default()
        roles = self._check_roles(source_roles)
        audience = self.lexical.audience(subject)
        resolved = None if filter is None else self.filters.resolve(filter, audience.groups)
        selection = None if resolved is None else resolved.selection
        vector = self._embed_query(self.embedder(), text)
        where = Prefilter(subject.scopes, (), roles, selection)
        approximate = self.vector.search(vector, k, where)
        exact = self.vector.exact.search(vector, k, where)
        return AnnComparison(approximate, exact)

    def _check_request(self, text: str, k: int) -> None:
        if self._closed:
            raise QueryError(f"this Retriever of bundle {self.bundle_id} is closed")
        if isinstance(k, bool) or not isinstance(k, int) or k < 1:
            raise QueryError(f"k must be an integer >= 1, got {k!r}")
        if not isinstance(text, str) or not text.strip():
            raise QueryError(EMPTY_QUERY)

    def _selected_rows(self, groups: Collection[tuple[str, ...]], roles: tuple[str, ...], selection: Selection) -> int:
        """The rows a subject seeing ``groups`` may find under ``roles`` and ``selection``: each
        channel's request cap, exact, so no request size depends on rows the subject cannot see."""
        admitted = np.zeros(len(self._group_ids), dtype=bool)
        admitted[[self._group_ids[g] for g in groups if g in self._group_ids]] = True
        rows = selection.rows & admitted[self._row_groups]
        if roles:
            rows &= np.isin(self._row_roles, roles)
        return int(np.count_nonzero(rows))

    @staticmethod
    def _check_roles(source_roles: tuple[str, ...] | None) -> tuple[str, ...]:
        """The roles a query filters on, sorted and deduplicated; () when none is given."""
        if source_roles is None:
            return ()
        if isinstance(source_roles, str) or not source_roles:
            raise QueryError("source_roles must be a non-empty list of role names, or none")
        for role in source_roles:
            if not isinstance(role, str) or not SCOPE_PATTERN.match(role):
                raise QueryError(f"invalid source role {role!r} (letters, digits, . _ : -)")
        return tuple(sorted(set(source_roles)))

    def _search_channels(
        self,
        text: str,
        plan: QueryPlan,
        subject: Subject,
        k: int,
        visible_rows: int,
        roles: tuple[str, ...] = (),
        selection: Selection | None = None,
    ) -> tuple[dict[str, ChannelRanking], dict[str, float], LexicalStatistics | None]:
        """Each channel's top ``max(depth, k)`` units (see ``channels.rank_channel``), asking no
        backend for more than the ``visible_rows`` the subject may see. With both
        channels, the lexical channel runs on a worker thread while the query is embedded
        (onnxruntime releases the GIL while it runs); measured ≈ 0.7 ms faster than running them
        one after the other."""
        timings: dict[str, float] = {}

        def timed(name: str, work: Callable[[], T]) -> T:
            started = time.perf_counter()
            result = work()
            timings[name] = round((time.perf_counter() - started) * 1000, 3)
            return result

        def units(name: str) -> int:
            return max(plan.channels[name].depth, k)

        where = Prefilter(subject.scopes, (), roles, selection)
        ranked: dict[str, ChannelRanking] = {}
        statistics = None
        lexical: Callable[[], ChannelRanking] | None = None
        if "lexical" in plan.channels:
            searcher, statistics = self.lexical.searcher_for(subject)
            backend = LexicalBackend(searcher, text, where, visible_rows)
            lexical = partial(
                timed, "lexical", partial(rank_channel, backend, units("lexical"), plan.collapse, plan.depth_policy)
            )

        if "vector" in plan.channels:
            embedder = self._embedder if self._embedder is not None else timed("embedder_load", self.embedder)

            def vector() -> ChannelRanking:
                backend = VectorBackend(self.vector, self._embed_query(embedder, text), where, visible_rows)
                return rank_channel(backend, units("vector"), plan.collapse, plan.depth_policy)

            if lexical is None:
                ranked["vector"] = timed("vector", vector)
            else:
                pending = self._lexical_worker().submit(lexical)
                try:
                    ranked["vector"] = timed("vector", vector)
                finally:
                    ranked["lexical"] = pending.result()
        elif lexical is not None:
            ranked["lexical"] = lexical()
        return {n: ranked[n] for n in sorted(ranked)}, {n: timings[n] for n in sorted(timings)}, statistics

    def _lexical_worker(self) -> ThreadPoolExecutor:
        worker = self._worker
        if worker is None:
            with self._lock:
                if self._worker is None:
                    self._worker = ThreadPoolExecutor(
                        max_workers=self.channel_workers, thread_name_prefix="ragpipe-lexical"
                    )
                worker = self._worker
        return worker

    def close(self) -> None:
        """Stop the worker threads, the vector searcher and the audience views, and
        drop the hydrated ``Evidence`` cache. Call once no query is in flight (one still running
        may put entries back: harmless, they are immutable); every later query is refused."""
        with self._lock:
            self._closed = True
            worker, self._worker = self._worker, None
            self._hydrated.clear()
        if worker is not None:
            worker.shutdown()
        if self.vector is not None:
            self.vector.close()
        self.lexical.close()

    def _rerank(self, text: str, plan: QueryPlan, fused: list[FusedHit]) -> tuple[dict[str, object], list[FusedHit]]:
        if self.reranker is None:
            return {"used": False}, fused
        return rerank_fused(self.reranker, plan.reranker, text, fused, self.chunks.text, self._rerank_lock)

    def _evidence(self, f: FusedHit, subject: Subject, verdicts: dict[tuple[str, ...], bool]) -> Evidence:
        """Hydrate a hit from the verified chunk table (source authority: the bundle's chunk text,
        never a representation), re-checking that the chunk belongs to the hit's document and that
        its document is visible to ``subject`` — whatever an index row claimed. ``verdicts`` holds
        the policy's verdict per scope set for this query (a k = 1000 query asks about a handful of
        scope sets a thousand times)."""
        evidence = self._hydrated.get(f.chunk_id)
        # Evidence is immutable and depends on the verified chunk and document only, so one object
        # per chunk serves every query (a dict insert is atomic: racing threads at worst build the
        # same value twice); its document is the chunk's.
        chunk = self.chunks[f.chunk_id] if evidence is None else None
        document_id = chunk.document_id if chunk is not None else evidence.document_id  # type: ignore[union-attr]
        if document_id != f.document_id:
            raise AuthorizationError(
                f"index row names document {f.document_id} for chunk {f.chunk_id} of document {document_id}"
            )
        scopes = self.scopes[document_id]
        allowed = verdicts.get(scopes)
        if allowed is None:
            allowed = verdicts[scopes] = self.policy.allows(subject, scopes)
        if not allowed:
            raise AuthorizationError(f"chunk {f.chunk_id} is not visible to {subject.principal}")
        if chunk is not None:
            evidence = self._hydrated.setdefault(
                chunk.chunk_id,
                Evidence(
                    label="",
                    chunk_id=chunk.chunk_id,
                    document_id=chunk.document_id,
                    title=self.titles[chunk.document_id],
                    text=chunk.text,
                    byte_start=chunk.byte_start,
                    byte_end=chunk.byte_end,
                    access_scopes=scopes,
                ),
            )
        return evidence  # type: ignore[return-value]
