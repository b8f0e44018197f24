"""Exact vector search: the project's own definition of a vector score, the same on every CPU.

A search ranks the rows of one bundle by an *exact score* that this module defines, not by
whatever float32 kernels a dependency dispatches to at run time (lance picks AVX-512, AVX2 or
scalar kernels by CPU, and they round differently): the same bundle, plan and query give the same
scores, bit for bit, on every IEEE-754 host. lancedb stays the store of record; exact results never
depend on it.

**The exact score** (``EXACT_SCORES``, named in the query plan, so a change to it is a new plan ID)
of a stored float32 vector x and a float32 query q of d dimensions, in IEEE-754 binary64 with
round-to-nearest-even and gradual underflow:

* every product xᵢ·qᵢ (and xᵢ·xᵢ, qᵢ·qᵢ) is formed in binary64 — exactly: a product of two
  float32 values has at most 48 significant bits and stays inside binary64's range;
* a sum Σ is the left-to-right sum in dimension order, (((p₀ + p₁) + p₂) + … + p_{d−1}), each
  addition rounded once;
* ``dot``: score = Σ xᵢqᵢ; ``cosine``: score = Σ xᵢqᵢ / (√Σ xᵢ² · √Σ qᵢ²); ``l2``: score =
  −Σ (xᵢ − qᵢ)², the difference and its square each a binary64 operation.

Every step is a correctly rounded IEEE operation in a fixed order, so the result does not depend
on SIMD width, FMA, thread count or BLAS: numpy's element-wise ``multiply``, ``subtract``,
``divide``, ``sqrt`` and ``add.accumulate`` (a running sum, sequential by definition) compute
exactly these operations whichever of its CPU-dispatched loops runs
(``ragpipe_tests/index/test_vector_memory.py`` checks it with numpy's dispatch restricted, and
golden scores that every host must reproduce). A score that is not finite (NaN for a zero cosine
query or row; an infinity or NaN from a non-finite component) is never returned.

**Order and ties.** Rows are ranked by (score descending, row ascending): a total order, so ties
never depend on anything but the build order of the rows.

**Verified vectors.** The matrix is read once — from the bundle's ``vectors.arrow``
(``ragpipe.index.vector_file``: no lancedb needed), else from its lance table — and accepted only if
its embeddings digest (``ragpipe.embedding.compute.embeddings_digest`` over the verified rows'
representation IDs and the exact float32 bytes, in row order) equals the digest the bundle manifest
binds (``material.embeddings_digest``, itself covered by the material digest and the seal checked
when the bundle was opened). So the bytes searched are the bytes the manifest names, whatever
happens to the files afterwards; row scopes come from the verified tables, never from the store.

**Speed.** A search first ranks the visible rows by a fast float32 product (any kernel numpy
picks), keeps the rows whose exact score can still reach the top ``k`` — a rigorous error bound
on that product, valid for every summation order with or without FMA — and computes the exact
score of those candidates only (``_candidates``). The fast product only prunes; it never decides
an order. Memory: the float32 matrix (rows × dimensions × 4 bytes) and a float64 norm per row.

Thread-safe without locks: the state is read-only after construction and every search works on
its own arrays.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ragpipe.embedding.compute import embeddings_digest as digest_of_vectors
from ragpipe.index.hits import Hit
from ragpipe.index.predicates import role_predicate, scope_predicate
from ragpipe.index.prefilter import Prefilter
from ragpipe.index.rows import RowScopes

log = logging.getLogger(__name__)

# The name of the exact-score definition above; the query plan names it (``vector_search``), so
# results computed under another definition can never share a plan ID with these.
EXACT_SCORES = "float64_sequential/v1"
METRICS = ("cosine", "dot", "l2")
FLOAT32_ROUNDOFF = 2.0**-24
FLOAT64_ROUNDOFF = 2.0**-53
SMALLEST_SUBNORMAL = 2.0**-149  # float32
# Rows × dimensions per block of exact arithmetic: its float64 temporaries stay near 2 MiB.
BLOCK_ELEMENTS = 2**18
Row = tuple[str, str, str]


class VectorVerificationError(ValueError):
    """The vectors read from the table are not the vectors the bundle manifest binds."""


@dataclass(frozen=True)
class _Tables:
    """Read-only search state; replaced by ``None`` on close (one atomic reference)."""

    matrix: np.ndarray  # (n, d) float32, read-only: the verified vectors
    norms: np.ndarray  # (n,) float64: Euclidean norms (the pruning bound only)
    squares: np.ndarray | None  # (n,) float64: the exact Σ x² per row (cosine's denominators)
    scope_rows: dict[str, np.ndarray]  # scope -> (n,) bool: rows carrying it
    role_rows: dict[str, np.ndarray]  # source role -> (n,) bool: rows of documents with that role
    document_rows: _DocumentRows  # document ID -> its row positions


class MemoryVectorSearcher:
    """Exact search (module docstring) over a verified in-memory matrix.

    ``rows``: (representation_id, chunk_id, document_id) per row, in build order; ``row_scopes``:
    each row's access scopes; ``vectors``: the (rows × dimension) float32 matrix, already verified
    (``verified_vectors``), kept as it is and made read-only; ``row_roles``: each row's document's
    source role."""

    engine = "memory"  # which engine serves (``ragpipe.retrieval.vector_engine``): in no ID
    approximate = False  # every search ranks all visible rows (``vector_ann`` ranks candidates)

    def __init__(
        self,
        metric: str,
        rows: Sequence[Row],
        row_scopes: Sequence[Sequence[str]],
        vectors: np.ndarray,
        row_roles: Sequence[str] | None = None,
    ):
        if metric not in METRICS:
            raise ValueError(f"unknown metric {metric!r} ({', '.join(METRICS)})")
        if len(rows) != len(row_scopes) or len(rows) != len(vectors):
            raise ValueError(f"{len(rows)} rows, {len(row_scopes)} scope lists and {len(vectors)} vectors")
        if row_roles is not None and len(row_roles) != len(rows):
            raise ValueError(f"{len(rows)} rows but {len(row_roles)} source roles")
        if vectors.ndim != 2 or vectors.shape[1] < 1:
            raise ValueError(f"vectors have shape {vectors.shape}, not (rows, dimensions)")
        self.metric, self.rows = metric, rows
        self.dimension = vectors.shape[1]
        self.why = "exact, in memory (opened directly)"  # open_vector_searcher says where from
        # kept, not copied (a million rows are 1.5 GB): the caller hands the matrix over
        matrix = np.ascontiguousarray(vectors, dtype=np.float32)
        matrix.setflags(write=False)
        squares = _row_squares(matrix)
        self._tables: _Tables | None = _Tables(
            matrix=matrix,
            norms=np.sqrt(squares),
            squares=squares if metric == "cosine" else None,
            scope_rows=_scope_rows(row_scopes),
            role_rows=_role_rows(row_roles) if row_roles is not None else {},
            document_rows=_document_rows(rows),
        )

    def search(
        self,
        vector: np.ndarray,
        k: int,
        where: Prefilter,
    ) -> list[Hit]:
        """The ``k`` best rows ``where`` lets through (``index.prefilter``: applied before the top
        ``k``) by exact score; scope and role names are checked as the lancedb prefilter checks them
        (``ValueError``). Order: score descending, then row; rows whose score is not finite are left out."""
        tables = self._tables_or_closed()  # one reference: a search finishes on the state it started with
        prepared = self._prepare(tables, vector, k, where)
        if prepared is None:
            return []
        chosen, scores = self._best(tables, *prepared, k)
        return self._hits(chosen, scores)

    def prepare(
        self,
        vector: np.ndarray,
        k: int,
        where: Prefilter,
    ) -> tuple[np.ndarray, np.ndarray] | None:
        """A search's arguments checked as ``search`` checks them: (the float32 query, the
        ascending positions of the visible rows), or None when no row is visible."""
        return self._prepare(self._tables_or_closed(), vector, k, where)

    def _prepare(
        self,
        tables: _Tables,
        vector: np.ndarray,
        k: int,
        where: Prefilter,
    ) -> tuple[np.ndarray, np.ndarray] | None:
        if not where.scopes:
            return None
        scope_predicate(where.scopes)  # the same validation, and error, as the lancedb prefilter
        if where.source_roles:
            role_predicate(where.source_roles)
            if not tables.role_rows and self.rows:
                raise ValueError("this searcher was opened without source roles: it cannot filter on them")
        if k < 1:
            raise ValueError(f"Invalid input, k must be positive (got {k})")
        query = np.asarray(vector, dtype=np.float32).reshape(-1)
        if query.shape[0] != self.dimension:
            raise ValueError(f"query has {query.shape[0]} dimensions, the vectors {self.dimension}")
        if where.selection is not None and len(where.selection.rows) != len(self.rows):
            raise ValueError(f"selection covers {len(where.selection.rows)} rows, this searcher has {len(self.rows)}")
        visible = _visible(tables, where)
        return None if visible.size == 0 else (query, visible)

    def ranked(self, query: np.ndarray, candidates: np.ndarray, k: int) -> list[Hit]:
        """The ``k`` best of the ``candidates`` rows (distinct positions among ``prepare``'s
        visible rows) by exact score: the ranking rule and tie order of ``search`` applied to a
        subset, with the same score bits for the same row and query."""
        return self._hits(*self._rank(self._tables_or_closed(), query, candidates, k))

    def _hits(self, chosen: np.ndarray, scores: np.ndarray) -> list[Hit]:
        rows = self.rows
        return [Hit("vector", *rows[i], s) for i, s in zip(chosen.tolist(), scores.tolist())]

    def _tables_or_closed(self) -> _Tables:
        tables = self._tables
        if tables is None:
            raise RuntimeError("vector searcher is closed")
        return tables

    def _best(self, tables: _Tables, query: np.ndarray, visible: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        """(rows, exact scores) of the ``k`` best of ``visible``, by (score descending, row)."""
        # a zero or non-finite query or row gives NaN or infinite scores: no warnings for them
        with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
            candidates = _candidates(self.metric, tables, query, visible, k) if k < visible.size else visible
        return self._rank(tables, query, candidates, k)

    def _rank(
        self, tables: _Tables, query: np.ndarray, candidates: np.ndarray, k: int
    ) -> tuple[np.ndarray, np.ndarray]:
        """(rows, exact scores) of the ``k`` best ``candidates``, by (score descending, row)."""
        with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
            scores = _exact_in_blocks(self.metric, tables, query, candidates)
        kept = np.isfinite(scores)  # a hit's score is a number: NaN and infinities are no ranking
        candidates, scores = candidates[kept], scores[kept]
        order = np.lexsort((candidates, -scores))[:k]
        return candidates[order], scores[order]

    def close(self) -> None:
        """Drop the matrix; later searches raise ``RuntimeError``. A search already running
        finishes on the state it started with."""
        self._tables = None


# --- the exact score (module docstring) -------------------------------------------------------


def exact_scores(metric: str, rows: np.ndarray, query: np.ndarray, row_squares: np.ndarray | None = None) -> np.ndarray:
    """The exact scores (float64) of the float32 ``rows`` (m × d) against the float32 ``query``
    (d), as the module docstring defines them. ``row_squares``: the rows' exact Σ x² if known
    (cosine; computed otherwise)."""
    # (d, m) layout: the running sum over dimensions is one element-wise addition per dimension,
    # across all rows at once (``np.add.accumulate`` along axis 0 is that sequence of additions)
    terms = np.asarray(rows, dtype=np.float32).T.astype(np.float64, order="C")
    q = np.asarray(query, dtype=np.float32).astype(np.float64)[:, None]
    if metric == "l2":
        np.subtract(terms, q, out=terms)
        np.multiply(terms, terms, out=terms)
        return -_running_sum(terms)
    if metric == "cosine" and row_squares is None:
        row_squares = _running_sum(terms * terms)
    np.multiply(terms, q, out=terms)
    dots = _running_sum(terms)
    if metric == "dot":
        return dots
    query_squares = _running_sum(q * q)[0]
    return dots / (np.sqrt(row_squares) * np.sqrt(query_squares))


def _running_sum(terms: np.ndarray) -> np.ndarray:
    """Σ over axis 0 of the (d, m) float64 ``terms``, left to right: ``terms[0] + terms[1] + …``."""
    if terms.shape[0] == 1:
        return terms[0].copy()
    return np.add.accumulate(terms, axis=0)[-1]


def _row_squares(matrix: np.ndarray) -> np.ndarray:
    """The exact Σ x² of every row (cosine's denominators; their roots bound the pruning), in
    blocks of rows."""
    per_block = max(1, BLOCK_ELEMENTS // matrix.shape[1])
    out = np.empty(len(matrix), dtype=np.float64)
    with np.errstate(over="ignore", invalid="ignore"):
        for start in range(0, len(matrix), per_block):
            terms = matrix[start : start + per_block].T.astype(np.float64, order="C")
            out[start : start + per_block] = _running_sum(np.multiply(terms, terms, out=terms))
    out.setflags(write=False)
    return out


def _exact_in_blocks(metric: str, tables: _Tables, query: np.ndarray, candidates: np.ndarray) -> np.ndarray:
    """``exact_scores`` of the ``candidates`` rows, computed in blocks of rows (bounded temporaries)."""
    scores = np.empty(candidates.size, dtype=np.float64)
    per_block = max(1, BLOCK_ELEMENTS // tables.matrix.shape[1])
    for start in range(0, candidates.size, per_block):
        part = candidates[start : start + per_block]
        squares = tables.squares[part] if tables.squares is not None else None
        scores[start : start + part.size] = exact_scores(metric, tables.matrix[part], query, squares)
    return scores


def _candidates(metric: str, tables: _Tables, query: np.ndarray, visible: np.ndarray, k: int) -> np.ndarray:
    """The ``visible`` rows whose exact score may rank in the top ``k``: those whose upper bound
    is at least the ``k``-th largest lower bound, and every row whose estimate is not finite.

    The estimate is a float32 product in whatever order and with whatever FMA use numpy's kernels
    pick. Any float32 evaluation of a d-term dot product is within γ₃₂·Σ|xᵢqᵢ| + d·2⁻¹⁴⁹ of the
    real value (γ₃₂ = d·u / (1 − d·u), u = 2⁻²⁴; the second term covers gradual underflow), and
    Σ|xᵢqᵢ| ≤ ‖x‖‖q‖; the exact score is within γ₆₄·Σ|xᵢqᵢ| of it, and its norms and divisions
    within a few binary64 roundings. The bounds below are those sums, doubled for margin. The
    ``k`` rows with the largest lower bounds score at least the ``k``-th largest lower bound, so
    every row of the exact top ``k`` — ties included — has an upper bound at least that large."""
    matrix = tables.matrix
    dimension = matrix.shape[1]
    gamma32 = dimension * FLOAT32_ROUNDOFF / (1 - dimension * FLOAT32_ROUNDOFF)
    gamma64 = (dimension + 4) * FLOAT64_ROUNDOFF / (1 - (dimension + 4) * FLOAT64_ROUNDOFF)
    block = matrix if visible.size * 4 > len(matrix) else matrix[visible]
    # einsum, not BLAS: OpenBLAS hands a matrix-vector product of this size to a second thread,
    # and on 2 busy cores waking it costs more (milliseconds at times) than the product itself
    products = np.einsum("ij,j->i", block, query).astype(np.float64)
    if block is matrix:
        products = products[visible]
    query_norm = float(np.linalg.norm(query.astype(np.float64)))
    norms = tables.norms[visible]
    scale = query_norm * norms
    tiny = 2 * dimension * SMALLEST_SUBNORMAL
    if metric == "cosine":
        estimate = products / scale
        error = 2 * (gamma32 + 8 * gamma64) + 2 * tiny / scale
    elif metric == "dot":
        estimate = products
        error = 2 * (gamma32 + gamma64) * scale + 2 * tiny
    else:
        estimate = 2.0 * products - query_norm**2 - norms**2
        error = 4 * gamma32 * scale + 4 * tiny + 16 * gamma64 * (query_norm + norms) ** 2
    lower, upper = estimate - error, estimate + error
    finite = np.isfinite(lower) & np.isfinite(upper)
    if np.count_nonzero(finite) <= k:
        return visible
    threshold = np.partition(lower[finite], -k)[-k]
    return visible[~finite | (upper >= threshold)]


# --- verified vectors and opening -------------------------------------------------------------


def verified_vectors(rows: Sequence[Row], vectors: np.ndarray, expected_digest: str | None) -> np.ndarray:
    """``vectors`` as float32, after checking that they are exactly the vectors the manifest's
    ``expected_digest`` binds to the representation IDs of ``rows``, row by row
    (``VectorVerificationError`` otherwise)."""
    matrix = np.ascontiguousarray(vectors, dtype=np.float32)
    if matrix.ndim != 2 or len(matrix) != len(rows):
        raise VectorVerificationError(f"{matrix.shape} vectors for {len(rows)} rows")
    actual = digest_of_vectors([r[0] for r in rows], matrix)
    if actual != expected_digest:
        raise VectorVerificationError(
            f"vector: embeddings digest {actual} of the vectors read differs from the manifest's {expected_digest}"
        )
    return matrix


def open_vector_searcher(
    directory: Path,
    metric: str,
    rows: Sequence[Row],
    *,
    row_scopes: Sequence[Sequence[str]],
    embeddings_digest: str | None,
    vectors: np.ndarray | None = None,
    row_roles: Sequence[str] | None = None,
    before_lance: Callable[[], None] | None = None,
) -> MemoryVectorSearcher:
    """The exact searcher of one verified bundle, over vectors verified against
    ``embeddings_digest`` (the manifest's ``material.embeddings_digest``;
    ``VectorVerificationError`` when they differ). ``vectors``: the matrix, if the caller holds it
    (the bundle's ``vectors.arrow``); otherwise it is read once from the lance table in
    ``directory``, after ``before_lance`` (the bundle's deferred check of that table). The
    searcher's ``why`` says, in words, what serves and from where."""
    source = "vectors.arrow"
    if vectors is None:
        if before_lance is not None:
            before_lance()
        from ragpipe.index.vector import VectorSearcher  # lancedb: seconds of imports

        table = VectorSearcher(directory, metric, rows)
        try:
            vectors = table.read_vectors()
        finally:
            table.close()
        source = "the lance table (this bundle has no vectors.arrow)"
    matrix = verified_vectors(rows, vectors, embeddings_digest)
    searcher = MemoryVectorSearcher(metric, rows, row_scopes, matrix, row_roles)
    searcher.why = (
        f"exact scores ({EXACT_SCORES}) in memory: {len(rows):,} vectors of {matrix.shape[1]} dimensions, "
        f"{_size(matrix.nbytes)}, read from {source}"
    )
    return searcher


def _size(size: int) -> str:
    """``7,680 bytes``; ``33,554,432 bytes (32.0 MiB)`` from a MiB up."""
    return f"{size:,} bytes" + (f" ({size / 2**20:.1f} MiB)" if size >= 2**20 else "")


# --- scopes ---------------------------------------------------------------------------------


def _scope_rows(row_scopes: Sequence[Sequence[str]]) -> dict[str, np.ndarray]:
    """Per scope, the (read-only) mask of the rows carrying it — from each distinct scope tuple,
    not row by row."""
    rows = RowScopes.of(row_scopes)
    masks: dict[str, np.ndarray] = {}
    for scope in sorted(rows.scopes()):
        mask = np.zeros(len(rows), dtype=bool)
        mask[rows.rows_with(scope)] = True
        mask.setflags(write=False)
        masks[scope] = mask
    return masks


def _role_rows(row_roles: Sequence[str]) -> dict[str, np.ndarray]:
    """Per source role, the (read-only) mask of the rows of documents with that role."""
    codes: dict[str, int] = {}
    at = np.fromiter((codes.setdefault(r, len(codes)) for r in row_roles), dtype=np.int64, count=len(row_roles))
    masks = {}
    for role, code in codes.items():
        mask = at == code
        mask.setflags(write=False)
        masks[role] = mask
    return masks


class _DocumentRows:
    """Document ID -> its row positions (ascending), for excluding documents: one position per
    document in a dictionary and the rows grouped by document in two arrays — not one numpy array
    object per document (a million documents would cost ~100 MB more)."""

    def __init__(self, rows: Sequence[Row]):
        self._at: dict[str, int] = {}
        documents = np.fromiter(
            (self._at.setdefault(document_id, len(self._at)) for _, _, document_id in rows),
            dtype=np.int64,
            count=len(rows),
        )
        self._order = np.argsort(documents, kind="stable")
        self._starts = np.searchsorted(documents[self._order], np.arange(len(self._at) + 1))

    def get(self, document_id: str) -> np.ndarray | None:
        at = self._at.get(document_id)
        return None if at is None else self._order[self._starts[at] : self._starts[at + 1]]


def _document_rows(rows: Sequence[Row]) -> _DocumentRows:
    return _DocumentRows(rows)


def _visible(tables: _Tables, where: Prefilter) -> np.ndarray:
    """Positions (ascending) of the rows ``where`` lets through."""
    masks = [m for s in set(where.scopes) if (m := tables.scope_rows.get(s)) is not None]
    if not masks:
        return np.empty(0, dtype=np.intp)
    visible = np.logical_or.reduce(masks) if len(masks) > 1 else masks[0].copy()
    if where.source_roles:
        roles = [m for r in set(where.source_roles) if (m := tables.role_rows.get(r)) is not None]
        if not roles:
            return np.empty(0, dtype=np.intp)
        visible &= np.logical_or.reduce(roles) if len(roles) > 1 else roles[0]
    if where.selection is not None:
        visible &= where.selection.rows
    for document_id in where.exclude_documents:
        positions = tables.document_rows.get(document_id)
        if positions is not None:
            visible[positions] = False
    return np.flatnonzero(visible)
