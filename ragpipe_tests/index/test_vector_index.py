"""The lancedb table: exact search through IVF_FLAT with every partition probed."""

from __future__ import annotations

import numpy as np

from ragpipe.index.ivf import IVF_MIN_ROWS, ivf_partitions
from ragpipe.index.predicates import scope_predicate
from ragpipe.index.prefilter import Prefilter
from ragpipe.index.rows import IndexRow
from ragpipe.index.vector import VectorSearcher, build_vector_index


def test_ivf_search_equals_exhaustive_cosine_ranking(tmp_path):
    rng = np.random.default_rng(0)
    n, dim = IVF_MIN_ROWS + 200, 16
    vectors = rng.normal(size=(n, dim)).astype(np.float32)
    vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
    scopes = [("public",) if i % 3 else ("secret",) for i in range(n)]
    rows = [IndexRow(f"r{i:05d}", f"c{i:05d}", f"d{i:05d}", "raw", "", scopes[i], "primary") for i in range(n)]
    assert build_vector_index(tmp_path / "v", rows, vectors, "cosine") == n
    searcher = VectorSearcher(
        tmp_path / "v", "cosine", [(r.representation_id, r.chunk_id, r.document_id) for r in rows]
    )
    assert searcher.nprobes == ivf_partitions(n) == 17
    for q in rng.normal(size=(5, dim)).astype(np.float32):
        q /= np.linalg.norm(q)
        hits = searcher.search(q, 50, Prefilter(("public",)))
        sims = vectors @ q
        allowed = [i for i in range(n) if scopes[i] == ("public",)]
        expected = sorted(allowed, key=lambda i: -sims[i])[:50]
        assert [h.representation_id for h in hits] == [f"r{i:05d}" for i in expected]
        assert np.allclose([h.score for h in hits], sims[expected], atol=1e-5)


def test_small_tables_are_scanned_flat_and_scope_names_are_checked(tmp_path):
    rows = [IndexRow("r1", "c1", "d1", "raw", "", ("public",), "primary")]
    build_vector_index(tmp_path / "v", rows, np.ones((1, 4), np.float32), "cosine")
    assert VectorSearcher(tmp_path / "v", "cosine", [("r1", "c1", "d1")]).nprobes is None
    assert scope_predicate(("a", "b.c")) == "array_has_any(access_scopes, ['a', 'b.c'])"
    try:
        scope_predicate(("x') OR true --",))
    except ValueError as exc:
        assert "invalid scope name" in str(exc)
    else:
        raise AssertionError("injection accepted")
