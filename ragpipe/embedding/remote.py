"""A remote embedder (``embedder.provider: litellm``): documents at build time, queries at search time.

Both sides call the one adapter, ``ragpipe.work.embed.embed_batch`` (one request per batch; typed
failures; usage and cost), put the spec's document or query prefix before each text, and — with
``normalize: true`` — scale each vector to unit length in a fixed, host-independent way
(``normalize_rows``), so the same server output always gives bit-identical stored vectors.

* **Build**: ``RemoteEmbeddingStep`` is the ``embed`` step of ``ragpipe.work.runner`` — cached by
  (embedder spec ID, text digest) in the embedding cache like a local model's vectors, batched,
  rate-limited, retried and budgeted by ``execution.embedding`` (``ragpipe.embedding.compute``).
* **Query**: ``RemoteEmbedder.embed_query`` embeds the query through the same provider, model and
  endpoint (the bundle's embedder spec names them), retried under ``QUERY_POLICY``; each vector is
  kept **in memory** per embedder (so per ``Retriever``), keyed by (embedder spec ID, query-text
  digest), least recently used dropped past ``query_cache_size`` — never on disk: a query is a
  user's text, and a served process should not leave a trail of them.
"""

from __future__ import annotations

import math
import threading
import time
from collections import OrderedDict

import numpy as np

from ragpipe.embedding.embedder import EmbedderError
from ragpipe.kernel.ids import bytes_digest
from ragpipe.spec import EmbedderSpec, own_spec_id
from ragpipe.work.embed import embed_batch, worst_cost
from ragpipe.work.failures import StepFailure
from ragpipe.work.keys import step_key
from ragpipe.work.policy import ExecutionPolicy
from ragpipe.work.runner import Done, run_step
from ragpipe.work.usage import PriceError, PriceTable, Usage, UsageTotals, load_prices

# A query waits for at most three attempts and short pauses (a Retry-After is capped at 5 s).
QUERY_POLICY = ExecutionPolicy(concurrency=1, batch_size=1, max_attempts=3, backoff_seconds=0.5, max_backoff_seconds=5)
QUERY_TIMEOUT_SECONDS = 30.0


def normalize_rows(matrix: np.ndarray) -> np.ndarray:
    """Each row scaled to unit L2 length, float32, the same bits on every host: the squares of
    float32 values are exact in float64, ``math.fsum`` sums them correctly rounded, and the square
    root, the division and the rounding to float32 are single IEEE operations — no SIMD-dependent
    summation order anywhere. ``ValueError`` for a zero row (it has no direction)."""
    wide = np.asarray(matrix, dtype=np.float32).astype(np.float64)
    out = np.empty(wide.shape, dtype=np.float32)
    for i, row in enumerate(wide):
        norm = math.sqrt(math.fsum((row * row).tolist()))
        if norm == 0.0:
            raise ValueError(f"input {i}: a zero vector cannot be normalised")
        out[i] = (row / norm).astype(np.float32)
    return out


