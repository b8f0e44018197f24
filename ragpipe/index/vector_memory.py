"""Exact vector search from verified vectors held in memory: lancedb's results, bit for bit.

lancedb stays the store of record and the engine for large tables; ``open_vector_searcher`` serves
a bundle whose vectors fit ``memory_limit_bytes`` (rows × dimensions × 4) from memory instead, which
removes lancedb's fixed per-query cost (query planning, its thread pool, the event-loop hop).

**Verified vectors.** The matrix is read once — from the bundle's ``vectors.arrow``
(``ragpipe.index.vector_file``: no lancedb needed), else from its lance table — and accepted only if
its embeddings digest (``ragpipe.embedding.compute.embeddings_digest`` over the verified rows'
representation IDs and the exact float32 bytes, in row order) equals the digest the bundle manifest
binds (``material.embeddings_digest``, itself covered by the material digest and the seal checked
when the bundle was opened). So the bytes searched are the bytes the manifest names, whatever
happens to the files afterwards; row scopes come from the verified tables, never from the store.

**Same results as lancedb.** A search returns exactly what ``VectorSearcher.search`` returns: the
same rows and the same float32 distances, to the last bit (so the same ``Hit`` scores), because it
evaluates the same float32 arithmetic lance does. lance 13 (in lancedb 0.40) on an AVX-512 host
computes:

* flat scan (tables below ``IVF_MIN_ROWS``): ``dot`` = 1 − Σ with 16 lane sums of rounded products
  added in order, then the lanes added in order; ``l2`` = the same sum over rounded squared
  differences; ``cosine`` = 1 − xy / ‖q‖ / ‖v‖ where xy, ‖q‖², ‖v‖² are 16-lane fused
  multiply-add accumulations reduced as a tree (8+8, 4+4, 2+2, 1+1);
* IVF_FLAT with every partition probed: ``dot`` = 1 − the fused 16-lane dot; ``l2`` = the fused
  16-lane sum of squared differences; ``cosine`` = the fused cosine of the query and the rows each
  first normalised (x / √(Σ x² added in order), in float32) — lance normalises for a cosine index.

The fused accumulations are computed exactly: products of float32 values are exact in float64, and
each accumulation step is rounded to float32 once, as a hardware FMA does (a float64 sum that could
round twice — it lies on a float32 midpoint — is recomputed with round-to-odd). Since the kernels
are an implementation detail of lance, ``open_vector_searcher`` *calibrates* before serving: it
asks lancedb and memory for the nearest ``CALIBRATION_ROWS`` rows of a few probe queries and
serves from memory only if every distance is bitwise equal; otherwise (another lance version, a host without
AVX-512) lancedb serves. The outcome is recorded per bundle material, metric, library versions and
CPU (``ragpipe.index.engine_calibration``), so a later open of the same bundle on the same host
serves from memory without importing lancedb at all. Dimensions must be a multiple of 16 above 16
(lance picks other kernels for the rest), components finite and at most 2⁴⁰ in magnitude (no
overflow), cosine rows non-zero; otherwise lancedb serves. Gradual underflow is assumed, as lance and numpy use it
(no flush-to-zero mode in the calling thread).

**Order and ties.** Rows are ordered by (distance, row). That is lancedb's flat-scan order
exactly, ties included; through IVF_FLAT lancedb orders tied rows by row too but, when a tie spans
the ``k``-th place, which of the tied rows it returns depends on its partitions. The vector
channel does not depend on that choice (``ragpipe.retrieval.channels``: only hits scoring strictly
above the lowest returned score are trusted), so channel rankings are identical either way
(``ragpipe_tests/index/test_vector_memory.py``).

**Speed.** A search ranks visible rows by a float32 product (single-threaded), keeps the rows
whose exact distance can reach the top ``k`` (a rigorous error bound on that product), and
computes lance's exact distances for those candidates only.

Thread-safe without locks: the state is read-only after construction and every search works on
its own arrays and its own thread's scratch buffers.
"""

from __future__ import annotations

