"""Optional reranking stage. A reranker may only reorder known candidates: unknown or duplicate
IDs and non-finite scores are rejected, and the text shown and cited stays the bundle's text."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Protocol


class RerankerError(RuntimeError):
    pass


@dataclass(frozen=True)
class RerankCandidate:
    chunk_id: str
    text: str


class Reranker(Protocol):
    name: str

    def rerank(self, query: str, candidates: list[RerankCandidate]) -> list[tuple[str, float]]: ...


def checked_order(candidates: list[RerankCandidate], scored: list[tuple[str, float]]) -> list[str]:
    """Chunk IDs by reranker score (ties: the incoming order). Raises on any invalid output."""
    known = [c.chunk_id for c in candidates]
    position = {cid: i for i, cid in enumerate(known)}
    seen: set[str] = set()
    for cid, score in scored:
        if cid not in position:
            raise RerankerError(f"reranker returned unknown chunk ID {cid!r}")
        if cid in seen:
            raise RerankerError(f"reranker returned chunk ID {cid!r} twice")
        if not isinstance(score, (int, float)) or not math.isfinite(score):
            raise RerankerError(f"reranker returned non-finite score {score!r} for {cid!r}")
        seen.add(cid)
    if seen != set(known):
        raise RerankerError(f"reranker dropped {len(set(known) - seen)} candidate(s)")
    return [cid for cid, _ in sorted(scored, key=lambda cs: (-cs[1], position[cs[0]]))]


class CrossEncoderReranker:
    """sentence-transformers ``CrossEncoder`` loaded from a local model folder (no downloads)."""

    def __init__(self, model_path: str):
        import os

        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        from sentence_transformers import CrossEncoder

        self.name = f"cross_encoder:{model_path}"
        self.model = CrossEncoder(model_path, device="cpu", local_files_only=True)

    def rerank(self, query: str, candidates: list[RerankCandidate]) -> list[tuple[str, float]]:
        scores = self.model.predict([(query, c.text) for c in candidates], show_progress_bar=False)
        return [(c.chunk_id, float(s)) for c, s in zip(candidates, scores)]