class RemoteEmbedder:
    """``Embedder`` over a litellm endpoint (module docstring). Safe for concurrent calls."""

    thread_safe = True

    def __init__(
        self,
        spec: EmbedderSpec,
        *,
        timeout_seconds: float = QUERY_TIMEOUT_SECONDS,
        prices: PriceTable | None = None,
        query_policy: ExecutionPolicy = QUERY_POLICY,
        query_cache_size: int = 4096,
    ):
        if not spec.remote:
            raise EmbedderError(f"embedder {spec.label!r} is not a remote (litellm) embedder")
        self.spec = spec
        self.dimensions = spec.dimensions
        self.spec_id = own_spec_id("embeddings", spec)
        self.timeout_seconds = timeout_seconds
        self.prices = prices if prices is not None else _prices_or_none()
        self.query_policy = query_policy
        self.query_cache_size = query_cache_size
        self._queries: OrderedDict[str, np.ndarray] = OrderedDict()
        self._lock = threading.Lock()
        self.query_usage = UsageTotals()  # what the query side's calls cost (cache hits cost nothing)

    def call(self, texts: list[str]) -> tuple[np.ndarray, Usage]:
        """One request for ``texts`` as given (prefixes already applied): float32 vectors,
        normalised if the spec says so, and the call's usage. Raises ``StepFailure``."""
        reply = embed_batch(
            self.spec.model or "",
            texts,
            dimensions=self.spec.dimensions,
            send_dimensions=self.spec.send_dimensions,
            api_base=self.spec.api_base,
            timeout=self.timeout_seconds,
            prices=self.prices,
        )
        if not self.spec.normalize:
            return reply.vectors, reply.usage
        try:
            return normalize_rows(reply.vectors), reply.usage
        except ValueError as exc:
            raise StepFailure("invalid_output", str(exc), detail="embedding:zero_vector", usage=reply.usage) from None

    def embed(self, texts: list[str]) -> np.ndarray:
        """Documents (with the document prefix) in one request; ``EmbedderError`` on a failure."""
        prefix = self.spec.document_prefix
        try:
            return self.call([prefix + t for t in texts])[0]
        except StepFailure as failure:
            raise EmbedderError(self._failure_text(failure.kind, failure.detail, failure.message, 1)) from None

    def embed_query(self, text: str) -> np.ndarray:
        """The query's vector (with the query prefix), from memory or one request retried under
        ``query_policy``; ``EmbedderError`` (one line: endpoint, kind, detail) when it fails."""
        key = step_key("embed.query", 1, {"embedder": str(self.spec_id), "text": bytes_digest(text.encode("utf-8"))})
        values, report = run_step(_QueryStep(self), [(key, text)], _QueryVectors(self), self.query_policy)
        with self._lock:
            self.query_usage = self.query_usage.merge(report.usage)
        if key in values:
            return values[key]
        failure = report.failures[0]
        raise EmbedderError(self._failure_text(failure.kind, failure.detail, failure.message, failure.attempts))

    def _failure_text(self, kind: str, detail: str, message: str, attempts: int) -> str:
        return (
            f"embedder {self.spec.model} at {self.spec.endpoint}: {kind} ({detail}) after {attempts} attempt(s): "
            f"{message}"
        )


def _prices_or_none() -> PriceTable:
    """The price table; an unreadable one is an empty table (every cost unknown), never a refusal
    to embed: the query side spends no budget."""
    try:
        return load_prices()
    except PriceError:
        return PriceTable.model_validate({"schema": "ragpipe.prices/v1", "models": {}})


class _QueryStep:
    name = "embed.query"

    def __init__(self, embedder: RemoteEmbedder):
        self.embedder = embedder

    def compute(self, texts: list[str]) -> list[Done[np.ndarray]]:
        prefix = self.embedder.spec.query_prefix
        vectors, usage = self.embedder.call([prefix + t for t in texts])
        return [Done(v, usage) for v in vectors]

    def worst_cost(self, texts: list[str]) -> int | None:
        return None  # the query side has no budget


class _QueryVectors:
    """The in-memory query-vector cache of one embedder (an ``EntryStore``), LRU-bounded."""

    def __init__(self, embedder: RemoteEmbedder):
        self.embedder = embedder

    def lookup(self, keys: set[str]) -> dict[str, np.ndarray]:
        found = {}
        with self.embedder._lock:
            for key in keys:
                if key in self.embedder._queries:
                    self.embedder._queries.move_to_end(key)
                    found[key] = self.embedder._queries[key]
        return found

    lookup_new = lookup

    def commit(self, entries: list[tuple[str, np.ndarray]]) -> None:
        cache, bound = self.embedder._queries, self.embedder.query_cache_size
        with self.embedder._lock:
            for key, vector in entries:
                vector = np.array(vector, dtype=np.float32)  # its own read-only copy
                vector.setflags(write=False)
                cache[key] = vector
                cache.move_to_end(key)
            while len(cache) > bound:
                cache.popitem(last=False)


class RemoteEmbeddingStep:
    """The build's ``embed`` step for a remote embedder (``ragpipe.work.runner.Step``): one
    request per batch of texts, each text with the document prefix."""

    name = "embed"
    budget_setting = "execution.embedding.budget_micros"

    def __init__(self, embedder: RemoteEmbedder):
        self.embedder = embedder
        self.encode_seconds = 0.0
        self._lock = threading.Lock()

    def _prefixed(self, texts: list[str]) -> list[str]:
        prefix = self.embedder.spec.document_prefix
        return [prefix + t for t in texts] if prefix else list(texts)

    def compute(self, texts: list[str]) -> list[Done[np.ndarray]]:
        t0 = time.perf_counter()
        try:
            vectors, usage = self.embedder.call(self._prefixed(texts))
        finally:
            with self._lock:
                self.encode_seconds += time.perf_counter() - t0
        return [Done(v, usage) for v in vectors]

    def worst_cost(self, texts: list[str]) -> int | None:
        return worst_cost(self.embedder.spec.model or "", self._prefixed(texts), self.embedder.prices)
