"""The answer context, and the one function that renders evidence for sending.

A context is whole chunks in rank order until the budget, labelled E1…En. ``render_payload`` is
the only renderer of evidence text that may leave the machine: the authorization certificate
covers the digest of its output, and adapters send what it returns for the certified evidence —
never ``Context.rendered``, which is a record of what ``build_context`` rendered and is checked
against the certified evidence before anything is sent.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass

from ragpipe.kernel.ids import bytes_digest
from ragpipe.retrieval.plan import ContextPlan

# Names the rendering rules below; a certificate records it, so a change of format can never be
# mistaken for a payload that was certified under the old one.
PAYLOAD_FORMAT = "evidence-block/v1"


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
    """``rendered`` is ``render_payload(evidence)`` when built by ``build_context``; adapters
    re-render from certified evidence and refuse a context whose ``rendered`` differs."""

    evidence: tuple[Evidence, ...]
    omitted: tuple[dict[str, str], ...]
    rendered: str

    @property
    def digest(self) -> str:
        return payload_digest(self.rendered)

    def by_label(self) -> dict[str, Evidence]:
        return {e.label: e for e in self.evidence}


def render_evidence(label: str, title: str, text: str) -> str:
    """One evidence item: ``[label] title``, then the text without trailing whitespace."""
    return f"[{label}] {title}\n{text.rstrip()}\n"


def render_payload(evidence: Sequence[Evidence]) -> str:
    """The exact evidence text an adapter sends: every item's label, title and text, in order,
    separated by a blank line. Nothing but these three fields of each item enters it."""
    return "\n".join(render_evidence(e.label, e.title, e.text) for e in evidence)


def payload_digest(payload: str) -> str:
    """SHA-256 of the payload's UTF-8 bytes — recomputable from what a provider received."""
    return bytes_digest(payload.encode("utf-8"))


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
        size = len(render_evidence(label, cand.title, cand.text).encode("utf-8")) + 1  # + the separator
        if used + size > plan.max_bytes:
            omitted.append(
                {
                    "chunk_id": cand.chunk_id,
                    "reason": f"needs {size} bytes, {plan.max_bytes - used} left of max_bytes={plan.max_bytes}",
                }
            )
            continue
        used += size
        chosen.append(Evidence(**{**asdict(cand), "label": label}))
    return Context(evidence=tuple(chosen), omitted=tuple(omitted), rendered=render_payload(chosen))