import logging
import math
import threading
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from ragpipe.embedding.compute import embeddings_digest as digest_of_vectors
from ragpipe.index.engine_calibration import Calibration, CalibrationRecords, calibration_key, host_has_avx512
from ragpipe.index.hits import Hit
from ragpipe.index.ivf import ivf_partitions
from ragpipe.index.predicates import role_predicate, scope_predicate
from ragpipe.index.selection import Selection

if TYPE_CHECKING:  # lancedb is imported only when it serves
    from ragpipe.index.vector import VectorSearcher

log = logging.getLogger(__name__)

# Served from memory up to this many bytes of float32 vectors (rows × dimensions × 4): 32 MiB is
# 21,845 rows of 384 dimensions, where a search still costs well under lancedb's (docs/retrieval.md).
# Operational: it changes which engine serves, never a result.
DEFAULT_MEMORY_LIMIT_BYTES = 32 * 2**20
LANES = 16
UNIT_ROUNDOFF = 2.0**-24  # float32
# Larger components could overflow float32 products and sums (lance's too).
MAX_MAGNITUDE = 2.0**40
SMALLEST_SUBNORMAL = 2.0**-149  # float32
PROBES = 3
CALIBRATION_ROWS = 256
# Rows × dimensions per block of a search's arithmetic: its float64 temporaries (≈ 20 bytes per
# element) stay around 5 MB per thread, reused from one search to the next.
BLOCK_ELEMENTS = 2**18
Row = tuple[str, str, str]
_SCRATCH = threading.local()


class VectorVerificationError(ValueError):
    """The vectors read from the table are not the vectors the bundle manifest binds."""


@dataclass(frozen=True)
class _Tables:
    """Read-only search state; replaced by ``None`` on close (one atomic reference)."""

    operand: np.ndarray  # (n, d) float32: the rows as lance scores them (normalised for an IVF cosine)
    norms: np.ndarray  # (n,) float64: Euclidean norms of ``operand`` rows
    squares: np.ndarray | None  # (n,) float32: lance's fused Σ x² per row (cosine only)
    scope_rows: dict[str, np.ndarray]  # scope -> (n,) bool: rows carrying it
    role_rows: dict[str, np.ndarray]  # source role -> (n,) bool: rows of documents with that role
    document_rows: dict[str, np.ndarray]  # document ID -> its row positions


