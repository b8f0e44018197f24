"""The answer context: whole chunks in rank order until the budget, labelled E1…En."""

from __future__ import annotations

from dataclasses import asdict, dataclass

from ragpipe.kernel.ids import bytes_digest
from ragpipe.retrieval.plan import ContextPlan


@dataclass(frozen=True)
class Evidence:
    label: str
    chunk_id: str
    document_id: str
    title: str
    text: str
    byte_start: int
    byte_end: int
    access_scopes: tuple[str, ...]

    def public(self) -> dict[str, object]:
        d = asdict(self)
        d.pop("access_scopes")
        return d


@dataclass(frozen=True)
class Context:
    evidence: tuple[Evidence, ...]
    omitted: tuple[dict[str, str], ...]
    rendered: str

    @property
    def digest(self) -> str:
        return bytes_digest(self.rendered.encode("utf-8"))

    def by_label(self) -> dict[str, Evidence]:
        return {e.label: e for e in self.evidence}


def render_evidence(label: str, title: str, text: str) -> str:
    return f"[{label}] {title}\n{text.rstrip()}\n"


def build_context(candidates: list[Evidence], plan: ContextPlan) -> Context:
    """Take candidates (labels ignored) in order; skip any that would overflow ``max_bytes``;
    stop at ``max_chunks``. Every candidate left out is recorded with its reason."""
    chosen: list[Evidence] = []
    omitted: list[dict[str, str]] = []
    used = 0
    for cand in candidates:
        if len(chosen) >= plan.max_chunks:
            omitted.append({"chunk_id": cand.chunk_id, "reason": f"max_chunks={plan.max_chunks} reached"})
            continue
        label = f"E{len(chosen) + 1}"
        size = len(render_evidence(label, cand.title, cand.text).encode("utf-8")) + 1
        if used + size > plan.max_bytes:
            omitted.append(
                {"chunk_id": cand.chunk_id, "reason": f"needs {size} bytes, {plan.max_bytes - used} left of max_bytes={plan.max_bytes}"}
            )
            continue
        used += size
        chosen.append(Evidence(**{**asdict(cand), "label": label}))
    rendered = "\n".join(render_evidence(e.label, e.title, e.text) for e in chosen)
    return Context(evidence=tuple(chosen), omitted=tuple(omitted), rendered=rendered)
