"""Standard retrieval metrics over one ranked list and graded judgments.

nDCG@k uses gains ``rel`` (not ``2^rel - 1``) and log2 discounts, as trec_eval's ``ndcg_cut``;
recall@k is the share of relevant items (rel > 0) in the top k. Both are in [0, 1], higher is
better, and undefined (None) for a query without relevant items, which callers must keep visible.
"""

from __future__ import annotations

import csv
import math
from pathlib import Path


def ndcg_at_k(ranking: list[str], judgments: dict[str, int], k: int) -> float | None:
    ideal = sorted((g for g in judgments.values() if g > 0), reverse=True)[:k]
    if not ideal:
        return None
    dcg = sum(judgments.get(item, 0) / math.log2(i + 2) for i, item in enumerate(ranking[:k]))
    idcg = sum(g / math.log2(i + 2) for i, g in enumerate(ideal))
    return dcg / idcg


def recall_at_k(ranking: list[str], judgments: dict[str, int], k: int) -> float | None:
    relevant = {item for item, g in judgments.items() if g > 0}
    if not relevant:
        return None
    return len(relevant & set(ranking[:k])) / len(relevant)


def dedupe(items: list[str]) -> list[str]:
    """First occurrence order (e.g. documents of a chunk ranking)."""
    return list(dict.fromkeys(items))


def read_qrels(path: Path) -> dict[str, dict[str, int]]:
    """BEIR qrels TSV with header ``query-id corpus-id score``."""
    qrels: dict[str, dict[str, int]] = {}
    with path.open(encoding="utf-8") as fh:
        for row in csv.DictReader(fh, delimiter="\t"):
            qrels.setdefault(row["query-id"], {})[row["corpus-id"]] = int(row["score"])
    return qrels
