"""Retrieval metrics against hand-computed values."""

from __future__ import annotations

import math

import pytest

from ragpipe.evaluation.metrics import dedupe, ndcg_at_k, read_qrels, recall_at_k


def test_ndcg_hand_computed():
    judgments = {"a": 1, "b": 2}
    assert ndcg_at_k(["b", "a", "c"], judgments, 10) == pytest.approx(1.0)
    dcg = 1 / math.log2(3) + 2 / math.log2(4)
    idcg = 2 / math.log2(2) + 1 / math.log2(3)
    assert ndcg_at_k(["c", "a", "b"], judgments, 10) == pytest.approx(dcg / idcg)
    assert ndcg_at_k(["c", "a", "b"], judgments, 1) == 0.0
    assert ndcg_at_k(["x"], {}, 10) is None


def test_recall_and_dedupe():
    assert recall_at_k(["a", "x", "y"], {"a": 1, "b": 1, "n": 0}, 2) == 0.5
    assert recall_at_k(["a"], {"n": 0}, 2) is None
    assert dedupe(["d1", "d2", "d1", "d3"]) == ["d1", "d2", "d3"]


def test_read_qrels(tmp_path):
    p = tmp_path / "q.tsv"
    p.write_text("query-id\tcorpus-id\tscore\n1\td1\t1\n1\td2\t2\n2\td3\t1\n")
    assert read_qrels(p) == {"1": {"d1": 1, "d2": 2}, "2": {"d3": 1}}
