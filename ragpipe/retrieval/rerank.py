"""Optional reranking stage. A reranker may only reorder known candidates: unknown or duplicate
IDs and non-finite scores are rejected, and the text shown and cited stays the bundle's text."""

from __future__ import annotations

import math
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from ragpipe.kernel.ids import bytes_digest, content_id
from ragpipe.retrieval.fusion.order import FusedHit
from ragpipe.retrieval.plan import RerankerPlan


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


def rerank_fused(
    reranker: Reranker,
    plan: RerankerPlan | None,
    query: str,
    fused: list[FusedHit],
    chunk_text: Callable[[str], str],
    lock: threading.Lock,
) -> tuple[dict[str, object], list[FusedHit]]:
    """(trace, order): the top ``plan.depth`` fused items reordered by ``reranker``, the rest
    after them. ``chunk_text`` gives the bundle's text of a chunk (what the reranker reads). A
    reranker that does not declare ``thread_safe = True`` is called under ``lock``. On failure the
    plan's ``on_failure`` decides: raise, or keep the fused order and say so in the trace."""
    depth = plan.depth if plan else 20
    policy = plan.on_failure if plan else "keep_fused"
    head, tail = fused[:depth], fused[depth:]
    candidates = [RerankCandidate(f.chunk_id, chunk_text(f.chunk_id)) for f in head]
    try:
        if getattr(reranker, "thread_safe", False):
            scored = reranker.rerank(query, candidates)
        else:
            with lock:
                scored = reranker.rerank(query, candidates)
        order = checked_order(candidates, scored)
    except Exception as exc:  # the plan's failure policy decides, and the trace says so
        if policy == "fail":
            raise RerankerError(f"reranker {reranker.name} failed: {exc}") from exc
        return {"used": True, "name": reranker.name, "failed": str(exc), "applied_policy": "keep_fused"}, fused
    by_id = {f.chunk_id: f for f in head}
    return {"used": True, "name": reranker.name, "depth": depth, "order": order}, [by_id[c] for c in order] + tail


class RerankerModelError(ValueError):
    """The reranker's model folder is not the one the plan binds; the message says which digest."""


def model_digest(folder: Path) -> str:
    """The content ID of a model folder: every regular file's path (POSIX, relative) and SHA-256,
    in path order — weights, configuration and tokenizer alike, since each changes the scores."""
    if not folder.is_dir():
        raise RerankerModelError(f"reranker model folder {folder} is not a directory")
    files = sorted(p for p in folder.rglob("*") if p.is_file())
    return content_id(
        "reranker-model", 1, [[p.relative_to(folder).as_posix(), bytes_digest(p.read_bytes())] for p in files]
    )


class CrossEncoderReranker:
    """sentence-transformers ``CrossEncoder`` loaded from a local model folder (no downloads),
    after checking the folder's ``model_digest`` against the plan's."""

    def __init__(self, model_path: str, expected_digest: str):
        import os

        found = model_digest(Path(model_path))
        if found != expected_digest:
            raise RerankerModelError(
                f"reranker model folder {model_path}: its digest is {found}, the query plan's model_digest is "
                f"{expected_digest} (another model, or edited files)"
            )
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        from sentence_transformers import CrossEncoder

        self.name = f"cross_encoder:{model_path}"
        self.model = CrossEncoder(model_path, device="cpu", local_files_only=True)

    def rerank(self, query: str, candidates: list[RerankCandidate]) -> list[tuple[str, float]]:
        scores = self.model.predict([(query, c.text) for c in candidates], show_progress_bar=False)
        return [(c.chunk_id, float(s)) for c, s in zip(candidates, scores)]