class MemoryVectorSearcher:
    """``VectorSearcher.search``'s results from a verified in-memory matrix (module docstring).

    ``rows``: (representation_id, chunk_id, document_id) per row, in build order; ``row_scopes``:
    each row's access scopes; ``vectors``: the (rows × dimension) float32 matrix, already verified
    (``verified_vectors``); ``indexed``: whether lancedb searches this table through IVF_FLAT
    (the arithmetic differs, see the module docstring)."""

    def __init__(
        self,
        metric: str,
        rows: Sequence[Row],
        row_scopes: Sequence[Sequence[str]],
        vectors: np.ndarray,
        indexed: bool,
        row_roles: Sequence[str] | None = None,
    ):
        if metric not in ("cosine", "dot", "l2"):
            raise ValueError(f"unknown metric {metric!r} (cosine, dot, l2)")
        if len(rows) != len(row_scopes) or len(rows) != len(vectors):
            raise ValueError(f"{len(rows)} rows, {len(row_scopes)} scope lists and {len(vectors)} vectors")
        if row_roles is not None and len(row_roles) != len(rows):
            raise ValueError(f"{len(rows)} rows but {len(row_roles)} source roles")
        problem = memory_problem(metric, vectors)
        if problem is not None:
            raise ValueError(problem)
        self.metric, self.indexed, self.rows = metric, indexed, rows
        self.dimension = vectors.shape[1]
        self.engine = "memory"
        self.why = "in memory (opened directly)"  # open_vector_searcher says why it chose this engine
        operand = np.ascontiguousarray(vectors, dtype=np.float32)
        if metric == "cosine" and indexed:
            operand = _normalized(operand)
        squares = _fused_squares(operand) if metric == "cosine" else None
        self._tables: _Tables | None = _Tables(
            operand=operand,
            norms=np.linalg.norm(operand.astype(np.float64), axis=1),
            squares=squares,
            scope_rows=_scope_rows(row_scopes),
            role_rows=_scope_rows([(r,) for r in row_roles]) if row_roles is not None else {},
            document_rows=_document_rows(rows),
        )

    def search(
        self,
        vector: np.ndarray,
        k: int,
        scopes: tuple[str, ...],
        exclude_documents: Collection[str] = (),
        source_roles: tuple[str, ...] = (),
        selection: Selection | None = None,
    ) -> list[Hit]:
        """The ``k`` nearest rows visible to ``scopes`` (none for no scopes), skipping the rows
        of ``exclude_documents`` (and of documents another role or a ``selection`` leaves out);
        every filter applies before the top ``k``, as in lancedb. A row is
        visible if its scopes intersect ``scopes``; scope names are checked as in lancedb's
        prefilter (``ValueError``). Order: distance, then row."""
        tables = self._tables
        if tables is None:
            raise RuntimeError("vector searcher is closed")
        if not scopes:
            return []
        scope_predicate(scopes)  # the same validation, and error, as the lancedb prefilter
        if source_roles:
            role_predicate(source_roles)
            if not tables.role_rows and self.rows:
                raise ValueError("this searcher was opened without source roles: it cannot filter on them")
        if k < 1:
            raise ValueError(f"Invalid input, k must be positive (got {k})")
        query = np.asarray(vector, dtype=np.float32).reshape(-1)
        if query.shape[0] != self.dimension:
            raise ValueError(f"query has {query.shape[0]} dimensions, the vectors {self.dimension}")
        if selection is not None and len(selection.rows) != len(self.rows):
            raise ValueError(f"selection covers {len(selection.rows)} rows, this searcher has {len(self.rows)}")
        visible = _visible(tables, scopes, exclude_documents, source_roles, selection)
        if visible.size == 0:
            return []
        chosen, distances = self._nearest(tables, query, visible, k)
        # cosine/dot distances are 1 - similarity; l2 is a distance: negate so higher is better.
        # The same float64 operations as VectorSearcher (offset + sign * d: 0.0 - 0.0 is +0.0)
        sign, offset = (-1.0, 0.0) if self.metric == "l2" else (-1.0, 1.0)
        scores = offset + sign * distances.astype(np.float64)
        rows = self.rows
        return [Hit("vector", *rows[i], s) for i, s in zip(chosen.tolist(), scores.tolist())]

    def _nearest(
        self, tables: _Tables, query: np.ndarray, visible: np.ndarray, k: int
    ) -> tuple[np.ndarray, np.ndarray]:
        """(rows, float32 distances) of the ``k`` nearest of ``visible``, by (distance, row)."""
        # a zero (or non-finite) query gives NaN distances, as in lance: no warnings for them
        with np.errstate(invalid="ignore", divide="ignore"):
            if self.metric == "cosine" and self.indexed:
                query = _normalized(query[None, :])[0]
            candidates = visible
            if k < visible.size and _in_range(query):
                candidates = _candidates(self.metric, tables, query, visible, k)
            distances = self._distances(tables, query, candidates)
        finite = ~np.isnan(distances)  # lance drops rows whose distance is NaN (a zero cosine query)
        candidates, distances = candidates[finite], distances[finite]
        order = np.lexsort((candidates, distances))[:k]
        return candidates[order], distances[order]

    def _distances(self, tables: _Tables, query: np.ndarray, candidates: np.ndarray) -> np.ndarray:
        """lance's float32 distances from ``query`` to the ``candidates`` rows, computed in blocks
        of rows whose temporaries stay in per-thread scratch buffers (cache-sized; allocating them
        afresh each search costs more than the arithmetic)."""
        distances = np.empty(candidates.size, dtype=np.float32)
        per_block = max(1, BLOCK_ELEMENTS // self.dimension)
        for start in range(0, candidates.size, per_block):
            part = candidates[start : start + per_block]
            # one spare row: the cosine query's own Σ q² rides along in the same fused product
            block = _scratch("block", (part.size + 1, self.dimension), np.float32)
            np.take(tables.operand, part, axis=0, out=block[:-1])
            distances[start : start + part.size] = self._block_distances(tables, query, block, part)
        return distances

    def _block_distances(self, tables: _Tables, query: np.ndarray, block: np.ndarray, part: np.ndarray) -> np.ndarray:
        """Distances of ``block`` (the ``part`` rows, then one spare row; overwritten)."""
        one = np.float32(1)
        if self.metric == "cosine":
            block[-1] = query
            products = _fused_dot(block, query)
            return one - products[:-1] / np.sqrt(products[-1]) / np.sqrt(tables.squares[part])
        rows = block[:-1]
        if self.metric == "dot":
            if self.indexed:
                return one - _fused_dot(rows, query)
            return one - _lane_dot(np.multiply(rows, query, out=rows))
        difference = np.subtract(query, rows, out=rows)
        if self.indexed:
            return _fused_dot(difference, difference)
        return _lane_dot(np.multiply(difference, difference, out=difference))

    def close(self) -> None:
        """Drop the matrix; later searches raise ``RuntimeError``. A search already running
        finishes on the state it started with."""
        self._tables = None


def memory_problem(metric: str, vectors: np.ndarray) -> str | None:
    """Why ``vectors`` cannot be served from memory with lance's exact arithmetic (None: they can)."""
    if vectors.ndim != 2:
        return f"vectors have shape {vectors.shape}, not (rows, dimensions)"
    dimension = vectors.shape[1]
    if dimension <= LANES or dimension % LANES:
        return f"{dimension} dimensions: lance's kernels are reproduced for multiples of {LANES} above {LANES} only"
    if vectors.size and not _in_range(vectors):
        return f"a vector component is not finite or exceeds {MAX_MAGNITUDE} in magnitude"
    if metric == "cosine" and vectors.size and not np.all(np.any(vectors != 0, axis=1)):
        return "a zero vector has no cosine distance (lance never returns it)"
    return None


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


ENGINES = ("auto", "memory", "lancedb")


def open_vector_searcher(
    directory: Path,
    metric: str,
    rows: Sequence[Row],
    *,
    row_scopes: Sequence[Sequence[str]],
    embeddings_digest: str | None,
    vectors: np.ndarray | None = None,
    memory_limit_bytes: int = DEFAULT_MEMORY_LIMIT_BYTES,
    row_roles: Sequence[str] | None = None,
    calibrations: CalibrationRecords | None = None,
    table_digest: str | None = None,
    before_lance: Callable[[], None] | None = None,
    engine: str = "auto",
) -> MemoryVectorSearcher | VectorSearcher:
    """The vector searcher for one verified bundle: from memory when its vectors fit
    ``memory_limit_bytes`` (rows × dimensions × 4; 0 disables it), are verified against
    ``embeddings_digest`` (the manifest's ``material.embeddings_digest``) and reproduce lancedb's
    distances on calibration probes; lancedb's ``VectorSearcher`` otherwise. Either returns the
    same hits (module docstring); ``engine`` says which serves and ``why`` says why, in words.

    ``engine`` (one of ``ENGINES``; operational, in no ID): ``auto`` chooses as above; ``lancedb``
    never serves from memory; ``memory`` serves from memory wherever the vectors allow it without
    comparing with lancedb (the in-memory arithmetic is the same on every host; only whether
    lancedb computes the same distances depends on the CPU).

    ``vectors``: the matrix, if the caller holds it (the bundle's ``vectors.arrow``; verified all
    the same); otherwise it is read once from the lance table. ``calibrations`` and
    ``table_digest`` (the bundle's material digest): where the calibration's outcome is recorded
    and found again (``ragpipe.index.engine_calibration``) — with vectors given and a record
    found, lancedb is not even imported. ``before_lance``: called before the lance table is first
    opened (the bundle's deferred check of that table). ``VectorVerificationError`` when the
    vectors are not the manifest's."""
    if engine not in ENGINES:
        raise ValueError(f"unknown vector engine {engine!r} ({', '.join(ENGINES)})")
    opened: list[VectorSearcher] = []

    def lance(why: str | None = None) -> VectorSearcher:
        if not opened:
            if before_lance is not None:
                before_lance()
            from ragpipe.index.vector import VectorSearcher  # lancedb: seconds of imports

            opened.append(VectorSearcher(directory, metric, rows))
        if why is not None:
            opened[0].why = why
        return opened[0]

    def memory(matrix: np.ndarray, why: str) -> MemoryVectorSearcher:
        searcher = MemoryVectorSearcher(metric, rows, row_scopes, matrix, indexed, row_roles)
        searcher.why = why
        return searcher

    def served_from_memory(matrix: np.ndarray, why: str) -> MemoryVectorSearcher:
        """The memory searcher, closing the lance table if it was opened (to read the vectors)."""
        if opened:
            opened[0].close()
        return memory(matrix, why)

    if engine == "lancedb":
        return lance("lancedb, as the vector engine setting asks")
    dimension = vectors.shape[1] if vectors is not None and vectors.ndim == 2 else lance().dimension
    size = len(rows) * dimension * 4
    if size > memory_limit_bytes:
        return lance(
            f"lancedb: {len(rows)} vectors of {dimension} dimensions, {_mib(size)}, exceed "
            f"the in-memory limit of {_mib(memory_limit_bytes)}"
        )
    if dimension <= LANES or dimension % LANES:
        why = f"lancedb: {dimension} dimensions (the in-memory engine takes multiples of {LANES} above {LANES})"
        log.info("vector search of %s served by %s", directory, why)
        return lance(why)
    matrix = verified_vectors(rows, lance().read_vectors() if vectors is None else vectors, embeddings_digest)
    problem = memory_problem(metric, matrix)
    if problem is not None:
        log.warning("vector search of %s served by lancedb, not from memory: %s", directory, problem)
        return lance(f"lancedb: {problem}")
    indexed = ivf_partitions(len(rows)) is not None  # the build rule; a table that breaks it fails below
    if engine == "memory":
        return served_from_memory(matrix, "in memory, as the vector engine setting asks (not compared with lancedb)")
    key = calibration_key(table_digest, metric, indexed) if calibrations is not None and table_digest else None
    recorded = calibrations.get(key) if calibrations is not None and key is not None else None
    if recorded is not None:
        if recorded.problem is None:
            return served_from_memory(
                matrix, "in memory: this host's recorded calibration found lancedb's distances reproduced"
            )
        log.info("vector search of %s served by lancedb (recorded calibration): %s", directory, recorded.problem)
        return lance(f"lancedb: this host's recorded calibration: {_kernels_problem(recorded.problem)}")
    searcher = lance()
    candidate = memory(matrix, "in memory: it reproduced lancedb's distances on this host's calibration probes")
    problem = (
        calibration_problem(candidate, searcher, row_scopes)
        if searcher.indexed == indexed
        else f"the table {'lacks' if indexed else 'has'} the IVF_FLAT index the build rule gives {len(rows)} rows"
    )
    if calibrations is not None and key is not None:
        calibrations.put(key, Calibration(problem=problem))
    if problem is None:
        searcher.close()
        return candidate
    candidate.close()
    # another lance build or CPU, odd vectors: worth an operator's look (and said in the build
    # summary, ``bundle inspect`` and ``/readyz``, through ``why``)
    log.warning("vector search of %s served by lancedb, not from memory: %s", directory, problem)
    return lance(f"lancedb: calibration on this host: {_kernels_problem(problem)}")


def _mib(size: int) -> str:
    """``7,680 bytes``; ``33,554,432 bytes (32.0 MiB)`` from a MiB up."""
    return f"{size:,} bytes" + (f" ({size / 2**20:.1f} MiB)" if size >= 2**20 else "")


def _kernels_problem(problem: str) -> str:
    """``problem``, with what it means when the probes differed: lance picks its float32 kernels by
    CPU and the in-memory engine reproduces those of AVX-512 hosts."""
    if "differ from the in-memory kernels" not in problem:
        return problem
    cpu = "" if host_has_avx512() else "; this CPU has no AVX-512"
    return f"{problem} — the in-memory engine reproduces lance's AVX-512 kernels{cpu}"


def calibration_problem(
    memory: MemoryVectorSearcher, lance: VectorSearcher, row_scopes: Sequence[Sequence[str]]
) -> str | None:
    """The first probe query on which the two searchers differ (None: none does). Each probe asks
    both for its ``CALIBRATION_ROWS`` nearest rows over every scope and needs the same distances,
    bitwise, in the same order, and the same rows at each distance but the last (a tie there may
    be cut differently through IVF_FLAT: module docstring). A kernel that differs changes most
    distances, so a few hundred rows show it. Probes: fixed pseudo-random directions and a row."""
    scopes = tuple(sorted({s for scopes in row_scopes for s in scopes}))
    tables = memory._tables
    if not scopes or not memory.rows or tables is None:
        return None
    rng = np.random.default_rng(20261201)
    probes = [rng.standard_normal(memory.dimension).astype(np.float32) for _ in range(PROBES - 1)]
    probes.append(tables.operand[0].copy())  # a stored row: the zero distance, duplicates
    depth = min(len(memory.rows), CALIBRATION_ROWS)
    for i, probe in enumerate(probes):
        if not _same_results(lance.search(probe, depth, scopes), memory.search(probe, depth, scopes)):
            return f"probe {i}: lance's distances differ from the in-memory kernels (another lance build or CPU)"
    return None


def _same_results(expected: list[Hit], actual: list[Hit]) -> bool:
    scores = np.array([h.score for h in expected], dtype=np.float64)
    if scores.tobytes() != np.array([h.score for h in actual], dtype=np.float64).tobytes():
        return False
    boundary = expected[-1].score if expected else None
    return sorted(h for h in expected if h.score != boundary) == sorted(h for h in actual if h.score != boundary)


# --- scopes ---------------------------------------------------------------------------------


def _scope_rows(row_scopes: Sequence[Sequence[str]]) -> dict[str, np.ndarray]:
    masks: dict[str, np.ndarray] = {}
    for i, scopes in enumerate(row_scopes):
        for scope in scopes:
            mask = masks.get(scope)
            if mask is None:
                mask = masks[scope] = np.zeros(len(row_scopes), dtype=bool)
            mask[i] = True
    for mask in masks.values():
        mask.setflags(write=False)
    return masks


def _document_rows(rows: Sequence[Row]) -> dict[str, np.ndarray]:
    positions: dict[str, list[int]] = {}
    for i, (_, _, document_id) in enumerate(rows):
        positions.setdefault(document_id, []).append(i)
    return {d: np.asarray(p, dtype=np.intp) for d, p in positions.items()}


def _visible(
    tables: _Tables,
    scopes: tuple[str, ...],
    exclude_documents: Collection[str],
    source_roles: tuple[str, ...] = (),
    selection: Selection | None = None,
) -> np.ndarray:
    """Positions of the rows sharing a scope with ``scopes`` (and, given ``source_roles``, of a
    document with one of them; given ``selection``, admitted by it), minus ``exclude_documents``'
    rows."""
    masks = [m for s in set(scopes) if (m := tables.scope_rows.get(s)) is not None]
    if not masks:
        return np.empty(0, dtype=np.intp)
    visible = np.logical_or.reduce(masks) if len(masks) > 1 else masks[0].copy()
    if source_roles:
        roles = [m for r in set(source_roles) if (m := tables.role_rows.get(r)) is not None]
        if not roles:
            return np.empty(0, dtype=np.intp)
        visible &= np.logical_or.reduce(roles) if len(roles) > 1 else roles[0]
    if selection is not None:
        visible &= selection.rows
    for document_id in exclude_documents:
        positions = tables.document_rows.get(document_id)
        if positions is not None:
            visible[positions] = False
    return np.flatnonzero(visible)


# --- candidates -----------------------------------------------------------------------------


def _candidates(metric: str, tables: _Tables, query: np.ndarray, visible: np.ndarray, k: int) -> np.ndarray:
    """The ``visible`` rows whose exact distance may rank in the top ``k``: those whose lower
    bound is at most the ``k``-th smallest upper bound. Every float32 evaluation of a d-term dot
    product, in any order, with or without FMA, is within γ·Σ|qᵢvᵢ| + d·2⁻¹⁴⁹ ≤ γ·‖q‖‖v‖ + d·2⁻¹⁴⁹
    of the exact value (γ = d·u / (1 − d·u), u = 2⁻²⁴; the second term covers gradual underflow);
    lance's and this product's both are, so their distances differ by at most the bounds below (each
    doubled for margin). The k-th smallest exact distance is at most
    the k-th smallest upper bound, so no row of the exact top k — ties at the k-th place
    included — is left out."""
    operand = tables.operand
    dimension = operand.shape[1]
    gamma = dimension * UNIT_ROUNDOFF / (1 - dimension * UNIT_ROUNDOFF)
    u = UNIT_ROUNDOFF
    block = operand if visible.size * 4 > len(operand) else operand[visible]
    # einsum, not BLAS: OpenBLAS hands a matrix-vector product of this size to a second thread,
    # and on 2 busy cores waking it costs more (milliseconds at times) than the product itself
    products = np.einsum("ij,j->i", block, query).astype(np.float64)
    if block is operand:
        products = products[visible]
    query_norm = float(np.linalg.norm(query.astype(np.float64)))
    norms = tables.norms[visible]
    scale = query_norm * norms
    tiny = 4 * dimension * SMALLEST_SUBNORMAL
    if metric == "cosine":
        estimate = 1.0 - products / scale
        error = 6 * gamma + 12 * u + 1e-12 + tiny / scale
    elif metric == "dot":
        estimate = 1.0 - products
        error = 4 * gamma * scale + 4 * u * (1.0 + scale) + tiny
    else:
        estimate = query_norm**2 + norms**2 - 2.0 * products
        error = 2 * (gamma + 4 * u) * (query_norm + norms) ** 2 + 4 * gamma * scale + 4 * u + tiny
    upper = estimate + error
    if not np.all(np.isfinite(upper)):
        return visible
    threshold = np.partition(upper, k - 1)[k - 1]
    return visible[estimate - error <= threshold]


def _in_range(values: np.ndarray) -> bool:
    """Finite and at most ``MAX_MAGNITUDE`` in magnitude (False for NaN)."""
    return bool(np.all(np.abs(values) <= MAX_MAGNITUDE))


# --- lance's float32 kernels (module docstring) ----------------------------------------------


def _scratch(name: str, shape: tuple[int, ...], dtype: type) -> np.ndarray:
    """A scratch array of ``shape`` (contents undefined) from the calling thread's own buffers,
    so threads never share one and no lock is needed; arrays larger than two blocks are not kept."""
    size = math.prod(shape)
    buffers: dict[str, np.ndarray] = _SCRATCH.__dict__.setdefault("buffers", {})
    flat = buffers.get(name)
    if flat is None or flat.size < size or flat.dtype != dtype:
        flat = np.empty(size, dtype=dtype)
        if size <= 2 * BLOCK_ELEMENTS + 1024:
            buffers[name] = flat
    return flat[:size].reshape(shape)


def _lane_dot(products: np.ndarray) -> np.ndarray:
    """Σ of float32 ``products`` per row as lance's unfused kernel adds them: 16 lane sums, each
    in order over the chunks, then the lanes in order (``np.add.accumulate`` is sequential)."""
    rows, dimension = products.shape
    chunks = products.reshape(rows, dimension // LANES, LANES)
    running = np.add.accumulate(chunks, axis=1, out=_scratch("running", chunks.shape, np.float32))
    return np.add.accumulate(running[:, -1, :], axis=1)[:, -1]


def _fused_dot(left: np.ndarray, right: np.ndarray) -> np.ndarray:
    """Σ leftᵢ·rightᵢ per row (``right`` may be one row) as lance's fused 16-lane kernel computes
    it: per lane, acc ← fl32(acc + a·b) over the chunks (one rounding per step, as an FMA), then
    the tree reduction 8+8, 4+4, 2+2, 1+1."""
    rows, dimension = left.shape
    chunks = dimension // LANES
    # (chunk, row, lane) layout: each step reads one contiguous block. Exact: a product of two
    # float32 values has at most 48 significant bits.
    products = _scratch("products", (chunks, rows, LANES), np.float64)
    np.multiply(
        left.reshape(rows, chunks, LANES).transpose(1, 0, 2),
        right.reshape(-1, chunks, LANES).transpose(1, 0, 2),
        out=products,
        dtype=np.float64,
    )
    sums = _scratch("sums", products.shape, np.float64)
    rounded = _scratch("rounded", products.shape, np.float32)
    acc = np.zeros((rows, LANES), dtype=np.float32)
    for c in range(chunks):
        np.add(acc, products[c], out=sums[c])
        np.copyto(rounded[c], sums[c], casting="same_kind")  # the fused step's one rounding (but see below)
        acc = rounded[c]
    acc = acc.copy()  # the check below overwrites ``sums`` and ``rounded``
    risky = _double_rounding_risk(sums, rounded, products)
    if risky is not None:
        acc[risky] = _fused_lanes_exact(products[:, risky, :])
    return _tree_sum(acc)


def _fused_squares(matrix: np.ndarray) -> np.ndarray:
    """lance's fused Σ x² of every row, in blocks."""
    per_block = max(1, BLOCK_ELEMENTS // max(1, matrix.shape[1]))
    parts = [_fused_dot(matrix[i : i + per_block], matrix[i : i + per_block]) for i in range(0, len(matrix), per_block)]
    return np.concatenate(parts) if parts else np.empty(0, dtype=np.float32)


def _double_rounding_risk(sums: np.ndarray, rounded: np.ndarray, products: np.ndarray) -> np.ndarray | None:
    """(Overwrites ``sums`` and ``rounded``.) Rows where a float64 step sum, rounded to float32
    (``rounded``), might differ from rounding the exact sum acc + p once; None when there is none.
    Rounding twice can only go wrong when the float64 sum is inexact and lies exactly on a float32
    rounding midpoint (rounding to nearest never jumps over a midpoint, itself a float64 value).
    The first step adds p to 0, exactly. Then: in float32's normal range a midpoint has the low 29
    mantissa bits 1000…0 (tested on every sum); below it the rounded value has a biased exponent
    of at most 1, and the float64 sum is exact unless 0 < |p| < 2⁻¹³⁰ — a float32 product that
    large is a multiple of 2⁻¹⁷⁷, and a sum of such and a float32 value under 2⁻¹²⁵ fits 53 bits —
    so only those few places are examined. Flagged rows are recomputed exactly; the test may flag
    more than needed, never less."""
    low = sums[1:].view(np.int64)  # in place: allocating again costs more than the test
    np.bitwise_and(low, 0x1FFFFFFF, out=low)
    midpoint = low == 0x10000000
    exponent = rounded[1:].view(np.int32)
    np.bitwise_and(exponent, 0x7F800000, out=exponent)
    small = exponent <= 0x00800000
    risky: np.ndarray | None = None
    if midpoint.any():
        risky = midpoint.any(axis=(0, 2))
    if small.any():
        steps, rows, lanes = np.nonzero(small)
        magnitude = np.abs(products[1:][steps, rows, lanes])
        tiny = rows[(magnitude > 0) & (magnitude < 2.0**-130)]
        if tiny.size:
            risky = np.zeros(sums.shape[1], dtype=bool) if risky is None else risky
            risky[tiny] = True
    return risky


def _fused_lanes_exact(products: np.ndarray) -> np.ndarray:
    """The lane accumulators of ``_fused_dot`` with every step correctly rounded: the float64 sum
    is rounded to odd (exact error by TwoSum), which makes the rounding to float32 exact."""
    acc = np.zeros(products.shape[1:], dtype=np.float32)
    for c in range(products.shape[0]):
        a, b = acc.astype(np.float64), products[c]
        s = a + b
        v = s - a
        error = (a - (s - v)) + (b - v)
        bits = s.view(np.int64)
        toward = np.where((error > 0) == (s > 0), 1, -1)
        odd = np.where((error != 0) & ((bits & 1) == 0), bits + toward, bits)
        acc = odd.view(np.float64).astype(np.float32)
    return acc


def _tree_sum(acc: np.ndarray) -> np.ndarray:
    """The 16 lanes of ``acc`` summed as _mm512_reduce_add_ps does: halves, quarters, pairs."""
    eight = acc[:, :8] + acc[:, 8:]
    four = eight[:, :4] + eight[:, 4:]
    two = four[:, :2] + four[:, 2:]
    return two[:, 0] + two[:, 1]


def _normalized(matrix: np.ndarray) -> np.ndarray:
    """Rows divided by their norm as lance normalises for a cosine index: √(Σ x², added in order
    in float32), then x / norm in float32."""
    norms = np.sqrt(np.add.accumulate(matrix * matrix, axis=1)[:, -1])
    return np.ascontiguousarray(matrix / norms[:, None], dtype=np.float32)
